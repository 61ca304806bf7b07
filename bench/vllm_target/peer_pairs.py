"""The two pairs the peer table (bench/vllm_target/peers.py) runs on, and each one's defaults.

- the testbed (bench/testbed/): a small Qwen3 pair trained here, its workloads as token ids, no chat template;
  every row generates exactly --max-tokens tokens (EOS ignored). Fast, but its figures flatter acceptance.
- the real pair (`--realpair [DIR]`, bench/realpair/): Qwen2.5-Coder-1.5B-Instruct verifying drafts of
  Qwen2.5-Coder-0.5B-Instruct, as `python -m bench.realpair fetch` leaves them in DIR (build/realpair/);
  bench/realpair/prompts.jsonl's code, prose and edit prompts under the target's chat template, a row ending
  at the end of its answer (`<|im_end|>`, the checkpoint's EOS) or at --max-tokens.

Each pair's defaults are sized for a 2-core CPU; `Defaults` lists them, any can be given on the command line.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from bench.harness.gpu_floors import GPU_MODELS, QWEN2_5_CODER_0_5B
from bench.harness.projection import GpuModel
from bench.vllm_target.peer_modes import BF16, FP8


@dataclass(frozen=True)
class Defaults:
    modes: tuple[str, ...]
    k: int  # vLLM's num_speculative_tokens
    max_tokens: int  # new tokens per prompt, at most
    concurrency: tuple[int, ...]  # requests in flight at once: that many prompts in one generate
    repeats: int  # runs per cell; the fastest is reported
    dtype: str  # the vLLM target's
    kv_cache_gb: float | None  # vLLM's KV cache; None: vLLM's own size, from its memory share
    drafter_timeout_s: float  # the most a step waits for drafter's drafts (then it goes without)
    max_num_batched_tokens: int | None = None  # vLLM's step budget; None: vLLM's (4096)
    server_args: tuple[str, ...] = ()  # drafter servers' flags beyond peer_modes.SERVER_ARGS
    enforce_eager: bool = False  # vLLM without torch.compile


@dataclass(frozen=True)
class PeerPair:
    name: str
    directory: Path  # target/ and the drafter checkpoints the modes serve (peer_modes.FP8, BF16)
    workloads: tuple[str, ...]
    prompts: Callable[[str], list[list[int]]]  # a workload's prompts as token ids, in a fixed order
    stop_token_ids: tuple[int, ...]  # a row ends at the first of these; none: at --max-tokens only
    gpu: GpuModel  # the projection's costs
    bf16_step_factor: float  # a bf16 draft step against an FP8 one, on that GPU (memory-bound: bytes read)
    defaults: Defaults
    quick: Defaults | None = None
    notes: dict = field(default_factory=dict)  # for the report

    @property
    def target(self) -> Path:
        return self.directory / "target"


def testbed() -> PeerPair:
    from bench.testbed import PAIR, workload_tokens

    return PeerPair(
        name="testbed",
        directory=PAIR,
        workloads=("prose", "code", "edit"),
        prompts=workload_tokens,
        stop_token_ids=(),
        gpu=GpuModel(),  # Qwen3-8B verifying Qwen3-0.6B FP8 drafts
        # Qwen3-0.6B's bf16 linears read per draft step against FP8's: the step is memory-bound, so ~1.6x the
        # time (0.88 GB of bf16 linears + 0.31 GB embedding, against 0.44 + 0.31 GB).
        bf16_step_factor=1.6,
        defaults=Defaults(
            modes=("alone", "drafter-fp8", "drafter-bf16", "draft_model", "ngram"),
            k=8,
            max_tokens=128,
            concurrency=(8,),
            repeats=2,
            dtype="float32",
            kv_cache_gb=None,
            drafter_timeout_s=0.5,
        ),
    )


REALPAIR_DEFAULTS = Defaults(
    modes=("alone", "drafter-fp8", "drafter-fp8-hybrid", "drafter-fp8-auto", "draft_model", "ngram"),
    k=4,  # the real pair's benchmarks' first k (bench/realpair/benchmark.py)
    max_tokens=64,
    concurrency=(1, 4, 8),
    repeats=1,
    dtype="float32",
    kv_cache_gb=1.0,  # 57 KB a token for the 1.5B in float32: ~18,000 tokens, 8 rows need under 4,000
    # The 0.5B drafts on one CPU core: a step's drafts take about a second, a new conversation's first call
    # (its prompt's prefill, 8 rows) tens of seconds. A step that gave up on them would measure vLLM without
    # drafts, and the client's backoff would carry into the next run; the report counts such steps
    # (proposer_skipped), and the server may queue a call as long (its 1 s default is a GPU's).
    drafter_timeout_s=60.0,
    server_args=("--request-timeout-s=60",),
    # torch.compile costs each engine minutes at start (two on a quiet 2-core machine, five on a busy one),
    # six engines a table; at a few hundred ms a step, Python's share of a step is a few ms either way
    enforce_eager=True,
    # vLLM's start runs one step of this many tokens: a minute for the 1.5B on a CPU at vLLM's 4096; the
    # longest prompt is under 400 tokens, and longer batches of prompts prefill in chunks
    max_num_batched_tokens=1024,
)
REALPAIR_QUICK = Defaults(**{**REALPAIR_DEFAULTS.__dict__, "max_tokens": 32, "concurrency": (1, 4)})


def realpair(directory: Path) -> PeerPair:
    """The real pair in `directory`, checked for what the table's modes need before anything slow."""
    from bench.realpair import benchmark
    from bench.realpair.workloads import KINDS, chat_ids, load_prompts

    for checkpoint in (FP8, BF16):
        benchmark.check_fetched(directory, checkpoint)
    tokenizer = benchmark.chat_tokenizer(directory / benchmark.TARGET)
    stop = end_of_turn_ids(directory / benchmark.TARGET, tokenizer)

    def prompts(kind: str) -> list[list[int]]:
        return [chat_ids(prompt, tokenizer) for prompt in load_prompts(kind)]

    drafter = QWEN2_5_CODER_0_5B
    return PeerPair(
        name="realpair",
        directory=directory,
        workloads=KINDS,
        prompts=prompts,
        stop_token_ids=stop,
        gpu=GPU_MODELS["qwen2.5-coder-1.5b"],
        bf16_step_factor=drafter.bf16_bytes() / drafter.fp8_bytes(),
        defaults=REALPAIR_DEFAULTS,
        quick=REALPAIR_QUICK,
        notes={"stop_token_ids": list(stop)},
    )


def end_of_turn_ids(target: Path, tokenizer) -> tuple[int, ...]:
    """The checkpoint's EOS ids (generation_config.json) and the tokenizer's: where a chat answer ends, as
    bench/realpair/benchmark.py's plain_greedy stops the transformers target."""
    path = target / "generation_config.json"
    eos = json.loads(path.read_text()).get("eos_token_id") if path.is_file() else None
    ids = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(tokenizer.eos_token_id)
    return tuple(ids)
