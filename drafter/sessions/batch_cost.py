"""What the engine's batches cost, apart for each batch size: what the rows of one /draft/batch request wait
for when they draft together. On a CPU a decode step of 4 rows costs more than one row's, and a row that
comes back after calls without drafts prefills everything since its last draft (a probe's cost: seconds),
so one startup figure for a one-row step misjudges a batching target's rows (drafter.sessions.batch_rows).
"""

from __future__ import annotations

from typing import NamedTuple

BATCH_WEIGHT = 0.3  # of each batch's costs in its batch size's: a batching target's rows change size often


class BatchCost(NamedTuple):
    """What the engine's batches of one size cost lately."""

    base_ms: float  # beyond the prefill and the decode loop: cache lookup, readback, bookkeeping
    step_ms: float  # one decode step
    prefill_token_ms: float  # a prefilled token: a row brings its kept drafts and the target's token, or,
    # after calls without drafts, everything since its last draft


class BatchCosts:
    def __init__(self):
        self.by_rows: dict[int, BatchCost] = {}

    def observe(
        self, rows: int, engine_ms: float, decode_ms: float, step_ms: float, prefill_ms: float, prefilled: int
    ):
        """A batch of `rows` calls took engine_ms in all: its prefill of `prefilled` tokens prefill_ms, its
        decode loop decode_ms at step_ms a step. A running estimate per size; the first batch sets it."""
        seen = BatchCost(
            max(engine_ms - decode_ms - prefill_ms, 0.0),
            step_ms,
            prefill_ms / prefilled if prefilled else 0.0,
        )
        known = self.by_rows.get(rows)
        if known is not None:
            seen = BatchCost(*(a + BATCH_WEIGHT * (b - a) for a, b in zip(known, seen, strict=True)))
        self.by_rows[rows] = seen

    def at(self, rows: int) -> BatchCost | None:
        """A batch of `rows`: what the largest size seen up to it cost (drafting once at a size not seen yet
        measures it); None before any."""
        known = [size for size in self.by_rows if size <= rows]
        return self.by_rows[max(known)] if known else None

    def nearest(self, rows: int) -> BatchCost | None:
        """The size seen nearest to `rows` (the smaller on a tie); None before any."""
        return (
            self.by_rows[min(self.by_rows, key=lambda size: (abs(size - rows), size))]
            if self.by_rows
            else None
        )

    def describe(self) -> dict:
        return {
            str(size): {name: round(value, 3) for name, value in cost._asdict().items()}
            for size, cost in sorted(self.by_rows.items())
        }
