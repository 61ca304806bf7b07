"""What auto learns of the target from the gaps between a session's calls, through the real session table and
Speculation (the parts a `/draft` call goes through, without HTTP): a verified call's gap is one round at
the number of drafts the session was sent; the rows of a /draft/batch request hear their gaps as their
share of one pass; a rollback or a call beside another of its session is none; a server told to keep its
costs (`--target-cost told`) learns nothing."""

from __future__ import annotations

import time

import numpy as np
import pytest

from drafter.draft_params import DraftParams
from drafter.server.metrics import Metrics
from drafter.sessions.draft_length import DraftCost, DraftLengthPolicy, Load
from drafter.sessions.draft_source import MODEL
from drafter.sessions.speculation import Speculation
from drafter.sessions.table import SessionTable
from drafter.sessions.target_cost import TargetCost

K = 4
IDLE = Load(queue_depth=0, running=0)
STEP_S, TOKEN_S = 0.040, 0.010  # the scripted target's round: a step, and what each verified draft adds


def speculation(learn: bool = True) -> Speculation:
    policy = DraftLengthPolicy(DraftCost(25.0, 1.0, 1.0), K, 1, 1, learn_target_cost=learn)
    return Speculation(SessionTable(16, 600, 4096), policy, Metrics(1), K, 4096)


def v2(token: str, prefix_len: int, new: list[int]) -> DraftParams:
    new_tokens = np.asarray(new, dtype=np.int64)
    return DraftParams(new_tokens, K, session="s", prefix_len=prefix_len, session_token=token, source=MODEL)


def scripted_rounds(spec: Speculation, draft_counts: list[int]) -> None:
    """A target that keeps every draft it is sent and takes STEP_S + TOKEN_S per draft before calling again."""
    context = list(range(1, 40))
    params = DraftParams(np.asarray(context, dtype=np.int64), K, session="s", source=MODEL)
    token = spec.finish(spec.prepare(params, IDLE), [7] * draft_counts[0])["session_token"]
    for sent, next_count in zip(draft_counts, [*draft_counts[1:], 0], strict=True):
        time.sleep(STEP_S + sent * TOKEN_S)
        prefix_len = len(context) + sent  # all kept, then the target's own token
        context += [7] * sent + [8]
        call = spec.prepare(v2(token, prefix_len, [8]), IDLE)
        assert call.accepted == sent
        spec.finish(call, [7] * next_count)


def test_gaps_between_verified_calls_teach_the_policy_the_targets_round():
    spec = speculation()
    scripted_rounds(spec, [0, 0, 0, 0, 4, 4, 4, 4])
    target = spec.policy.target
    assert target.num_rounds == 8
    # Sleeps overshoot on a busy machine, never undershoot: bounds from below exact, from above loose.
    assert STEP_S * 1e3 <= target.step_ms() < STEP_S * 1e3 + 30
    assert (STEP_S + K * TOKEN_S) * 1e3 <= float(target.round_ms(K)) < (STEP_S + K * TOKEN_S) * 1e3 + 30
    assert spec.policy.describe()["target"]["rounds_observed"] == 8


def test_rows_of_one_batch_learn_their_share_of_the_pass_not_a_pass_of_their_own_drafts():
    """A batching target's pass verifies every row's drafts and takes STEP_S + TOKEN_S a draft, all rows'
    drafts counted: each row's gap is that whole pass, learned as a row's share of a pass of 4 drafts a
    row (rows sent 4 and rows sent none alike), and rows sent no drafts in a plain pass give the step."""
    rows, spec = 4, speculation()
    names = [f"row{i}" for i in range(rows)]
    contexts = {name: list(range(1 + i, 40 + i)) for i, name in enumerate(names)}
    tokens = {}

    def batch(planned: dict[str, int], first: bool = False) -> None:
        calls = {}
        for name in names:
            if first:
                params = DraftParams(np.asarray(contexts[name]), K, session=name, source=MODEL)
            else:
                params = DraftParams(np.asarray([8]), K, session=name, prefix_len=len(contexts[name]) - 1,
                                     session_token=tokens[name], source=MODEL)  # fmt: skip
            calls[name] = spec.prepare(params, IDLE, rows)
        for name, call in calls.items():  # as the route does: the pass's drafts, on every row
            call.pass_drafts = sum(planned.values())
            tokens[name] = spec.finish(call, [7] * planned[name])["session_token"]
            contexts[name] += [7] * planned[name] + [8]  # all kept, then the target's own token

    sent = {name: 4 if i < 2 else 0 for i, name in enumerate(names)}  # 2 drafts a row, on half the rows
    batch(sent, first=True)
    for planned in [dict.fromkeys(names, 4)] * 3 + [dict.fromkeys(names, 0)] * 4:
        time.sleep(STEP_S + TOKEN_S * sum(sent.values()))  # the target's pass of what it was sent
        batch(planned)
        sent = planned
    target = spec.policy.target
    assert target.num_rounds == rows * 7
    assert STEP_S * 1e3 / rows <= target.step_ms(rows) < (STEP_S * 1e3 + 30) / rows
    assert TOKEN_S * 1e3 * 0.9 <= target.token_ms < TOKEN_S * 1e3 + 30 / 4


