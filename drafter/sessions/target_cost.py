"""What one speculative round costs the target, learned from the gaps between a session's calls.

Why learn it: `"auto"` weighs the drafts' wait against the target's verify pass, and only the target knows
what that pass costs. Told by flags (`--target-verify-ms`, `--target-verify-ms-per-token`), the policy is
as right as the operator's guess, and a guess from a bare forward pass misses what the target's loop adds
around it: on the real pair's CPU loop a round verifying 4 drafts took ~1.5x what such a pass measured, and
`"auto"` drafted where drafting did not pay. The gap between answering a session's call and its next call
is the target's own round: its verify pass of the drafts it was sent (plus its one token), its sampling,
its bookkeeping and its call to us. So each verified call is a measurement of `round_ms(drafts sent)`.

The model: `round_ms(k) = step_ms + k * token_ms` (a pass over k + 1 tokens; the told flags have the same
shape and are the prior until gaps arrive). `step_ms` is the median gap of recent rounds that verified no
drafts (plain decode steps), `token_ms` the mean over draft lengths seen of `(median gap - step_ms) / k`.
Medians over a window per length, because a conversation's next turn arrives after a person's pause: one
gap in a turn of hundreds of rounds, which a median ignores. Until a session answered 0 drafts the told
`step_ms` stands and any excess is put on the drafts (`token_ms`): the cautious side, since a higher
per-draft cost makes `"auto"` draft less, and one plain step then measures `step_ms` itself.

Only a call that verified its session's last drafts, with no other call of that session in flight, is a
round: anything else (a rollback, a retry, calls in parallel) says nothing of the target's pass.

Why per row: a target that batches its requests (vLLM's proposer sends one `/draft/batch` row per request)
verifies every row's drafts in one pass, and every row waits for all of it. A row's gap then measures the
whole pass, whose drafts are mostly other rows', and a pass of n rows yields n tokens before any draft is
kept. So a gap is learned as one row's share: the gap over the rows, by the pass's drafts per row; and
`round_ms(k, rows)` is a row's share of a pass where each row verifies k drafts. Learned per session instead,
a row answered 0 drafts heard a pass full of the others' drafts as a plain step, drafts looked free, and
`"auto"` kept a batch of 4-8 rows drafting where it made the target 0.5-0.65x as fast.

Why one cost a draft for every row count: a verified token costs the target what it costs (compute on a
CPU, ~0 where the pass is memory-bound) however many rows share the pass, while each count's own estimate
rests on few passes with drafts, and gaps vary pass to pass: under vLLM at 8 rows three probes' passes
came out shorter than the median plain pass, that count learned 0 ms a draft, and as the latest estimate
it became every count's, so drafts looked free. So `token_ms` pools every count's drafted lengths, each
weighted by its gaps. This module knows nothing of HTTP or sessions.
"""

from __future__ import annotations

from collections import deque
from statistics import median

import numpy as np

TARGET_COSTS = ("learn", "told")  # --target-cost
WINDOW = (
    32  # gaps kept per rows and draft length: recent enough to follow a change of load, enough for a median
)
MIN_GAPS = 3  # a length's median counts once it has this many gaps


class PassGaps:
    """The gaps of passes with one number of rows: per drafts a row, the last WINDOW gaps over the rows."""

    def __init__(self, max_drafts: int):
        self.gaps = [deque(maxlen=WINDOW) for _ in range(max_drafts + 1)]
        self.medians: list[float | None] = [None] * (max_drafts + 1)  # once a length has MIN_GAPS gaps
        self.step_ms: float | None = None  # a row's share of a plain step, once gaps showed it

    def per_draft(self, told_step_ms: float) -> list[tuple[float, int]]:
        """(what a verified draft added, gaps behind it) for each drafted length with a median."""
        step_ms = self.medians[0] if self.medians[0] is not None else told_step_ms
        return [
            ((m - step_ms) / k, len(self.gaps[k])) for k, m in enumerate(self.medians) if k and m is not None
        ]


class TargetCost:
    def __init__(self, told_step_ms: float, told_token_ms: float, max_drafts: int, learn: bool = True):
        self.told_step_ms, self.told_token_ms, self.learn = told_step_ms, told_token_ms, learn
        self.max_drafts = max_drafts
        # By the rows of a pass: a row's share of a plain step is a pass's fixed cost over its rows, so on a
        # CPU it is ~4x less at 4 rows than at 1 (466 and 114 ms on the real pair under vLLM); one window
        # for all row counts learned a mix of both and 0 ms a draft.
        self.by_rows: dict[int, PassGaps] = {}
        self.token_ms = told_token_ms  # what a verified draft adds, pooled over every row count's gaps
        self.num_rounds = 0

    def step_ms(self, rows: int = 1) -> float:
        """A row's share of a plain step (no drafts) of a pass of `rows` rows: learned at that many rows,
        else the told step (a whole pass, the operator's figure at the load they serve) over the rows."""
        learned = self.by_rows.get(rows)
        if learned is None or learned.step_ms is None:
            return self.told_step_ms / rows
        return learned.step_ms

    def round_ms(self, num_drafts, rows: int = 1):
        """A row's share of the target's ms for a pass of `rows` rows that verifies `num_drafts` drafts a row
        (an int or an array of them)."""
        return self.step_ms(rows) + np.asarray(num_drafts) * self.token_ms

    def observe(self, num_drafts: int, gap_ms: float, rows: int = 1) -> None:
        """A session's call arrived gap_ms after its answer went into a pass of the target with `rows` rows
        (a /draft/batch request's; 1 for a /draft call) and `num_drafts` drafts in all."""
        if not self.learn or rows < 1 or not gap_ms >= 0:
            return
        per_row = round(num_drafts / rows)
        if not 0 <= per_row <= self.max_drafts:
            return
        learned = self.by_rows.setdefault(rows, PassGaps(self.max_drafts))
        gaps = learned.gaps[per_row]
        gaps.append(gap_ms / rows)
        self.num_rounds += 1
        if len(gaps) < MIN_GAPS:
            return
        learned.medians[per_row] = median(gaps)
        per_draft = [
            pair for n, gaps in self.by_rows.items() for pair in gaps.per_draft(self.told_step_ms / n)
        ]
        if per_draft:
            weight = sum(n for _, n in per_draft)
            self.token_ms = max(0.0, sum(ms * n for ms, n in per_draft) / weight)
        if learned.medians[0] is not None:
            learned.step_ms = max(learned.medians[0], 1e-3)

    def describe(self) -> dict:
        return {
            "learned_from": (
                "gaps between a session's answer and its next call over the rows of its pass, median per "
                "drafts a row"
                if self.learn
                else "nothing: told (--target-cost told)"
            ),
            "rounds_observed": self.num_rounds,
            "step_ms": round(self.step_ms(), 3),  # a pass of one row
            "token_ms": round(self.token_ms, 3),
            "by_rows": {
                str(rows): {
                    "step_ms": round(self.step_ms(rows), 3),
                    "token_ms": round(float(self.round_ms(1, rows) - self.step_ms(rows)), 3),
                }
                for rows in sorted(self.by_rows)
            },
            "told_step_ms": self.told_step_ms,
            "told_token_ms": self.told_token_ms,
        }
