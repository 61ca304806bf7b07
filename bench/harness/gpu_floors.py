"""The GPU cost models bench/harness/projection.py replays measured rounds on, derived from model shapes.

A batch-1 forward pass (a decode step, or a verify of k + 1 tokens) is memory-bound: its floor is the bytes
of weights it reads divided by the memory bandwidth, here an H100 SXM's HBM3 at 3.35 TB/s. Every weight is
counted once per forward: the decoder's linears, biases and norms, and the embedding table (which is the LM
head when tied; an untied model counts both tables, though a step gathers only a row of the input one:
Qwen3-8B's 1.2 GB of 16.4 GB, so its verify floor is about 8% high). A target's weights are bf16; a
drafter's decoder linears are FP8 (export/'s checkpoint: one byte each, plus a float32 scale per tensor),
its embedding, biases and norms bf16. A draft call also costs a fixed overhead: the server's measured CPU
time per call (bench/overhead.py, bench/README.md), 0.25 ms. Left out on both sides: the KV cache's reads
(a few MB at these context lengths), kernel launches, the target's own sampling. So these are floors; real
kernels are slower on both sides and the ratio of the two, which decides the speedup, is what matters. At a
1.5B target's scale fixed per-forward costs are a larger share of a verify than at 8B's, so that pair's
projection is the less certain of the two.
"""

from __future__ import annotations

from dataclasses import dataclass

from bench.harness.projection import GpuModel

H100_BYTES_PER_S = 3.35e12  # H100 SXM, HBM3
SERVER_OVERHEAD_MS = 0.25  # the server's CPU time per /draft call
BF16_BYTES, FP8_BYTES, SCALE_BYTES = 2, 1, 4
LINEARS_PER_LAYER = 7  # q, k, v, o, gate, up, down


@dataclass(frozen=True)
class Shape:
    """The fields of an HF config.json that decide how many bytes a forward pass reads."""

    name: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    tie_word_embeddings: bool
    qkv_bias: bool  # Qwen2 family
    qk_norm: bool  # Qwen3 family

    def linear_params(self) -> int:
        q, kv = self.num_attention_heads * self.head_dim, self.num_key_value_heads * self.head_dim
        attention = self.hidden_size * (2 * q + 2 * kv)  # q and o, k and v
        mlp = 3 * self.hidden_size * self.intermediate_size  # gate, up, down
        return self.num_hidden_layers * (attention + mlp)

    def other_params(self) -> int:
        """Embedding table(s), biases and norms: what stays bf16 in an FP8 export."""
        q, kv = self.num_attention_heads * self.head_dim, self.num_key_value_heads * self.head_dim
        per_layer = 2 * self.hidden_size + (q + 2 * kv if self.qkv_bias else 0)
        per_layer += 2 * self.head_dim if self.qk_norm else 0
        tables = 1 if self.tie_word_embeddings else 2
        return (
            tables * self.vocab_size * self.hidden_size
            + self.num_hidden_layers * per_layer
            + self.hidden_size
        )

    def num_parameters(self) -> int:
        return self.linear_params() + self.other_params()

    def bf16_bytes(self) -> int:
        return BF16_BYTES * self.num_parameters()

    def fp8_bytes(self) -> int:
        scales = SCALE_BYTES * LINEARS_PER_LAYER * self.num_hidden_layers
        return FP8_BYTES * self.linear_params() + BF16_BYTES * self.other_params() + scales


def floor_ms(num_bytes: int) -> float:
    return 1e3 * num_bytes / H100_BYTES_PER_S


def bandwidth_floor(name: str, target: Shape, drafter: Shape) -> GpuModel:
    """The cost model of `target` (bf16) verifying drafts of `drafter` (FP8) on an H100, with its basis."""
    target_gb, drafter_gb = target.bf16_bytes() / 1e9, drafter.fp8_bytes() / 1e9
    untied = (
        ""
        if target.tie_word_embeddings
        else (
            f", its untied input embedding included though a step reads a row of it "
            f"({BF16_BYTES * target.vocab_size * target.hidden_size / target.bf16_bytes():.0%} high)"
        )
    )
    basis = (
        f"H100 SXM bandwidth floors (3.35 TB/s): verify = {target.name}'s {target_gb:.2f} GB of bf16 "
        f"weights read once{untied}; draft step = {drafter.name}'s {drafter_gb:.2f} GB (FP8 linears, bf16 "
        f"embedding) read once; plus {SERVER_OVERHEAD_MS} ms per draft call (the server's measured CPU "
        "overhead). Floors on both sides: no KV-cache reads, kernel launches or sampling."
    )
    return GpuModel(
        verify_ms=floor_ms(target.bf16_bytes()),
        draft_step_ms=floor_ms(drafter.fp8_bytes()),
        draft_overhead_ms=SERVER_OVERHEAD_MS,
        name=name,
        basis=basis,
    )


# Each model's published config.json, the fields above.
QWEN2_5_CODER_0_5B = Shape("Qwen2.5-Coder-0.5B", 151936, 896, 4864, 24, 14, 2, 64, True, True, False)
QWEN2_5_CODER_1_5B = Shape("Qwen2.5-Coder-1.5B", 151936, 1536, 8960, 28, 12, 2, 128, True, True, False)
QWEN3_0_6B = Shape("Qwen3-0.6B", 151936, 1024, 3072, 28, 16, 8, 128, True, False, True)
QWEN3_8B = Shape("Qwen3-8B", 151936, 4096, 12288, 36, 32, 8, 128, False, False, True)

GPU_MODELS = {  # by the name --gpu-model gives them
    "qwen2.5-coder-1.5b": bandwidth_floor(
        "H100, Qwen2.5-Coder-1.5B / 0.5B FP8", QWEN2_5_CODER_1_5B, QWEN2_5_CODER_0_5B
    ),
    "qwen3-8b": bandwidth_floor("H100, Qwen3-8B / 0.6B FP8", QWEN3_8B, QWEN3_0_6B),
}
