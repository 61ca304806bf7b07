"""The auto draft-length policy: long drafts for high acceptance, short for low, quick to follow a change,
shorter under load and none past the queue threshold."""

from __future__ import annotations

import random

import numpy as np
import pytest

from drafter.sessions.draft_length import (
    PROBE_EVERY,
    Acceptance,
    DraftCost,
    DraftLengthConfigError,
    DraftLengthPolicy,
    Load,
)
from drafter.sessions.target_cost import TargetCost

MAX_K = 16
IDLE = Load(queue_depth=0, running=0)
# A GPU-like ratio: one verify pass of the target costs as much as ~25 draft steps.
COST = DraftCost(target_verify_ms=25.0, draft_base_ms=1.0, step_ms=1.0)


def policy(max_queue_depth: int = 8) -> DraftLengthPolicy:
    return DraftLengthPolicy(COST, MAX_K, max_batch_size=8, max_queue_depth=max_queue_depth)


def scripted_round(rng: random.Random, p: float, k: int) -> int:
    """A target that accepts each draft with probability p, stopping at the first rejection."""
    accepted = 0
    while accepted < k and rng.random() < p:
        accepted += 1
    return accepted


def run_rounds(acceptance: Acceptance, p: float, rounds: int, seed: int = 0) -> tuple[Acceptance, list]:
    rng, chosen = random.Random(seed), []
    for _ in range(rounds):
        k = policy().choose(acceptance, IDLE, room=1000)
        chosen.append(k)
        acceptance = acceptance.updated(k, scripted_round(rng, p, k))
    return acceptance, chosen


def test_draft_length_is_long_for_high_and_short_for_low_acceptance():
    _, high = run_rounds(Acceptance(), 0.9, 60)
    _, low = run_rounds(Acceptance(), 0.3, 60)
    assert np.mean(high[-20:]) >= 10, high
    assert np.mean(low[-20:]) <= 3, low


def test_draft_length_follows_a_change_within_a_few_rounds():
    estimate, _ = run_rounds(Acceptance(), 0.9, 40, seed=1)
    _, after_drop = run_rounds(estimate, 0.2, 8, seed=2)
    assert after_drop[-1] <= 3, after_drop
    estimate, _ = run_rounds(Acceptance(), 0.2, 40, seed=3)
    _, after_rise = run_rounds(estimate, 0.95, 10, seed=4)
    assert after_rise[-1] >= 8, after_rise


def test_draft_length_maximizes_tokens_per_ms_of_the_round():
    acceptance = Acceptance(accepted=6, rejected=4)
    k = policy().choose(acceptance, IDLE, room=1000)
    expected = np.cumsum(np.full(MAX_K, 0.6).cumprod())
    rates = [(1 + expected[j - 1]) / (25.0 + 1.0 + j * 1.0) for j in range(1, MAX_K + 1)]
    assert k == 1 + int(np.argmax(rates))


def test_draft_length_shrinks_with_load_and_is_zero_past_the_queue_threshold():
    estimate = Acceptance(accepted=8, rejected=2)
    ks = [
        policy().choose(estimate, Load(queue_depth=q, running=r), room=1000)
        for q, r in [(0, 0), (0, 8), (7, 8)]
    ]
    assert ks[0] > ks[1] > ks[2] >= 1, ks
    assert policy().choose(estimate, Load(queue_depth=8, running=0), room=1000) == 0
    assert policy(max_queue_depth=0).choose(estimate, IDLE, room=1000) == 0


def test_draft_length_never_exceeds_the_room_left_and_is_zero_at_worst_acceptance_but_probes():
    sure, hopeless = Acceptance(accepted=99, rejected=1), Acceptance(accepted=0, rejected=5)
    assert policy().choose(sure, IDLE, room=3) == 3
    assert policy().choose(sure, IDLE, room=0) == 0
    chosen = []
    for _ in range(PROBE_EVERY + 1 + 2 * PROBE_EVERY + 1 + 4 * PROBE_EVERY + 1):  # drafts never kept
        k = policy().choose(hopeless, IDLE, room=1000)
        chosen.append(k)
        hopeless = hopeless.updated(k, 0)
    # A one-draft probe after 8 calls answered none, then after 16, then 32: each failed probe doubles the wait.
    assert chosen == [0] * PROBE_EVERY + [1] + [0] * 2 * PROBE_EVERY + [1] + [0] * 4 * PROBE_EVERY + [1], (
        chosen
    )
    assert [policy().choose(hopeless.updated(0, 0), IDLE, 1000) for _ in range(2)] == [0, 0]


# A 1.5B target verifying on 2 CPU cores against a 0.5B drafter beside it (the real pair's measured costs,
# bench/README.md): a step of the target is ~2.6 draft steps, and each verified token adds a third of a step.
CPU_COST = DraftCost(target_verify_ms=417.0, draft_base_ms=50.0, step_ms=160.0, target_token_ms=146.0)


