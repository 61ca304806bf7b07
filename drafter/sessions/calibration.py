"""How often the target accepts a draft the drafter was q sure of, learned from every session's rounds.

Drafting ahead (drafter/sessions/ahead.py) needs P(a = j): the target keeps the first j drafts and rejects
the next. A session's acceptance estimate alone makes every position alike (p^j (1 - p)), but the drafter
knows more: a draft it gave 0.3 is rejected far more often than one it gave 0.99, so the round most likely
breaks at its least sure draft. The drafter's probability is not the acceptance rate itself (a greedy
target takes its own argmax, which a 0.3 draft may well be), so it is calibrated on the target's verdicts:
per bin of q, the drafts with that q the target saw and kept. One table per server: it describes the
drafter/target pair.

Until a bin has seen enough, a prior stands in (worth PRIOR_WEIGHT verdicts): q itself, shifted in log-odds
by what every bin's verdicts say together. So one round teaches every bin how this pair departs from q: a
drafter whose probabilities are low for a target that keeps its drafts anyway (as a small model's are for a
target of its own family) plans the all-kept outcome from its first verdicts on, where bins learning alone
took a dozen rounds. The shift is the maximum a posteriori fit of one log-odds offset to all verdicts, under
a normal prior (SHIFT_SCALE) that keeps a few verdicts from pushing it to infinity.
"""

from __future__ import annotations

import numpy as np

BINS = 10
PRIOR_WEIGHT = 2.0
SHIFT_SCALE = 2.0  # the prior's standard deviation of the log-odds shift
NEWTON_STEPS = 20  # at most; the fit is concave in one variable, so damped Newton steps converge
MAX_STEP = 1.0  # log-odds per step: an undamped step from far away overshoots where q's are extreme


class DraftCalibration:
    def __init__(self):
        self.kept = np.zeros(BINS)
        self.seen = np.zeros(BINS)
        self.centres = (np.arange(BINS) + 0.5) / BINS  # a bin's own q
        self.logits = np.log(self.centres / (1.0 - self.centres))
        self.shift = 0.0  # log-odds: how this pair's keep rate departs from q, over all bins

    @staticmethod
    def bins(probs) -> np.ndarray:
        return np.minimum((np.asarray(probs, dtype=np.float64) * BINS).astype(np.int64), BINS - 1)

    def record(self, probs: list[float], accepted: int) -> None:
        """A round's verdict: of drafts with these probabilities, the target kept the first `accepted` and
        rejected the next (if any); it never saw those after."""
        seen = self.bins(probs[: accepted + 1])
        np.add.at(self.seen, seen, 1.0)
        np.add.at(self.kept, seen[:accepted], 1.0)
        self.shift = self.fit_shift()

    def fit_shift(self) -> float:
        """The log-odds offset that best explains every verdict with q shifted by it (MAP, Newton's method)."""
        shift = self.shift
        for _ in range(NEWTON_STEPS):
            keep = 1.0 / (1.0 + np.exp(-(self.logits + shift)))
            gradient = float((self.kept - self.seen * keep).sum()) - shift / SHIFT_SCALE**2
            curvature = float((self.seen * keep * (1.0 - keep)).sum()) + 1.0 / SHIFT_SCALE**2
            step = min(max(gradient / curvature, -MAX_STEP), MAX_STEP)
            shift += step
            if abs(step) < 1e-3:
                break
        return shift

    def prior(self) -> np.ndarray:
        """Per bin, what stands in until it has verdicts of its own: q shifted by the pair's offset."""
        return 1.0 / (1.0 + np.exp(-(self.logits + self.shift)))

    def accept_probs(self, probs: list[float]) -> list[float]:
        """P(the target keeps a draft | it reaches it), for drafts with these probabilities."""
        b = self.bins(probs)
        rates = (self.kept[b] + PRIOR_WEIGHT * self.prior()[b]) / (self.seen[b] + PRIOR_WEIGHT)
        return rates.tolist()

    def describe(self) -> dict:
        seen = self.seen > 0
        return {
            "verdicts": int(self.seen.sum()),
            "log_odds_shift": round(self.shift, 3),
            # q bin (its lower edge) -> the share of drafts the target kept, for bins with any verdict
            "kept_by_confidence": {
                f"{i / BINS:.2f}": round(float(self.kept[i] / self.seen[i]), 3) for i in np.flatnonzero(seen)
            },
        }
