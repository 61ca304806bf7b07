"""Which lone requests the event loop's own thread drafts, instead of handing them to the engine thread.

Why: a hand-off to the engine thread and the answer's way back each wake a thread on another core. On the
2-core VM of bench/README.md that costs ~0.12 ms of the ~0.4 ms a /draft call added to a plain HTTP round
trip. When the engine is idle and no other request is queued or being read, nothing would run beside the
draft anyway, so the event loop's thread may call the engine itself (the batcher decides when; the engine
is still only ever called by one thread at a time).

The price: while it drafts, the loop reads no other request and answers no health probe. So only a draft
expected to be short runs there: at most `max_ms`, by the costs measured at startup (a call's fixed cost,
the decode steps it runs, and its uncached context tokens at the measured prefill rate). A cold long
context, a long draft on a slow device, or any draft of a large model on a CPU goes to the engine thread.
And only while clients do not overlap: the batcher stops drafting on the loop for a while after any request
arrives while the engine is busy (drafter/scheduling/batcher.py, `contended`), since concurrent clients need the loop
to read them and the engine thread to batch them.

And never for a CPU engine with more than one torch thread: torch's CPU threads are an OpenMP team per
calling thread, so the loop drafting would start a second team beside the engine thread's, and the two
oversubscribe the cores (measured, 2 threads on 2 cores: a 128-token call 6.9 -> 13.2 ms, and 19.6 -> 33.3
ms with 4 clients even after the loop had stopped drafting). On CUDA the CPU side runs no parallel region.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from drafter.sessions.draft_length import DraftLengthPolicy
from engine.requests import DraftRequest


def effective_max_ms(configured_ms: float, device_type: str, torch_threads: int) -> tuple[float, str | None]:
    """`--inline-max-ms` as it applies to this engine, and why it is 0 where the setting is not."""
    if configured_ms > 0 and device_type != "cuda" and torch_threads > 1:
        return (
            0.0,
            f"a CPU engine on {torch_threads} torch threads (a second OpenMP team would oversubscribe)",
        )
    return configured_ms, None


@dataclass(frozen=True, slots=True)
class InlinePolicy:
    max_ms: float  # 0: never
    prefill_token_ms: float  # measured at startup
    policy: DraftLengthPolicy  # its fixed cost per call and its running step cost
    decode_steps: Callable[[int, bool], int]  # the loop's steps for a draft of k tokens (with top choices?)
    expected_prefill: Callable[[DraftRequest], int]  # uncached context tokens; read while the engine is idle
    off_because: str | None = None  # why max_ms is 0 though the setting is not

    def expected_ms(self, request: DraftRequest) -> float:
        return (
            self.policy.cost.draft_base_ms
            + self.decode_steps(request.num_draft_tokens, request.choices) * self.policy.step_ms
            + self.expected_prefill(request) * self.prefill_token_ms
        )

    def __call__(self, request: DraftRequest) -> bool:
        return self.max_ms > 0 and self.expected_ms(request) <= self.max_ms

    def describe(self) -> dict:
        described = {"max_ms": self.max_ms, "prefill_token_ms": round(self.prefill_token_ms, 5)}
        if self.off_because:
            described["off_because"] = self.off_because
        return described