def simulated_ms_per_token(choose, p: float, rounds: int = 400, seed: int = 0, gaps=None) -> float:
    """The target's ms per token over scripted rounds (each draft kept with probability p) at CPU_COST;
    `gaps(k, ms)` hears each round's target time, as the server hears the gap before the next call."""
    rng, acceptance, tokens, ms = random.Random(seed), Acceptance(), 0, 0.0
    for _ in range(rounds):
        k = choose(acceptance)
        accepted = scripted_round(rng, p, k)
        tokens += 1 + accepted
        round_ms = CPU_COST.target_verify_ms + k * CPU_COST.target_token_ms
        ms += round_ms + (CPU_COST.draft_base_ms + k * CPU_COST.step_ms if k else 0.0)
        if gaps is not None:
            gaps(k, round_ms)
        acceptance = acceptance.updated(k, accepted)
    return ms / tokens


@pytest.mark.parametrize("p", [0.05, 0.3, 0.5, 0.7, 0.85, 0.95])
def test_auto_never_costs_the_target_more_than_5_percent_against_no_speculation_or_the_best_fixed_k(p):
    cpu = DraftLengthPolicy(CPU_COST, MAX_K, max_batch_size=8, max_queue_depth=8)
    auto = simulated_ms_per_token(lambda a: cpu.choose(a, IDLE, room=1000), p)
    fixed = [simulated_ms_per_token(lambda a, k=k: k, p) for k in range(0, MAX_K + 1)]
    assert auto <= 1.05 * fixed[0], (auto, fixed[0])  # never 5% slower than the target alone
    # Against the best k known only afterwards: near the break-even acceptance (~0.88 at these costs) the
    # fast-moving estimate crosses it both ways, and each fall to 0 drafts waits for a probe (12% at p = 0.95).
    assert auto <= 1.15 * min(fixed), (auto, int(np.argmin(fixed)))


def test_without_the_per_token_cost_auto_drafts_longer_than_pays_on_a_cpu():
    """Why --target-verify-ms-per-token exists: told only the target's step, auto drafts too long."""
    blind = DraftCost(target_verify_ms=417.0, draft_base_ms=50.0, step_ms=160.0)
    told = DraftLengthPolicy(CPU_COST, MAX_K, 8, 8)
    untold = DraftLengthPolicy(blind, MAX_K, 8, 8)
    estimate = Acceptance(accepted=8, rejected=2)
    assert told.choose(estimate, IDLE, room=1000) < untold.choose(estimate, IDLE, room=1000)
    p = 0.8
    told_ms = simulated_ms_per_token(lambda a: told.choose(a, IDLE, room=1000), p)
    untold_ms = simulated_ms_per_token(lambda a: untold.choose(a, IDLE, room=1000), p)
    assert told_ms < untold_ms


@pytest.mark.parametrize("told_step_ms", [417.0, 25.0])  # right, and the default (a GPU target's step)
@pytest.mark.parametrize("p", [0.05, 0.5, 0.85, 0.95])
def test_auto_told_wrong_target_costs_learns_them_from_call_gaps_and_never_costs_more_than_5_percent(
    told_step_ms, p
):
    """Told nothing of the per-token cost (or not even the step), the policy learns the target's round from
    the gaps between calls and ends where the told one does: never 5% slower than the target alone."""
    blind = DraftCost(told_step_ms, CPU_COST.draft_base_ms, CPU_COST.step_ms)
    auto = DraftLengthPolicy(blind, MAX_K, max_batch_size=8, max_queue_depth=8)
    ms = simulated_ms_per_token(lambda a: auto.choose(a, IDLE, room=1000), p, gaps=auto.target.observe)
    fixed = [simulated_ms_per_token(lambda a, k=k: k, p) for k in range(0, MAX_K + 1)]
    assert ms <= 1.05 * fixed[0], (ms, fixed[0])
    assert ms <= 1.15 * min(fixed), (ms, int(np.argmin(fixed)))


def test_target_cost_takes_medians_of_call_gaps_by_draft_length():
    cost = TargetCost(told_step_ms=25.0, told_token_ms=0.0, max_drafts=8)
    assert float(cost.round_ms(4)) == 25.0  # told, until gaps arrive
    for gap in (880.0, 884.0, 890.0, 60_000.0):  # a person's pause between turns is one gap of many
        cost.observe(4, gap)
    # No plain step seen: the told step stands and the excess goes on the drafts (drafting less, not more).
    assert cost.step_ms() == 25.0 and cost.token_ms == pytest.approx((887.0 - 25.0) / 4)
    for gap in (400.0, 398.0, 402.0):
        cost.observe(0, gap)
    assert cost.step_ms() == 400.0 and float(cost.round_ms(4)) == pytest.approx(887.0)
    cost.observe(99, 1.0)  # more drafts than the server sends: not a round this server made
    assert cost.num_rounds == 7


