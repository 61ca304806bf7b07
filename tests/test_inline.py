"""Which lone requests the event loop drafts itself: the engine's estimate of a request's uncached tokens,
the costs measured at startup, and the policy that weighs them against `--inline-max-ms`."""

from __future__ import annotations

import math

import numpy as np
import pytest

from drafter.scheduling import startup_costs
from drafter.scheduling.inline import InlinePolicy, effective_max_ms
from drafter.sessions.draft_length import DraftCost, DraftLengthPolicy
from engine.config import EngineConfig
from engine.engine import Engine
from engine.requests import DraftRequest


@pytest.fixture(scope="module")
def engine():
    return Engine.load("tiny", EngineConfig(max_seq_len=1024, max_batch_size=4, max_draft_tokens=8))


def context(start: int, length: int) -> np.ndarray:
    return (start + 3 * np.arange(length, dtype=np.int64)) % 1000


def test_expected_prefill_is_what_the_engine_then_computes(engine):
    first, other = context(5, 300), context(6, 40)
    assert engine.expected_prefill(DraftRequest(first, 4)) == 300  # nothing of it is cached
    [result] = engine.draft_batch([DraftRequest(first, 4)])
    assert result.prefilled == 300
    # Two drafts accepted (cached: the decode loop wrote them) and one token added.
    grown = np.concatenate([first, result.tokens[:2], [9]])
    expected = engine.expected_prefill(DraftRequest(grown, 4))
    assert expected == engine.draft_batch([DraftRequest(grown, 4)])[0].prefilled == 1
    # Another conversation, then the first again under its session name: the hint finds it.
    engine.draft_batch([DraftRequest(first, 4, session="a")])
    engine.draft_batch([DraftRequest(other, 4)])
    again = DraftRequest(np.concatenate([first, [1, 2]]), 4, session="a")
    assert engine.expected_prefill(again) == engine.draft_batch([again])[0].prefilled == 2


def test_the_startup_measure_prices_prefill_with_a_short_probe_where_no_draft_runs_inline(engine):
    never = startup_costs.measure(engine, inline_max_ms=0, repeats=1)  # what `"auto"`'s batch rows weigh
    assert 0 < never.prefill_token_ms < math.inf and never.base_ms >= 0 and never.step_ms >= 0
    costs = startup_costs.measure(engine, inline_max_ms=1000, repeats=1)
    assert 0 < costs.prefill_token_ms < math.inf


def test_a_cached_context_runs_inline_where_a_long_fresh_one_does_not(engine):
    costs = startup_costs.measure(engine, inline_max_ms=1000, repeats=2)
    policy = DraftLengthPolicy(DraftCost(25.0, costs.base_ms, costs.step_ms), 8, 4, 4)

    def inline_policy(max_ms: float) -> InlinePolicy:
        return InlinePolicy(
            max_ms, costs.prefill_token_ms, policy, engine.decode_steps, engine.expected_prefill
        )

    cached = context(11, 500)
    engine.draft_batch([DraftRequest(cached, 1)])
    short, long = DraftRequest(cached, 1), DraftRequest(context(12, 1000 - 8), 8)
    estimate = inline_policy(0)
    assert estimate.expected_ms(short) < estimate.expected_ms(long)
    between = (estimate.expected_ms(short) + estimate.expected_ms(long)) / 2
    assert inline_policy(between)(short) and not inline_policy(between)(long)
    assert not inline_policy(0)(short)  # 0 turns it off


def test_a_multithreaded_cpu_engine_never_drafts_on_the_loop():
    """A second thread running torch would start a second OpenMP team beside the engine thread's."""
    assert effective_max_ms(10.0, "cpu", 1) == (10.0, None)
    assert effective_max_ms(10.0, "cuda", 16) == (10.0, None)
    off, why = effective_max_ms(10.0, "cpu", 4)
    assert off == 0.0 and "4 torch threads" in why
    assert effective_max_ms(0.0, "cpu", 4) == (0.0, None)  # off by the setting: nothing to explain
