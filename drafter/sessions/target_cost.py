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
round: anything else (a rollback, a retry, calls in parallel) says nothing of the target's pass. This module
knows nothing of HTTP or sessions.
"""

from __future__ import annotations

from collections import deque
from statistics import median

import numpy as np

TARGET_COSTS = ("learn", "told")  # --target-cost
WINDOW = 32  # gaps kept per draft length: recent enough to follow a change of load, enough for a median
MIN_GAPS = 3  # a length's median counts once it has this many gaps


class TargetCost:
    def __init__(self, told_step_ms: float, told_token_ms: float, max_drafts: int, learn: bool = True):
        self.told_step_ms, self.told_token_ms, self.learn = told_step_ms, told_token_ms, learn
        self.step_ms, self.token_ms = told_step_ms, told_token_ms
        self.gaps = [deque(maxlen=WINDOW) for _ in range(max_drafts + 1)]  # by drafts verified
        self.medians: list[float | None] = [None] * (max_drafts + 1)  # once a length has MIN_GAPS gaps
        self.num_rounds = 0

    def round_ms(self, num_drafts):
        """The target's ms for a round that verifies `num_drafts` drafts (an int or an array of them)."""
        return self.step_ms + np.asarray(num_drafts) * self.token_ms

    def observe(self, num_drafts: int, gap_ms: float) -> None:
        """A session's call arrived gap_ms after the answer that sent it num_drafts drafts."""
        if not self.learn or not 0 <= num_drafts < len(self.gaps) or not gap_ms >= 0:
            return
        gaps = self.gaps[num_drafts]
        gaps.append(gap_ms)
        self.num_rounds += 1
        if len(gaps) < MIN_GAPS:
            return
        medians = self.medians
        medians[num_drafts] = median(gaps)
        step_ms = medians[0] if medians[0] is not None else self.told_step_ms
        per_draft = [
            ((m - step_ms) / k, len(self.gaps[k])) for k, m in enumerate(medians) if k and m is not None
        ]
        if per_draft:
            weight = sum(n for _, n in per_draft)
            token_ms = max(0.0, sum(ms * n for ms, n in per_draft) / weight)
        else:
            token_ms = self.told_token_ms
        self.step_ms, self.token_ms = max(step_ms, 1e-3), token_ms

    def describe(self) -> dict:
        return {
            "learned_from": (
                "gaps between a session's answer and its next call, median per draft length"
                if self.learn
                else "nothing: told (--target-cost told)"
            ),
            "rounds_observed": self.num_rounds,
            "step_ms": round(self.step_ms, 3),
            "token_ms": round(self.token_ms, 3),
            "told_step_ms": self.told_step_ms,
            "told_token_ms": self.told_token_ms,
        }
