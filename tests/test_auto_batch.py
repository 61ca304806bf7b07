"""`"auto"` under a batching target (vLLM's proposer: one /draft/batch row per request in its batch), through
the real session table and Speculation as the batch route drives them (prepare every row with the rows'
count, `together`, then finish each with the pass's drafts), against a simulated CPU target whose pass
verifies every row's drafts after one draft batch of ours. The rows draft only where together they beat the
same rows without drafts, probe together, and learn their share of the pass from their gaps."""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest

from drafter.draft_params import AUTO, DraftParams
from drafter.server.metrics import Metrics
from drafter.sessions.batch_rows import LONE_RUN, DraftingRuns, RowDraft, pays_together
from drafter.sessions.draft_length import PROBE_EVERY, Acceptance, DraftCost, DraftLengthPolicy, Load
from drafter.sessions.draft_source import MODEL
from drafter.sessions.speculation import Speculation
from drafter.sessions.table import SessionTable

K = 4
IDLE = Load(queue_depth=0, running=0)
# vLLM's CPU engine and the real pair on 2 cores (bench/README.md's peer table): a pass costs a fixed part and
# a part per token verified, every row's drafts included; our batch's decode step grows with its rows.
PASS_MS, PASS_TOKEN_MS = 400.0, 70.0
DRAFT_BASE_MS, DRAFT_STEP_MS, DRAFT_ROW_MS = 100.0, 120.0, 35.0
PREFILL_TOKEN_MS = 13.0  # our batch, a prefilled token (the real pair's drafter in batches of 8 rows)


def batch_cost(rows: int) -> DraftCost:
    """What an operator would tell the server: a plain pass of `rows` rows, and our batch's costs."""
    return DraftCost(
        PASS_MS + PASS_TOKEN_MS * rows, DRAFT_BASE_MS, DRAFT_STEP_MS + DRAFT_ROW_MS * rows, PASS_TOKEN_MS
    )


def draft_ms(ks: list[int]) -> float:
    drafting = sum(k > 0 for k in ks)
    return DRAFT_BASE_MS + max(ks) * (DRAFT_STEP_MS + DRAFT_ROW_MS * drafting) if drafting else 0.0


class Clock:
    """perf_counter for the session table and Speculation: simulated time, so gaps are the passes'."""

    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def simulate(
    policy,
    k,
    p: float,
    rows: int,
    rounds: int = 300,
    shared=True,
    clock=None,
    spec=None,
    prompt=39,
    prefill_ms=0.0,
):
    """The target's ms per token over `rounds` passes of `rows` conversations, each draft kept with
    probability p; k: "auto" or a fixed count, or one of those per row; `shared`: the rows come as one /draft/batch request (else
    each as its own call, weighed as if alone); `prefill_ms`: what our batch spends on each token a drafting row
    prefills (everything since it last drafted; a new row's whole `prompt`). Returns (ms per token, each pass's
    drafts)."""
    spec = spec or Speculation(SessionTable(64, 600, 8192), policy, Metrics(1), K, 8192)
    rng, tokens, ms, history = random.Random(0), 0, 0.0, []
    contexts = [list(range(1 + row, 1 + prompt + row)) for row in range(rows)]
    cached = [0] * rows  # the context length our engine last drafted from, per row
    grants: list[tuple[str, int]] = [("", 0)] * rows  # each session's token and where its next call starts
    asked = k if isinstance(k, list) else [k] * rows
    for _ in range(rounds):
        calls = []
        for row in range(rows):
            token, prefix_len = grants[row]
            new = contexts[row][prefix_len:] if token else contexts[row]
            params = DraftParams(
                np.asarray(new), asked[row], session=f"row{row}", source=MODEL,
                **({"prefix_len": prefix_len, "session_token": token} if token else {}),
            )  # fmt: skip
            calls.append(spec.prepare(params, IDLE, rows if shared else None))
        if shared:
            spec.together(calls, IDLE)
        ks = [call.num_draft_tokens for call in calls]
        history.append(ks)
        ours = draft_ms(ks) + prefill_ms * sum(len(contexts[r]) - cached[r] for r in range(rows) if ks[r])
        cached = [len(contexts[r]) if ks[r] else cached[r] for r in range(rows)]
        if clock is not None:
            clock.now += ours / 1e3
        for row, call in enumerate(calls):
            call.pass_drafts = sum(ks) if shared else None
            token = spec.finish(call, [7] * ks[row])["session_token"]
            accepted = 0
            while accepted < ks[row] and rng.random() < p:
                accepted += 1
            grants[row] = token, len(contexts[row]) + accepted
            contexts[row] += [7] * accepted + [8]  # then the target's own token
            tokens += 1 + accepted
        pass_ms = PASS_MS + PASS_TOKEN_MS * (rows + sum(ks))
        ms += pass_ms + ours
        if clock is not None:
            clock.now += pass_ms / 1e3
    return ms / tokens, history


