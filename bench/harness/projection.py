"""The *projected* GPU figures: the rounds a CPU run measured (drafts and kept tokens per round) replayed
with a target verify time and a draft-latency model given as parameters, since what the pair accepts does
not depend on the hardware but what a round costs does.

A round costs `verify_ms` (a batch-1 verify of k + 1 tokens is memory-bound like a decode step, so it costs
what one target token costs alone) plus, when it called the drafter, `draft_overhead_ms + n * draft_step_ms`
for its n drafts, of which only the model's cost steps: a suffix draft's tokens come from an index lookup
inside the call's overhead. Target alone costs `verify_ms` per token. The defaults are bandwidth floors on an
H100 SXM (3.35 TB/s): Qwen3-8B's bf16 weights (16.4 GB) read once per verify, 4.9 ms; Qwen3-0.6B FP8 (0.44 GB
of FP8 linears plus its 0.31 GB bf16 tied embedding as the LM head) read once per draft step, 0.22 ms; and
the server's measured CPU overhead per call (bench/README.md, bench/overhead.py), 0.25 ms. Floors on both
sides: real kernels are slower than both, and the ratio, which decides the speedup, is what matters.
bench/harness/gpu_floors.py derives such models from a pair's shapes (this one, and the real pair's), each
with a name and its basis in words for the report.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class GpuModel:
    verify_ms: float = 4.9
    draft_step_ms: float = 0.22
    draft_overhead_ms: float = 0.25
    name: str = "H100, Qwen3-8B / 0.6B FP8"
    basis: str = "H100 SXM bandwidth floors, rounded (bench/harness/projection.py)"

    def as_dict(self) -> dict:
        return asdict(self)


def project(
    round_log: list[tuple[int, int, bool]], model: GpuModel, suffix_log: list[int] | None = None
) -> dict:
    """Projected target tokens/s alone and with the drafter, and their ratio, for these rounds (`suffix_log`:
    per round, the drafts the suffix index made)."""
    kept = sum(k for _, k, _ in round_log)
    suffix_log = suffix_log or [0] * len(round_log)
    speculative_ms = sum(
        model.verify_ms
        + (model.draft_overhead_ms + (drafts - from_suffix) * model.draft_step_ms if called else 0.0)
        for (drafts, _, called), from_suffix in zip(round_log, suffix_log, strict=True)
    )
    alone_ms = kept * model.verify_ms
    return {
        "target_tokens_per_s": 1e3 / model.verify_ms,
        "speculative_tokens_per_s": 1e3 * kept / speculative_ms if speculative_ms else None,
        "speedup": alone_ms / speculative_ms if speculative_ms else None,
        "draft_wait_share": 1 - len(round_log) * model.verify_ms / speculative_ms if speculative_ms else None,
    }