def test_passes_of_different_row_counts_are_learned_apart():
    """A batching target's rows finish and its passes shrink: a row's share of a plain step is ~4x less at 4
    rows than at 1 on a CPU (the real pair under vLLM: 466 and 114 ms). Learned apart, each count keeps
    its own; in one window the mix said 224 ms and 0 ms a draft at 4 rows, and drafting looked cheap."""
    cost = TargetCost(told_step_ms=455.0, told_token_ms=25.0, max_drafts=K)
    for _ in range(4):
        cost.observe(0, 466.0, rows=1)
        cost.observe(4, 466.0 + 4 * 25.0, rows=1)
        cost.observe(0, 455.0, rows=4)
        cost.observe(16, 455.0 + 16 * 25.0, rows=4)
    assert float(cost.round_ms(0, 1)) == pytest.approx(466.0)
    assert float(cost.round_ms(0, 4)) == pytest.approx(455.0 / 4)
    assert float(cost.round_ms(4, 4)) == pytest.approx(455.0 / 4 + 4 * 25.0)
    assert cost.describe()["by_rows"]["4"] == {"step_ms": 113.75, "token_ms": 25.0}


def test_a_row_count_whose_drafted_passes_came_out_short_does_not_make_drafts_free():
    """Under vLLM at 8 rows, three probes' passes came out shorter than the median plain pass: learned
    alone that count said 0 ms a draft, and as the latest estimate every count's. Pooled, the other counts'
    gaps outweigh it."""
    cost = TargetCost(told_step_ms=455.0, told_token_ms=25.0, max_drafts=K)
    for _ in range(8):
        cost.observe(0, 466.0, rows=1)
        cost.observe(4, 466.0 + 4 * 25.0, rows=1)
    for _ in range(3):
        cost.observe(0, 455.0, rows=8)
        cost.observe(8, 440.0, rows=8)  # one draft a row, a pass shorter than the plain ones
    assert 15.0 < cost.token_ms < 25.0
    assert float(cost.round_ms(1, 8)) > float(cost.round_ms(0, 8)) + 15.0


def test_a_rollback_and_a_call_beside_another_of_its_session_are_no_rounds():
    spec = speculation()
    context = list(range(1, 40))
    params = DraftParams(np.asarray(context, dtype=np.int64), K, session="s", source=MODEL)
    token = spec.finish(spec.prepare(params, IDLE), [7, 7])["session_token"]
    first = spec.prepare(v2(token, len(context) + 2, [8]), IDLE)
    beside = spec.prepare(v2(token, len(context) + 2, [9]), IDLE)  # the same session, still in flight
    assert beside.accepted == 2 and spec.policy.target.num_rounds == 1
    spec.abandon(beside)
    spec.finish(first, [7])
    rollback = spec.prepare(v2(token, 10, [5]), IDLE)  # behind the last context: its drafts were not verified
    assert rollback.accepted is None and spec.policy.target.num_rounds == 1


def test_told_costs_stay_as_told():
    spec = speculation(learn=False)
    scripted_rounds(spec, [0, 0, 0, 4, 4, 4])
    target = spec.policy.target
    assert target.num_rounds == 0 and target.step_ms() == 25.0 and float(target.round_ms(K)) == 25.0