def told(rows: int, prefill_token_ms: float = 0.0) -> DraftLengthPolicy:
    cost = dataclasses.replace(batch_cost(rows), prefill_token_ms=prefill_token_ms)
    return DraftLengthPolicy(cost, K, 8, 8, learn_target_cost=False)


@pytest.mark.parametrize("rows", [4, 8])
@pytest.mark.parametrize("p", [0.3, 0.7, 0.85, 0.95])
def test_rows_of_one_request_never_make_the_target_5_percent_slower_nor_10_percent_off_the_best_k(p, rows):
    auto, _ = simulate(told(rows), AUTO, p, rows)
    by_k = [simulate(told(rows), k, p, rows)[0] for k in range(K + 1)]
    assert auto <= 1.05 * by_k[0], (auto, by_k[0])
    assert auto <= 1.10 * min(by_k), (auto, int(np.argmin(by_k)))


@pytest.mark.parametrize("p", [0.7, 0.95])
def test_rows_weigh_the_prefill_a_draft_after_none_costs_and_a_new_requests_prompt(p, rows=4):
    """vLLM's new requests bring their whole prompts, and rows that answered none for a while everything since:
    on a CPU our batch prefills each token at ~13-26 ms (the real pair's drafter). Blind to it (a prefill cost
    not known), a batch drafts its rows' prompts at its first pass and probes at seconds each, and the target
    runs more than 5% slower than without drafts; weighing it, never."""
    blind, _ = simulate(told(rows), AUTO, p, rows, rounds=120, prompt=300, prefill_ms=PREFILL_TOKEN_MS)
    auto, _ = simulate(
        told(rows, PREFILL_TOKEN_MS), AUTO, p, rows, rounds=120, prompt=300, prefill_ms=PREFILL_TOKEN_MS
    )
    plain, _ = simulate(told(rows), 0, p, rows, rounds=120, prompt=300, prefill_ms=PREFILL_TOKEN_MS)
    assert blind > 1.05 * plain and auto <= 1.05 * plain, (blind, auto, plain)


@pytest.mark.parametrize("p", [0.7, 0.95])
def test_a_batch_probe_pays_for_its_rows_whole_backlog_at_once(p, rows=4):
    """Under a loaded vLLM on the real pair, each probe prefilled every row's prompt and all since (8 rows:
    one 9 s batch of ours in a 41 s run) and drafting did not go on after it: spread over the rounds that
    drafting would go on for, the backlog looked cheap, yet a probe that brings no drafting back pays it
    all. Charged at once, no probe is made where its rows' prefill outweighs even drafts all kept."""
    auto, history = simulate(
        told(rows, PREFILL_TOKEN_MS), AUTO, p, rows, rounds=64, prompt=100, prefill_ms=PREFILL_TOKEN_MS
    )
    plain, _ = simulate(told(rows), 0, p, rows, rounds=64, prompt=100, prefill_ms=PREFILL_TOKEN_MS)
    assert auto <= 1.05 * plain, (auto, plain, [i for i, ks in enumerate(history) if any(ks)])


def test_a_start_spreads_its_backlog_over_the_rounds_drafting_went_on_for_lately():
    """Runs of drafting that ended after a round or two (a start that did not last) make the next start at
    that size pay nearly its whole backlog; before a run at a size ended, a start spreads it over LONE_RUN
    rounds over the rows (a lone row's run is the longest), and a lone row drafting to its end keeps it."""
    runs = DraftingRuns()
    assert runs.rounds(1) == LONE_RUN and runs.rounds(4) == LONE_RUN / 4 and runs.rounds(32) == 1.0
    for _ in range(12):
        runs.ended(2, 1)
    assert runs.rounds(2) < 1.5 and runs.rounds(4) == LONE_RUN / 4  # sizes apart
    runs.ended(1, 40)
    assert runs.rounds(1) == LONE_RUN and runs.describe()["1"] == LONE_RUN


