"""Which next contexts drafting ahead bets on (drafter/sessions/ahead.py, calibration.py): outcomes ranked by
P(a = j) from per-draft keep chances, the bonus token from the drafter's choices without the rejected draft,
and keep chances calibrated on the target's verdicts."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from drafter.sessions.ahead import outcomes
from drafter.sessions.calibration import BINS, DraftCalibration

DRAFTS = [10, 11, 12]
CHOICES = [  # per position 0..3: (token, probability), best first; the drafts are the first choices
    [(10, 0.9), (20, 0.06), (30, 0.04)],
    [(11, 0.5), (21, 0.3), (31, 0.2)],
    [(12, 0.95), (22, 0.03), (32, 0.02)],
    [(13, 0.7), (23, 0.2), (33, 0.1)],
]


def brute_force(keeps: list[float]) -> dict[tuple[int, int], float]:
    """Every (a, b) with its probability, from the definition."""
    k, table = len(DRAFTS), {}
    for a in range(k + 1):
        reach = float(np.prod(keeps[:a]))
        if a < k:
            rest = 1 - CHOICES[a][0][1]
            for b, prob in CHOICES[a][1:]:
                table[(a, b)] = reach * (1 - keeps[a]) * prob / rest
        else:
            for b, prob in CHOICES[a]:
                table[(a, b)] = reach * prob
    return table


@pytest.mark.parametrize("keeps", [[0.9, 0.5, 0.95], [0.99, 0.99, 0.99], [0.2, 0.9, 0.1]])
def test_outcomes_are_the_likeliest_by_definition_and_sum_to_one(keeps):
    table = brute_force(keeps)
    assert sum(table.values()) == pytest.approx(1.0)
    for budget in (1, 4, 11):
        planned = outcomes(DRAFTS, CHOICES, keeps, budget, lambda a, n: 5, 100)
        expected = sorted(table.values(), reverse=True)[:budget]
        assert [o.likelihood for o in planned] == pytest.approx(expected)
        assert all(table[(o.accepted, o.bonus)] == pytest.approx(o.likelihood) for o in planned)
        assert all(o.bonus != DRAFTS[o.accepted] for o in planned if o.accepted < len(DRAFTS))


def test_a_round_most_likely_breaks_at_its_least_sure_draft():
    planned = outcomes(DRAFTS, CHOICES, [0.9, 0.4, 0.95], 1, lambda a, n: 5, 100)
    assert (planned[0].accepted, planned[0].bonus) == (1, 21)


def test_depth_zero_outcomes_are_dropped():
    planned = outcomes(DRAFTS, CHOICES, [0.9, 0.5, 0.95], 11, lambda a, n: 0 if a == 3 else 4, 100)
    assert planned and all(o.accepted < 3 and o.depth == 4 for o in planned)


def test_calibration_learns_the_targets_keep_rate_per_confidence_and_starts_from_q():
    calibration = DraftCalibration()
    centres = [(int(q * BINS) + 0.5) / BINS for q in (0.12, 0.97)]
    assert calibration.accept_probs([0.12, 0.97]) == pytest.approx(centres)  # no verdicts: q's bin centre
    rng = np.random.default_rng(0)
    truth = lambda q: 0.2 + 0.8 * q**2  # noqa: E731 - how often this target keeps a draft of confidence q
    for _ in range(3000):
        probs = rng.uniform(0, 1, 6).tolist()
        kept = next((i for i, q in enumerate(probs) if rng.uniform() >= truth(q)), len(probs))
        calibration.record(probs, kept)
    for q in (0.125, 0.525, 0.925):
        assert calibration.accept_probs([q])[0] == pytest.approx(truth(q), abs=0.06)
    described = calibration.describe()
    assert described["verdicts"] == int(calibration.seen.sum()) > 3000
    assert set(described["kept_by_confidence"]) <= {f"{i / BINS:.2f}" for i in range(BINS)}


def test_a_verdict_counts_the_kept_drafts_and_the_first_rejected_one_only():
    calibration = DraftCalibration()
    calibration.record([0.12, 0.37, 0.62, 0.87], 2)
    bins = calibration.bins([0.12, 0.37, 0.62, 0.87])
    assert calibration.seen[bins].tolist() == [1, 1, 1, 0]
    assert calibration.kept[bins].tolist() == [1, 1, 0, 0]
    calibration.record(list(itertools.repeat(0.05, 3)), 3)  # all kept: none rejected
    [low] = calibration.bins([0.05])
    assert calibration.seen[low] == 3 and calibration.kept[low] == 3


def test_a_pair_that_keeps_unsure_drafts_is_learned_from_its_first_verdicts():
    """The cold start the issue measured: a drafter unsure of its drafts (q 0.05-0.35) and a target that keeps
    all 8 of them. After two such rounds, the all-kept outcome is the likeliest plan of the third: every
    bin learns how this pair departs from q from all verdicts together, not only from its own."""
    rng = np.random.default_rng(3)
    calibration = DraftCalibration()
    k, budget = 8, 8
    for _ in range(2):
        calibration.record(rng.uniform(0.05, 0.35, k).tolist(), k)
    probs = rng.uniform(0.05, 0.35, k).tolist()  # this round's drafts, in bins that may have no verdict yet
    drafts = list(range(100, 100 + k))
    choices = [
        [(d, q), (d + 50, (1 - q) / 2), (d + 60, (1 - q) / 3)] for d, q in zip(drafts, probs, strict=True)
    ]
    choices.append([(7, 0.4), (8, 0.3)])
    planned = outcomes(drafts, choices, calibration.accept_probs(probs), budget, lambda a, n: 4, 100)
    assert (planned[0].accepted, planned[0].bonus) == (k, 7)
    assert calibration.describe()["log_odds_shift"] > 2


def test_the_pairs_offset_leaves_a_calibrated_drafters_bins_their_own():
    """A drafter whose q is this target's keep rate: the fitted offset stays near 0."""
    rng = np.random.default_rng(4)
    calibration = DraftCalibration()
    for _ in range(2000):
        probs = rng.uniform(0, 1, 6).tolist()
        calibration.record(probs, next((i for i, q in enumerate(probs) if rng.uniform() >= q), 6))
    assert abs(calibration.shift) < 0.2
