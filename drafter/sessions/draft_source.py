"""Where a draft comes from: the model, the suffix index, or both (`"source"` on the wire, `--draft-source`).

- `model`: the drafter model drafts k tokens, as before suffix drafting existed.
- `suffix`: the suffix index's draft alone (drafter.sessions.suffix_drafts): no model work at all, often
  empty (nothing in the context or in recent conversations matches its tail).
- `hybrid`: the suffix draft leads when it is worth more than the model's, and the model continues after it
  for what is left of k; otherwise the model drafts alone. Under `"auto"` the draft-length policy chooses
  how much of the suffix draft leads and how many model drafts follow, by the target's tokens per ms
  (drafter.sessions.draft_length `plan`), and a suffix-only call sends only the part of its draft that pays
  for its place in the target's verify pass.

"Worth more" is expected accepted tokens. The model's k-token draft is worth p + p^2 + ... + p^k (p: the
session's acceptance estimate for model drafts, drafter.sessions.draft_length). A suffix draft carries the
index's own estimate of each token's chance (the product of count ratios up to it); a session's suffix
drafts may fare better or worse than those counts say, so they are scaled by how its past suffix drafts did
(`SuffixTrack`: decayed matched suffix tokens over the counts' expectation). Every suffix lookup is judged
by the next call, sent or not: the tokens the target went on with are the truth it would have been checked
against (`hindsight`), so a session whose suffix drafts stopped leading still learns when they would be
right again. The suffix draft then leads when its scaled expectation, plus the model's continuation
weighted by the chance of reaching it, is at least the model's alone; ties go to the suffix, which costs
no decode steps.

Why per source: a suffix draft is either right for many tokens or empty, a model draft is right for a few;
one acceptance estimate over both would set the model's k from rounds the model did not draft.
"""

from __future__ import annotations

from dataclasses import dataclass

from drafter.sessions.draft_length import DECAY, PRIOR_WEIGHT
from drafter.sessions.suffix_index import SuffixDraft

MODEL, SUFFIX, HYBRID = "model", "suffix", "hybrid"
SOURCES = (MODEL, SUFFIX, HYBRID)


@dataclass(frozen=True, slots=True)
class SuffixTrack:
    """Decayed accepted suffix-draft tokens, and what the index's counts expected of the same drafts."""

    accepted: float = PRIOR_WEIGHT  # the prior: the counts are right
    expected: float = PRIOR_WEIGHT

    @property
    def ratio(self) -> float:
        return self.accepted / self.expected if self.expected > 0 else 1.0

    def updated(self, expected: float, accepted: int) -> SuffixTrack:
        return SuffixTrack(DECAY * self.accepted + accepted, DECAY * self.expected + expected)


def hindsight(draft: SuffixDraft, truth: list[int]) -> tuple[float, int]:
    """What the index's counts expected of `draft` over the positions `truth` (the tokens the target kept
    after the context it was drafted for) can check, and how many of them it got right."""
    checked = min(len(draft.tokens), len(truth))
    matched = next((i for i in range(checked) if draft.tokens[i] != truth[i]), checked)
    return sum(draft.probs[:checked]), matched


def model_expected(p: float, k: int) -> float:
    """Expected accepted tokens of a k-token model draft at per-token acceptance p."""
    return sum(p**i for i in range(1, k + 1))


def scaled_probs(suffix: SuffixDraft, track: SuffixTrack) -> list[float]:
    """The chance that each suffix token is reached, as the index's counts say, scaled by the session's track."""
    return [min(1.0, track.ratio * p) for p in suffix.probs]


def suffix_leads(
    suffix: SuffixDraft, track: SuffixTrack, p_model: float, k_model: int, min_score: float = 0.0
) -> bool:
    """Whether a hybrid draft starts with this suffix draft (then the model drafts k_model - len after it)."""
    if not suffix.tokens or suffix.score < min_score:
        return False
    probs = scaled_probs(suffix, track)
    continuation = model_expected(p_model, max(0, k_model - len(probs)))
    return sum(probs) + probs[-1] * continuation >= model_expected(p_model, k_model)


def token_probs(suffix: SuffixDraft) -> list[float]:
    """Each suffix token's own probability given the ones before it (the index gives running products),
    in the form the model's drafts report theirs."""
    before = [1.0, *suffix.probs[:-1]]
    return [p / q for p, q in zip(suffix.probs, before, strict=True)]