def test_rows_whose_drafts_pay_still_start_with_their_prompts_to_prefill(p=0.95, rows=2):
    """Where drafting pays (2 rows at acceptance 0.95, which the server's estimate already says), the rows
    start despite their prompts' prefill, go on drafting, and the target runs faster than without drafts."""
    costs = dict(rounds=64, prompt=100, prefill_ms=PREFILL_TOKEN_MS)
    policy = told(rows, PREFILL_TOKEN_MS)
    spec = Speculation(SessionTable(64, 600, 8192), policy, Metrics(1), K, 8192)
    spec.acceptance = Acceptance(accepted=19, rejected=1)
    auto, history = simulate(policy, AUTO, p, rows, spec=spec, **costs)
    plain, _ = simulate(told(rows), 0, p, rows, **costs)
    assert auto < 0.95 * plain and sum(all(ks) for ks in history) > 32, (auto, plain)


def test_the_last_row_of_a_batching_target_weighs_its_backlog_as_batches_do():
    """A one-row /draft/batch request (a batching target's last request, the others done) is still a row of
    a batch: it probes with the batch, weighing everything since it last drafted. Probing on its own wait as
    a /draft call does, it prefilled its whole context at each probe."""
    low = dict(p=0.05, rows=1, rounds=120, prompt=300, prefill_ms=PREFILL_TOKEN_MS)
    as_call, _ = simulate(told(1, PREFILL_TOKEN_MS), AUTO, shared=False, **low)
    as_row, _ = simulate(told(1, PREFILL_TOKEN_MS), AUTO, **low)
    plain, _ = simulate(told(1), 0, **low)
    assert as_call > 1.05 * plain and as_row <= 1.05 * plain, (as_call, as_row, plain)


def test_rows_weighed_as_if_each_were_alone_draft_where_the_batch_loses():
    """The fault the share fixes: at 8 rows and acceptance 0.93, each row, as if the target's only request,
    drafts (its tokens beat a whole plain pass), and the target runs ~0.8x as fast as without drafts."""
    as_if_alone, _ = simulate(told(8), AUTO, 0.93, 8, rounds=100, shared=False)
    shared, _ = simulate(told(8), AUTO, 0.93, 8, rounds=100)
    plain, _ = simulate(told(8), 0, 0.93, 8, rounds=100)
    assert as_if_alone > 1.15 * plain and shared <= 1.05 * plain


def test_rows_probe_together_and_each_probe_that_brings_no_drafting_back_doubles_the_wait():
    _, history = simulate(told(4), AUTO, 0.05, 4, rounds=PROBE_EVERY * 8)
    drafted = [i for i, ks in enumerate(history) if any(ks)]
    assert all(all(history[i]) for i in drafted), history  # a probe: every row at once
    gaps = np.diff([-1, *drafted]) - 1  # passes without drafts before each probe
    assert list(gaps[:3]) == [PROBE_EVERY, 2 * PROBE_EVERY, 4 * PROBE_EVERY], drafted


def test_a_batch_probe_leaves_a_new_sessions_wait_for_a_probe_as_it_was():
    """The server-wide wait a new session starts at comes from sessions' own probes, not a batch's rows."""
    policy = told(4)
    spec = Speculation(SessionTable(64, 600, 8192), policy, Metrics(1), K, 8192)
    _, history = simulate(policy, AUTO, 0.05, 4, rounds=3 * PROBE_EVERY + 3, spec=spec)
    assert sum(any(ks) for ks in history) == 2  # two batch probes, neither brought drafting back
    assert spec.probe_every == PROBE_EVERY


