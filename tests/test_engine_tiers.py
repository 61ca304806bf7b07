"""How many steps a decode loop runs: draft-length tiers, and the step ahead that keeps a fully accepted
round out of prefill. CUDA graphs are CUDA-only; here the engine's static-shape path runs eagerly (padded
buckets, attention spans, a stand-in that replays loops by running them), which is the same bookkeeping."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import engine.engine as engine_module
from drafter.scheduling import startup_costs
from drafter.sessions.draft_length import Acceptance, DraftCost, DraftLengthPolicy, Load
from engine.config import ConfigError, EngineConfig
from engine.decode import run_loop
from engine.engine import Engine
from engine.requests import DraftRequest
from engine.tiers import decode_steps, draft_tiers, tier_for
from tests.oracle import hf_greedy

CONFIG = dict(max_seq_len=400, max_batch_size=4, batch_buckets=(1, 2, 4), min_kv_bucket=128, page_size=16)


def test_tiers_are_capped_by_max_draft_tokens_and_always_include_it():
    assert draft_tiers((4, 8, 16), 16) == (4, 8, 16)
    assert draft_tiers((16, 4, 8, 32), 10) == (4, 8, 10)
    assert draft_tiers((4,), 4) == (4,)
    assert EngineConfig(max_draft_tokens=6, draft_length_tiers=(2, 4, 8)).tiers == (2, 4, 6)


@pytest.mark.parametrize("k, tier", [(1, 4), (4, 4), (5, 8), (8, 8), (9, 16), (16, 16)])
def test_a_call_runs_the_smallest_tier_that_covers_its_k(k, tier):
    assert tier_for((4, 8, 16), k) == tier
    assert decode_steps(k, (4, 8, 16), ahead=False) == tier
    assert decode_steps(k, (4, 8, 16), ahead=True) == tier + 1
    assert decode_steps(k, None, ahead=False) == k  # eager: exact k


@pytest.mark.parametrize("tiers", [(), (0, 4), (4, -1), (True,), (2.5,)])
def test_bad_tiers_are_refused(tiers):
    with pytest.raises(ConfigError, match="draft_length_tiers"):
        EngineConfig(draft_length_tiers=tiers)


class LoopsRunEagerly:
    """Stands in for CapturedLoops on a CPU: the same replay(bucket, kv_len, num_steps), running the loop."""

    def __init__(self, served: Engine):
        self.engine, self.calls = served, []

    def replay(self, bucket: int, kv_len: int, num_steps: int) -> None:
        self.calls.append((bucket, kv_len, num_steps))
        served = self.engine
        run_loop(served.step, served.buffers[bucket], num_steps, kv_len, served.rope, served.pool.tensors)


def static_engine(directory, graphed: bool) -> Engine:
    served = Engine.load(str(directory), EngineConfig(**CONFIG))
    served.static_shapes = True  # what compile or capture sets: padded buckets, spans, one step ahead
    if graphed:
        served.graphs = LoopsRunEagerly(served)
    return served


def counting_prefills(monkeypatch) -> list[int]:
    calls = []
    real = engine_module.prefill

    def counted(model, rows, *args):
        calls.append(sum(len(row.tokens) for row in rows))
        return real(model, rows, *args)

    monkeypatch.setattr(engine_module, "prefill", counted)
    return calls


@pytest.mark.parametrize("graphed", [False, True])
def test_fully_accepted_rounds_never_prefill_and_draft_like_transformers(
    hf_checkpoint, monkeypatch, graphed, one_thread
):
    model, directory = hf_checkpoint("gqa2-untied")
    served = static_engine(directory, graphed)
    prefills = counting_prefills(monkeypatch)
    context = torch.randint(0, 512, (37,), generator=torch.Generator().manual_seed(1)).tolist()
    for k in [3, 5, 16, 4, 7, 2]:  # crosses several 16-position pages
        drafts = served.draft(context, k)
        assert drafts == hf_greedy(model, context, k)
        assert prefills == [36]  # only the first call's context (but its last token) was prefilled
        context = context + drafts + [int(drafts[0] + 1) % 512]  # the target accepts all k, adds its own
    if graphed:
        tiers = [steps - 1 for _, _, steps in served.graphs.calls]
        assert tiers == [4, 8, 16, 4, 8, 4]  # the smallest tier >= k each round


def test_an_eager_engine_runs_exact_k_and_prefills_the_last_accepted_draft(hf_checkpoint, monkeypatch):
    model, directory = hf_checkpoint("gqa2-untied")
    served = Engine.load(str(directory), EngineConfig(**CONFIG))
    prefills = counting_prefills(monkeypatch)
    context = list(range(1, 30))
    drafts = served.draft(context, 4)
    context = context + drafts + [7]
    assert served.draft(context, 4) == hf_greedy(model, context, 4)
    assert prefills == [28, 1]  # the 4th draft was never fed back: one token of eager prefill


def test_a_graphed_batch_runs_the_tier_of_its_largest_k(hf_checkpoint, one_thread):
    model, directory = hf_checkpoint("gqa2-untied")
    served = static_engine(directory, graphed=True)
    generator = torch.Generator().manual_seed(2)
    contexts = [torch.randint(0, 512, (n,), generator=generator).tolist() for n in (5, 70, 33)]
    results = served.draft_batch([DraftRequest(c, k) for c, k in zip(contexts, (2, 6, 3), strict=True)])
    assert [r.tokens for r in results] == [
        hf_greedy(model, c, k) for c, k in zip(contexts, (2, 6, 3), strict=True)
    ]
    assert served.graphs.calls == [(4, 128, 9)]  # bucket 4 (3 rows padded), span 128, tier 8 + 1


def test_step_costs_are_learned_per_step_that_ran(hf_checkpoint, one_thread):
    """Under graphs a k = 1 call runs tier 4 + 1 = 5 steps and k = 16 runs 17: the startup measure and the
    running estimate divide by those, not by k (which made step_ms ~3x too low and `"auto"` over-draft)."""
    _, directory = hf_checkpoint("gqa2-untied")
    served = static_engine(directory, graphed=True)
    real = served.draft_batch

    def timed_by_steps(requests):  # 2 ms a step and 0.5 ms besides, whatever this machine's speed
        return [dataclasses.replace(r, decode_ms=2.0 * r.num_steps, prefill_ms=0.5) for r in real(requests)]

    served.draft_batch = timed_by_steps
    assert [served.decode_steps(k) for k in (1, 4, 5, 16)] == [5, 5, 9, 17]
    costs = startup_costs.measure(served, inline_max_ms=0, repeats=1)
    assert costs.step_ms == pytest.approx(2.0) and costs.base_ms == pytest.approx(0.5)

    policy = DraftLengthPolicy(DraftCost(25.0, costs.base_ms, 1.0), 16, 4, 4, served.decode_steps)
    [result] = served.draft_batch([DraftRequest(list(range(1, 40)), 5)])
    assert result.num_steps == 9 == served.graphs.calls[-1][2]
    for _ in range(200):
        policy.observe(result.decode_ms, result.num_steps)
    assert policy.step_ms == pytest.approx(2.0, rel=1e-3)
    # k = 5 costs a whole tier-8 loop: the policy never picks a k that pays for steps it does not use
    assert policy.choose(Acceptance(9.0, 1.0), Load(0, 0), room=100) in (4, 8, 16)
