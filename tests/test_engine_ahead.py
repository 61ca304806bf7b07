"""Branches drafted ahead (engine/ahead.py): each branch's drafts equal transformers' greedy drafts for its
context — forked at every accepted position, inside a page and at a page boundary — and so do the drafts of
a session that adopts one, rolls back past its fork points, or shares its prefix with another; branches go
first under pressure, never evict a conversation, and a stop between decode steps leaves nothing behind."""

from __future__ import annotations

import numpy as np
import pytest

from engine.config import EngineConfig
from engine.engine import Engine
from engine.requests import DraftRequest
from tests.oracle import hf_greedy

PAGE = 16
K = 6


def ahead_engine(directory, **overrides) -> Engine:
    config = dict(
        max_seq_len=256,
        max_batch_size=8,
        max_draft_tokens=8,
        page_size=PAGE,
        kv_cache_tokens=2048,
        top_choices=3,
    )
    return Engine.load(str(directory), EngineConfig(**(config | overrides)))


@pytest.fixture(scope="module")
def oracle(hf_checkpoint, request):
    return hf_checkpoint(getattr(request, "param", "gqa2-untied"))  # a test may name another (indirect)


def context_of(seed: int, length: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, 512, length).tolist()


def outcomes_of(context: list[int], result) -> list[list[int]]:
    """Every accepted count 0..k with the target's token the drafter's runner-up (its first choice after
    the last draft when all are accepted): the contexts drafting ahead predicts."""
    drafts = result.tokens
    contexts = []
    for a in range(len(drafts) + 1):
        ranked = [token for token, _ in result.choices[a]]
        bonus = ranked[0] if a == len(drafts) else next(t for t in ranked if t != drafts[a])
        contexts.append(context + drafts[:a] + [bonus])
    return contexts


@pytest.mark.parametrize("length", [42, 44])  # forks at 42..48: inside pages, and at the boundary 48
def test_branches_at_every_position_equal_greedy_and_adopting_one_continues(oracle, length):
    model, directory = oracle
    engine = ahead_engine(directory)
    context = context_of(length, length)
    plain = engine.draft_batch([DraftRequest(context, K, "s")])[0]
    assert plain.choices == [] and plain.num_steps == K  # an eager loop ranks nothing unless asked
    first = engine.draft_batch([DraftRequest(context, K, "s", choices=True)])[0]
    assert first.tokens == plain.tokens == hf_greedy(model, context, K)
    assert len(first.choices) == K + 1 and all(len(c) == 3 for c in first.choices)
    predicted = outcomes_of(context, first)
    branches = engine.draft_ahead("s", [DraftRequest(c, K, choices=True) for c in predicted])
    assert len(branches) == K + 1
    for branch_context, branch in zip(predicted, branches, strict=True):
        assert branch.result.tokens == hf_greedy(model, branch_context, K)
        assert branch.result.prefilled == 1  # its new token alone: the prefix shared, the partial page copied
    # The target kept 3 and added the runner-up: the session adopts that branch and grows from it.
    engine.branch_ops.adopt("s", branches[3].sequence)
    grown = predicted[3] + branches[3].result.tokens[:2] + [9]
    result = engine.draft_batch([DraftRequest(grown, K, "s")])[0]
    assert result.tokens == hf_greedy(model, grown, K)
    assert result.prefilled == 1  # everything else was on the adopted branch's pages
    assert engine.table.branches == {} and len(engine.table.sequences) == 1
    # Rolled back past every fork point: still exact.
    rolled = context[:30] + [5]
    assert engine.draft_batch([DraftRequest(rolled, K, "s")])[0].tokens == hf_greedy(model, rolled, K)


def test_a_miss_drops_the_branches_and_two_sessions_sharing_a_prefix_stay_exact(oracle):
    model, directory = oracle
    engine = ahead_engine(directory)
    shared = context_of(7, 40)
    contexts = {"a": shared + [1, 2, 3], "b": shared + [4]}
    for name, context in contexts.items():
        result = engine.draft_batch([DraftRequest(context, K, name, choices=True)])[0]
        predicted = outcomes_of(context, result)[::2]
        for branch_context, branch in zip(
            predicted,
            engine.draft_ahead(name, [DraftRequest(c, K, choices=True) for c in predicted]),
            strict=True,
        ):
            assert branch.result.tokens == hf_greedy(model, branch_context, K)
    assert set(engine.table.branches) == {"a", "b"}
    engine.branch_ops.drop("a")  # a's next call matched none of its branches
    missed = contexts["a"] + [11, 12]
    assert engine.draft_batch([DraftRequest(missed, K, "a")])[0].tokens == hf_greedy(model, missed, K)
    assert set(engine.table.branches) == {"b"}


def test_branches_go_first_under_pressure_and_never_evict_a_conversation(oracle):
    model, directory = oracle
    # 20 pages: two 100-token conversations with their drafts hold 14; branches take what is left.
    engine = ahead_engine(directory, max_seq_len=128, kv_cache_tokens=20 * PAGE)
    first = context_of(1, 100)
    result = engine.draft_batch([DraftRequest(first, K, "one", choices=True)])[0]
    predicted = outcomes_of(first, result)
    assert engine.draft_ahead("one", [DraftRequest(c, K, choices=True) for c in predicted]) is not None
    assert engine.table.branches
    second = context_of(2, 100)
    # The new conversation needs pages: the branches give theirs, the first conversation keeps its own.
    assert engine.draft_batch([DraftRequest(second, K, "two")])[0].tokens == hf_greedy(model, second, K)
    assert engine.table.counters.evicted_branches > 0 and engine.table.counters.evicted_sequences == 0
    # Now branches for "two" do not all fit beside both conversations: none is placed, nothing evicted.
    result = engine.draft_batch([DraftRequest(second, K, "two", choices=True)])[0]
    assert (
        engine.draft_ahead("two", [DraftRequest(c, K, choices=True) for c in outcomes_of(second, result)])
        is None
    )
    assert engine.table.counters.evicted_sequences == 0 and "two" not in engine.table.branches
    grown = first + [3]
    assert engine.draft_batch([DraftRequest(grown, K, "one")])[0].cached == len(first)


def test_a_stop_between_steps_leaves_no_branch_and_frees_its_pages(oracle):
    _, directory = oracle
    engine = ahead_engine(directory)
    context = context_of(3, 50)
    result = engine.draft_batch([DraftRequest(context, K, "s", choices=True)])[0]
    free = engine.table.allocator.num_free
    asked = []

    def stop() -> bool:
        asked.append(1)
        return len(asked) >= 2  # a real request arrived during the second step

    predicted = outcomes_of(context, result)
    assert engine.draft_ahead("s", [DraftRequest(c, K, choices=True) for c in predicted], stop) is None
    assert len(asked) == 2 and engine.table.branches == {}
    assert engine.table.allocator.num_free + len(engine.table.index.idle) >= free


@pytest.mark.parametrize("oracle", ["qwen2-gqa2-tied"], indirect=True)
def test_qwen2_branches_equal_greedy_and_adopting_one_continues(oracle):
    """Drafting ahead on the Qwen2 family (the same 512-token vocabulary), forks inside pages."""
    test_branches_at_every_position_equal_greedy_and_adopting_one_continues(oracle, 42)