def test_rows_make_no_batch_probe_where_even_drafts_all_kept_would_not_pay():
    """A probe on a CPU re-prefills everything since each row's last draft (seconds at 8 rows); where our
    batch is too slow next to the target's pass for any acceptance to pay, none is made."""
    slow = DraftLengthPolicy(batch_cost(8), K, 8, 8, learn_target_cost=False)
    slow.observe(5 * 2000.0, 5, rows=8, engine_ms=5 * 2000.0, prefill_ms=0.0, prefilled=0)
    _, history = simulate(slow, AUTO, 1.0, 8, rounds=3 * PROBE_EVERY)
    assert not any(any(ks) for ks in history)
    _, history = simulate(told(4), AUTO, 0.05, 4, rounds=3 * PROBE_EVERY)
    assert any(any(ks) for ks in history)  # 4 rows at the costs told: drafts all kept would pay, it probes


def test_auto_rows_beside_a_row_at_a_fixed_k_still_probe_together():
    _, history = simulate(told(4), [4, AUTO, AUTO, AUTO], 0.05, 4, rounds=4 * PROBE_EVERY)
    assert all(ks[0] == 4 for ks in history)  # the client's k, as asked
    probes = [i for i, ks in enumerate(history) if any(ks[1:])]
    assert probes and all(all(history[i][1:]) for i in probes), history


@pytest.mark.parametrize("rows", [4, 8])
def test_rows_told_a_gpu_step_learn_their_share_of_the_pass_from_their_gaps(rows, monkeypatch):
    """Told the default step (a GPU target's 25 ms) and no per-token cost, the rows hear each gap (the whole
    pass) as their share, and end within 5% of no speculation."""
    clock = Clock()
    monkeypatch.setattr("time.perf_counter", clock)
    blind = DraftLengthPolicy(DraftCost(25.0, DRAFT_BASE_MS, DRAFT_STEP_MS + DRAFT_ROW_MS * rows), K, 8, 8)
    ms, _ = simulate(blind, AUTO, 0.85, rows, clock=clock)
    plain, _ = simulate(told(rows), 0, 0.85, rows)
    assert ms <= 1.05 * plain, (ms, plain)
    assert blind.target.step_ms(rows) == pytest.approx((PASS_MS + PASS_TOKEN_MS * rows) / rows)


def test_a_row_whose_drafts_pay_only_with_the_others_drafting_does_not_pay_alone():
    """Each row plans against its share of our draft batch; a row drafting alone makes the pass wait for a
    whole batch."""
    policy = told(4)
    sure = Acceptance(accepted=19, rejected=1)
    k = policy.plan(sure, IDLE, 1000, rows=4)[1]
    assert k >= 1
    drafting, plain = RowDraft(policy.expected_tokens(sure, (), 0, k), k, k), RowDraft(1.0, 0, 0)
    assert pays_together(policy, [drafting] * 4, IDLE)
    assert not pays_together(policy, [drafting] + [plain] * 3, IDLE)
    assert not pays_together(policy, [plain] * 4, IDLE)


def test_rows_weigh_our_batch_at_its_size_as_batches_of_that_size_ran():
    """Measured at startup on one row, a batch of 4 looks cheap; once batches of 4 have run at their own
    cost, the rows of a 4-row request weigh that, and a size not yet seen costs the largest smaller one's."""
    one_row = DraftCost(
        PASS_MS + PASS_TOKEN_MS * 4, DRAFT_BASE_MS, DRAFT_STEP_MS + DRAFT_ROW_MS, PASS_TOKEN_MS
    )
    policy = DraftLengthPolicy(one_row, K, max_batch_size=8, max_queue_depth=8)
    sure = Acceptance(accepted=19, rejected=1)
    assert policy.plan(sure, IDLE, 1000, rows=4)[1] == K
    for _ in range(2):  # 40 tokens prefilled in 400 ms, 5 steps of 900 ms, 300 ms besides
        policy.observe(5 * 900.0, 5, rows=4, engine_ms=5 * 900.0 + 700.0, prefill_ms=400.0, prefilled=40)
    seen = {"base_ms": 300.0, "step_ms": 900.0, "prefill_token_ms": 10.0}
    assert policy.describe()["by_batch_size"]["4"] == seen
    assert policy.plan(sure, IDLE, 1000, rows=4)[1] == 0
    # 6 rows drafting 3 every round: each prefills its 3 drafts and the target's token
    assert float(policy.draft_ms(3, IDLE, rows=6)) == pytest.approx(300.0 + 6 * 4 * 10.0 + 3 * 900.0)
    assert float(policy.draft_ms(3, IDLE, rows=1)) < 1000.0  # one row: its own cost, as at startup