def test_a_suffix_lead_is_cut_where_verifying_its_tokens_costs_more_than_they_bring():
    cpu = DraftLengthPolicy(CPU_COST, MAX_K, 8, 8)
    estimate = Acceptance(accepted=1, rejected=9)  # the model drafts nothing worth its steps
    sure_then_unlikely = [0.99, 0.98, 0.97, 0.2, 0.05, 0.01]
    assert cpu.plan(estimate, IDLE, 1000, sure_then_unlikely) == (3, 0)
    # Verified tokens cost ~nothing on a GPU: a likely lead is kept whole and the model goes on after it; an
    # unlikely tail gives way to the model's drafts, which count only if the lead before them is kept.
    gpu, likely = DraftLengthPolicy(COST, MAX_K, 8, 8), Acceptance(accepted=8, rejected=2)
    lead, k = gpu.plan(likely, IDLE, 1000, [0.99] * 6)
    assert lead == 6 and k >= 1
    lead, k = gpu.plan(likely, IDLE, 1000, sure_then_unlikely)
    assert lead == 3 and k >= 1


def test_a_probe_shortens_a_suffix_lead_that_fills_the_draft_so_the_model_learns_again():
    gpu = DraftLengthPolicy(COST, 4, 8, 8)
    estimate = Acceptance(accepted=1, rejected=9)
    lead = [0.9] * 4
    assert gpu.plan(estimate, IDLE, 1000, lead) == (4, 0)
    waited = Acceptance(accepted=1, rejected=9, rounds_without_drafts=PROBE_EVERY)
    length, k = gpu.plan(waited, IDLE, 1000, lead)
    assert k >= 1 and length + k <= 4


def test_acceptance_learns_from_accepted_drafts_and_rejections():
    start = Acceptance(accepted=1, rejected=1)
    assert start.updated(num_drafted=4, num_accepted=4).p > start.p  # all kept: no rejection seen
    assert start.updated(num_drafted=4, num_accepted=0).p < start.p
    idle = start.updated(num_drafted=0, num_accepted=0)
    assert idle.p == start.p and idle.rounds_without_drafts == 1  # nothing learned, a round counted
    assert idle.updated(num_drafted=2, num_accepted=1).rounds_without_drafts == 0
    # the censored-geometric estimate: 3 accepted before 1 rejection is p = 3/4, whatever k was
    assert Acceptance(accepted=0, rejected=0.0001).updated(8, 3).p == pytest.approx(0.75, abs=1e-3)


def test_draft_cost_and_policy_refuse_impossible_settings():
    with pytest.raises(DraftLengthConfigError, match="target_verify_ms"):
        DraftCost(target_verify_ms=0, draft_base_ms=1, step_ms=1)
    with pytest.raises(DraftLengthConfigError, match="target_token_ms"):
        DraftCost(target_verify_ms=1, draft_base_ms=1, step_ms=1, target_token_ms=-1)
    with pytest.raises(DraftLengthConfigError, match="queue"):
        DraftLengthPolicy(COST, MAX_K, 8, max_queue_depth=-1)


def test_default_draft_length_flag_and_variable_take_auto_or_a_count():
    from drafter.server.cli import UsageError, config_from_args

    assert (
        config_from_args(["--device=cpu", "--default-draft-length=auto"], {}).default_num_draft_tokens
        == "auto"
    )
    config = config_from_args(["--device=cpu"], {"DRAFTER_DEFAULT_DRAFT_LENGTH": "5"})
    assert config.default_num_draft_tokens == 5 and config.auto_zero_queue_depth == config.max_batch_size
    assert config_from_args(["--device=cpu"], {}).default_num_draft_tokens == 16
    with pytest.raises(UsageError, match="DRAFTER_DEFAULT_DRAFT_LENGTH"):
        config_from_args(["--device=cpu"], {"DRAFTER_DEFAULT_DRAFT_LENGTH": "always"})
    with pytest.raises(UsageError, match="--default-draft-length must be auto or in"):
        config_from_args(["--device=cpu", "--default-draft-length=17"], {})
    with pytest.raises(UsageError, match="--target-verify-ms"):
        config_from_args(["--device=cpu", "--target-verify-ms=0"], {})
    with pytest.raises(UsageError, match="--target-verify-ms-per-token"):
        config_from_args(["--device=cpu", "--target-verify-ms-per-token=-1"], {})
    with pytest.raises(UsageError, match="--target-cost must be one of learn, told"):
        config_from_args(["--device=cpu", "--target-cost=guess"], {})
    told = config_from_args(["--device=cpu"], {"DRAFTER_TARGET_VERIFY_MS_PER_TOKEN": "12.5"})
    assert told.target_verify_ms_per_token == 12.5


def test_step_cost_follows_what_batches_measure():
    measured = policy()
    for _ in range(200):
        measured.observe(decode_ms=40.0, num_steps=8)  # 5 ms a step, not the 1 ms measured at startup
    assert measured.step_ms == pytest.approx(5.0, rel=0.01)
    estimate = Acceptance(accepted=8, rejected=2)
    assert measured.choose(estimate, IDLE, room=1000) < policy().choose(estimate, IDLE, room=1000)
