"""How often the target accepts a draft the drafter was q sure of, learned from every session's rounds.

Drafting ahead (drafter/sessions/ahead.py) needs P(a = j): the target keeps the first j drafts and rejects
the next. A session's acceptance estimate alone makes every position alike (p^j (1 - p)), but the drafter
knows more: a draft it gave 0.3 is rejected far more often than one it gave 0.99, so the round most likely
breaks at its least sure draft. The drafter's probability is not the acceptance rate itself (a greedy
target takes its own argmax, which a 0.3 draft may well be), so it is calibrated on the target's verdicts:
per bin of q, the drafts with that q the target saw and kept. Until a bin has seen enough, q itself stands
in (a prior worth PRIOR_WEIGHT verdicts). One table per server: it describes the drafter/target pair.
"""

from __future__ import annotations

import numpy as np

BINS = 10
PRIOR_WEIGHT = 2.0


class DraftCalibration:
    def __init__(self):
        self.kept = np.zeros(BINS)
        self.seen = np.zeros(BINS)
        self.centres = (np.arange(BINS) + 0.5) / BINS  # the prior: a bin's own q

    @staticmethod
    def bins(probs) -> np.ndarray:
        return np.minimum((np.asarray(probs, dtype=np.float64) * BINS).astype(np.int64), BINS - 1)

    def record(self, probs: list[float], accepted: int) -> None:
        """A round's verdict: of drafts with these probabilities, the target kept the first `accepted` and
        rejected the next (if any); it never saw those after."""
        seen = self.bins(probs[: accepted + 1])
        np.add.at(self.seen, seen, 1.0)
        np.add.at(self.kept, seen[:accepted], 1.0)

    def accept_probs(self, probs: list[float]) -> list[float]:
        """P(the target keeps a draft | it reaches it), for drafts with these probabilities."""
        b = self.bins(probs)
        rates = (self.kept[b] + PRIOR_WEIGHT * self.centres[b]) / (self.seen[b] + PRIOR_WEIGHT)
        return rates.tolist()

    def describe(self) -> dict:
        seen = self.seen > 0
        return {
            "verdicts": int(self.seen.sum()),
            # q bin (its lower edge) -> the share of drafts the target kept, for bins with any verdict
            "kept_by_confidence": {
                f"{i / BINS:.2f}": round(float(self.kept[i] / self.seen[i]), 3) for i in np.flatnonzero(seen)
            },
        }
