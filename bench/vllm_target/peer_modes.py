"""The peer table's modes (bench/vllm_target/peers.py): how each way of speculating is set up, on either pair.

A mode names vLLM's speculation (target.py's --speculation) and, for drafter's modes, how the drafter server
behind vLLM's proposer drafts: which of the pair's drafter checkpoints it serves (the FP8 weight-only export,
or the unquantized drafter), where drafts come from (`model`, or `hybrid`: the suffix index's draft when it
beats the model's, the model after it) and how many (vLLM's fixed k, or `"auto"`: the server picks k per
call, weighing drafts against the target's costs, which it is told by `auto_flags`). Every drafter mode names
its source: the server's default is hybrid, and `drafter-fp8` means the model's drafts alone.

Modes whose vLLM engines are set up alike (`engine_key`) share one engine, since starting one costs minutes
on the real pair: between them only the server behind the proposer changes. `"auto"` is the proposer's
setting, fixed when the engine starts, so `drafter-fp8-auto` has an engine of its own.
"""

from __future__ import annotations

from dataclasses import dataclass

FP8, BF16 = (
    "drafter-fp8-weight-only",
    "drafter",
)  # the pair's drafter checkpoints, as its directory names them
# Every drafter server of the table: the CPU, float32 compute, one request's batch window. No suffix index
# shared between conversations: the table runs the same prompts at every concurrency (and again per repeat),
# so an index of earlier answers would hand hybrid the very answer it is asked to draft.
SERVER_ARGS = ("--device=cpu", "--dtype=float32", "--max-seq-len=2048", "--batch-window-ms=1",
               "--suffix-global-tokens=0")  # fmt: skip


@dataclass(frozen=True)
class Mode:
    name: str
    speculation: str  # target.py's --speculation: none, drafter, draft_model or ngram
    served: str | None = None  # drafter modes: the checkpoint the server serves, FP8 or BF16
    source: str = "model"  # drafter modes: the server's --draft-source
    auto: bool = False  # drafter modes: the proposer asks for "auto" (the server's k), not vLLM's k
    bf16_drafts: bool = False  # the projection: a draft step reads bf16 weights, not FP8

    @property
    def engine_key(self) -> tuple[str, bool]:
        return self.speculation, self.auto


MODES = {
    mode.name: mode
    for mode in (
        Mode("alone", "none"),
        Mode("drafter-fp8", "drafter", FP8),
        Mode("drafter-fp8-hybrid", "drafter", FP8, source="hybrid"),
        Mode("drafter-fp8-auto", "drafter", FP8, auto=True),
        Mode("drafter-bf16", "drafter", BF16, bf16_drafts=True),
        Mode("draft_model", "draft_model", bf16_drafts=True),  # vLLM's own, on the unquantized drafter
        Mode("ngram", "ngram"),
    )
}


@dataclass(frozen=True)
class TargetCosts:
    """What "auto" weighs drafts against, measured on vLLM alone at one concurrency."""

    step_ms: float  # one decode step of the whole batch
    per_token_ms: float | None  # what each more token in a step adds; None where it was not measured

    def as_dict(self) -> dict:
        return {"step_ms": self.step_ms, "per_token_ms": self.per_token_ms}


def server_args(mode: Mode, k: int, costs: TargetCosts | None) -> list[str]:
    """The flags a drafter mode's server gets beyond SERVER_ARGS, its model and its port."""
    # vLLM verifies at most k drafts a row; "auto" must not pick more (the proposer warns when it could).
    flags = [f"--draft-source={mode.source}", f"--max-draft-tokens={k}"]
    return flags + auto_flags(costs) if mode.auto else flags


def auto_flags(costs: TargetCosts | None) -> list[str]:
    """The target's costs, told to a server whose drafts are "auto": the one place that knows those flags."""
    if costs is None:
        raise ValueError('"auto" needs the target\'s step time: run alone first, at the same concurrency')
    flags = [f"--target-verify-ms={costs.step_ms:.3f}"]
    if costs.per_token_ms is not None:
        flags.append(f"--target-verify-ms-per-token={costs.per_token_ms:.3f}")
    return flags
