"""KV-cache reuse across calls and batched drafting change nothing but the work done."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.config import EngineConfig
from engine.engine import Engine
from engine.requests import DraftError, DraftRequest
from tests.oracle import hf_greedy

VOCAB = 512  # of the "gqa2-untied" oracle model


@pytest.fixture(scope="module")
def engines(hf_checkpoint):
    model, directory = hf_checkpoint("gqa2-untied")
    # A pool of 1,024 positions in 16-position pages: two 300-token conversations and their drafts
    # fit, four do not, so the hypothesis runs below evict, share pages and cross page boundaries.
    config = EngineConfig(
        max_seq_len=512, max_batch_size=2, max_draft_tokens=8, page_size=16, kv_cache_tokens=1024
    )
    return model, Engine.load(str(directory), config), Engine.load(str(directory), config)


def fresh_draft(engine: Engine, tokens, k) -> list[int]:
    """What an engine with an empty cache answers."""
    engine.reset_cache()
    return engine.draft(tokens, k)


call = st.tuples(
    st.integers(0, 3),  # conversation
    st.sampled_from(["accept", "diverge", "restart"]),
    st.integers(0, 8),  # drafts accepted / tokens kept
    st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=12),  # new tokens
    st.integers(1, 8),  # num_draft_tokens
    st.booleans(),  # send the session hint
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(calls=st.lists(call, min_size=1, max_size=8))
def test_reuse_drafts_equal_a_fresh_engine_and_transformers(engines, calls):
    model, engine, reference = engines
    contexts: dict[int, list[int]] = {}
    last_draft: dict[int, list[int]] = {}
    for conversation, action, keep, new, k, hint in calls:
        context = contexts.get(conversation, [])
        if action == "accept":  # the target kept `keep` drafts and added tokens of its own
            context = context + last_draft.get(conversation, [])[:keep] + new
        elif action == "diverge":  # a branch from an earlier point of the conversation
            context = context[: keep * 5] + new
        else:
            context = new
        context = context[-300:]
        session = f"conv-{conversation}" if hint else None
        ours = engine.draft_batch([DraftRequest(context, k, session)])[0].tokens
        assert ours == fresh_draft(reference, context, k)
        assert ours == hf_greedy(model, context, k)
        contexts[conversation], last_draft[conversation] = context, ours


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    batch=st.lists(
        st.tuples(
            st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=200),
            st.integers(1, 8),
            st.sampled_from([None, "a", "b"]),
        ),
        min_size=1,
        max_size=2,
    )
)
def test_batched_drafts_equal_one_at_a_time(engines, batch):
    _, engine, reference = engines
    requests = [DraftRequest(tokens, k, session) for tokens, k, session in batch]
    batched = engine.draft_batch(requests)
    for request, result in zip(requests, batched, strict=True):
        assert result.tokens == fresh_draft(reference, request.tokens, request.num_draft_tokens)
        assert len(result.probs) == request.num_draft_tokens
        assert all(0.0 < p <= 1.0 for p in result.probs)


def test_batch_of_identical_requests_uses_distinct_sequences(engines):
    model, engine, _ = engines
    context = list(range(30))
    first, second = engine.draft_batch([DraftRequest(context, 5, "same"), DraftRequest(context, 5, "same")])
    assert first.tokens == second.tokens == hf_greedy(model, context, 5)


def test_reuse_prefills_only_new_tokens_whatever_the_context_length():
    engine = Engine.load("tiny", EngineConfig(max_seq_len=4096, max_batch_size=1))
    rng = np.random.default_rng(0)
    context = rng.integers(0, 1024, 3000).tolist()
    result = engine.draft_batch([DraftRequest(context, 8)])[0]
    assert result.cached == 0 and result.prefilled == 3000
    for _ in range(10):  # the target accepts 3 drafts and adds one token of its own
        context = context + result.tokens[:3] + [int(rng.integers(0, 1024))]
        result = engine.draft_batch([DraftRequest(context, 8)])[0]
        assert result.prefilled <= 2, "only the target's own token (and at most one rejected draft) is new"
        assert result.cached == len(context) - result.prefilled


def test_sessions_keep_their_pages_and_lru_evicts():
    # 3 pages of 16 positions beside scratch: one 40-token conversation and its drafts fill them.
    engine = Engine.load(
        "tiny",
        EngineConfig(max_seq_len=44, max_batch_size=1, max_draft_tokens=4, page_size=16, kv_cache_tokens=48),
    )
    a, b = ([i] * 20 + list(range(15)) for i in (1, 2))
    engine.draft(a, 4, "a")
    assert engine.draft_batch([DraftRequest(a + [7], 4, "a")])[0].cached == len(a)
    result = engine.draft_batch([DraftRequest(b, 4, "b")])[0]  # no room beside a: evicts it
    assert result.evicted and result.cached == 0
    assert engine.table.counters.evicted_sequences == 1
    assert engine.draft_batch([DraftRequest(b + [7], 4, "b")])[0].cached == len(b)
    assert engine.draft_batch([DraftRequest(a + [7, 8], 4, "a")])[0].cached == 0


def test_too_many_requests_in_a_batch_are_refused(engines):
    _, engine, _ = engines
    with pytest.raises(DraftError, match="1 to 2 requests"):
        engine.draft_batch([DraftRequest([1], 1)] * 3)


def test_one_bad_request_refuses_the_batch_before_touching_the_cache(engines):
    model, engine, _ = engines
    context = list(range(50))
    engine.draft(context, 4)
    held = [(s.tokens.copy(), list(s.pages)) for s in engine.table.sequences]
    with pytest.raises(DraftError):
        engine.draft_batch([DraftRequest(context + [1], 4), DraftRequest([VOCAB], 4)])
    after = [(s.tokens, s.pages) for s in engine.table.sequences]
    assert len(after) == len(held)
    assert all((t == u).all() and p == q for (t, p), (u, q) in zip(held, after, strict=True))
    assert engine.draft(context + [1], 4) == hf_greedy(model, context + [1], 4)


def test_a_failure_mid_draft_does_not_corrupt_the_cache(engines):
    model, engine, _ = engines
    context = list(range(80))
    engine.draft(context, 8)
    calls = []

    def fail_on_decode(module, args):
        calls.append(1)
        if len(calls) == 2:  # after the prefill wrote new positions, during the decode loop
            raise RuntimeError("simulated device failure")

    handle = engine.model.register_forward_pre_hook(fail_on_decode)
    with pytest.raises(RuntimeError, match="simulated"):
        engine.draft(context[:40] + [5, 6, 7], 8)
    handle.remove()
    for tokens in (context[:40] + [5, 6, 7], context + [9]):
        assert engine.draft(tokens, 8) == hf_greedy(model, tokens, 8)


@pytest.mark.parametrize("sessions", [True, False])
@pytest.mark.parametrize("kind", ["prefix", "prefix and its own", "identical"])
def test_a_context_that_is_a_prefix_of_another_conversation_never_takes_its_cache(
    hf_checkpoint, sessions, kind
):
    """Conversation B posts A's first 100 tokens, or those and 20 of its own, or A's whole context (parallel
    samples, retries, best-of-n): it shares A's full pages by content and computes only its partial page (a
    sessionless repeat of A's exact context continues A's sequence, whose contents it leaves the same); A's
    next call still finds its whole context and the drafts fed back (the fault: a B of A's first 100 took A's
    sequence over, and A fell to 100 cached tokens of 302)."""
    model, directory = hf_checkpoint("gqa2-untied")
    engine = Engine.load(
        str(directory),
        EngineConfig(max_seq_len=512, max_batch_size=2, max_draft_tokens=8, kv_cache_tokens=4096),
    )
    page = engine.config.page_size
    rng = np.random.default_rng(len(kind) + sessions)
    a = rng.integers(0, VOCAB, 300).tolist()
    b = {
        "prefix": a[:100],
        "prefix and its own": a[:100] + rng.integers(0, VOCAB, 20).tolist(),
        "identical": a,
    }[kind]
    name_a, name_b = ("A", "B") if sessions else (None, None)
    [first] = engine.draft_batch([DraftRequest(a, 8, name_a)])
    assert first.tokens == hf_greedy(model, a, 8)
    [other] = engine.draft_batch([DraftRequest(b, 8, name_b)])
    assert other.tokens == hf_greedy(model, b, 8)
    takes_over = kind == "identical" and not sessions  # a sessionless retry: A's own sequence, unchanged
    assert other.cached == (len(b) - 1 if takes_over else (len(b) - 1) // page * page)
    a = a + first.tokens[:2] + [int(rng.integers(VOCAB))]  # the target kept 2 drafts and added its own
    [again] = engine.draft_batch([DraftRequest(a, 8, name_a)])
    assert again.tokens == hf_greedy(model, a, 8)
    assert again.cached == 302 and again.prefilled == 1
    b = b + other.tokens[:1] + [int(rng.integers(VOCAB))]
    [b_again] = engine.draft_batch([DraftRequest(b, 8, name_b)])
    assert b_again.tokens == hf_greedy(model, b, 8)
    # B's own sequence, continued; a sessionless B that shared A's went on past it: its full pages remain
    assert b_again.cached == ((len(b) - 1) // page * page if takes_over else len(b) - 1)


def test_a_sessionless_retry_of_the_same_context_reuses_its_sequence(engines):
    """A client (or the startup cost probe) posting one context again continues its sequence: nothing is
    prefilled again and no copy of the conversation piles up in the pool."""
    _, engine, _ = engines
    engine.reset_cache()
    context = list(range(1, 41))
    results = [engine.draft_batch([DraftRequest(context, 4)])[0] for _ in range(4)]
    assert [r.prefilled for r in results] == [40, 1, 1, 1] and len(engine.table.sequences) == 1
    assert len({tuple(r.tokens) for r in results}) == 1
