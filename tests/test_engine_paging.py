"""The paged KV cache: pages shared by content, divergence inside and at page boundaries, eviction under a
budget, long contexts in a small pool, and both attention paths — drafts always equal transformers'."""

from __future__ import annotations

import numpy as np
import pytest

from engine.cache.prefix_index import PrefixIndex
from engine.config import ConfigError, EngineConfig
from engine.engine import Engine
from engine.requests import DraftRequest
from tests.oracle import hf_greedy

PAGE = 16


def paged_engine(directory, **overrides) -> Engine:
    config = dict(max_seq_len=512, max_batch_size=4, max_draft_tokens=8, page_size=PAGE, kv_cache_tokens=2048)
    return Engine.load(str(directory), EngineConfig(**(config | overrides)))


@pytest.fixture(scope="module")
def oracle(hf_checkpoint, request):
    return hf_checkpoint(getattr(request, "param", "gqa2-untied"))  # a test may name another (indirect)


def context_of(seed: int, length: int, vocab: int = 512) -> list[int]:
    return np.random.default_rng(seed).integers(0, vocab, length).tolist()


@pytest.mark.parametrize("attention", ["sdpa", "flex"])
@pytest.mark.parametrize("split", [32, 40, 47, 48])  # at a page boundary, inside a page, its last token
def test_conversations_sharing_a_prefix_diverge_anywhere(oracle, attention, split):
    model, directory = oracle
    engine = paged_engine(directory, attention=attention)
    shared = context_of(1, 64)
    a, b = shared + context_of(2, 20), shared[:split] + context_of(3, 25)
    for _ in range(3):  # each writes past the shared part, then both grow
        for name, context in (("a", a), ("b", b)):
            result = engine.draft_batch([DraftRequest(context, 6)])[0]
            assert result.tokens == hf_greedy(model, context, 6), (name, split)
            grown = context + result.tokens[:2] + [7]
            a, b = (grown, b) if name == "a" else (a, grown)
    assert engine.table.counters.shared_tokens >= split // PAGE * PAGE


def test_a_shared_prefix_is_prefilled_once(oracle):
    model, directory = oracle
    engine = paged_engine(directory, max_seq_len=2400, kv_cache_tokens=4 * 2400)
    prefix = context_of(4, 2048)
    suffixes = [context_of(10 + i, 30 + i) for i in range(4)]
    first = engine.draft_batch([DraftRequest(prefix + suffixes[0], 4)])[0]
    assert first.prefilled == 2048 + 30 and first.shared == 0
    for suffix in suffixes[1:]:
        result = engine.draft_batch([DraftRequest(prefix + suffix, 4)])[0]
        assert (result.prefilled, result.cached, result.shared) == (len(suffix), 2048, 2048)
    assert engine.stats.tokens_prefilled == 2048 + sum(map(len, suffixes))
    context = prefix + suffixes[-1]
    assert engine.draft(context, 4) == hf_greedy(model, context, 4)


def test_more_conversations_than_the_budget_holds_evict_and_stay_correct(oracle):
    model, directory = oracle
    engine = paged_engine(directory, max_seq_len=256, kv_cache_tokens=2 * 272)  # two 256-token sequences
    contexts = [context_of(20 + i, 200) for i in range(5)]
    for _ in range(2):
        for i, context in enumerate(contexts):
            result = engine.draft_batch([DraftRequest(context, 5, f"c{i}")])[0]
            assert result.tokens == hf_greedy(model, context, 5)
            contexts[i] = context + result.tokens[:1] + [3]
    assert engine.table.counters.evicted_sequences >= 5
    assert engine.table.allocator.num_free + engine.table.pages_in_use + len(engine.table.index.idle) == 34


def test_a_batch_mixing_short_and_long_contexts(oracle):
    model, directory = oracle
    engine = paged_engine(directory)
    contexts = [context_of(30, 450), context_of(31, 3), context_of(32, 65), [5]]
    results = engine.draft_batch([DraftRequest(c, 8) for c in contexts])
    for context, result in zip(contexts, results, strict=True):
        assert result.tokens == hf_greedy(model, context, 8)


def test_a_batch_that_does_not_fit_together_is_drafted_in_parts(oracle):
    model, directory = oracle
    engine = paged_engine(directory, max_seq_len=256, kv_cache_tokens=272)  # one sequence at a time
    contexts = [context_of(40 + i, 200) for i in range(3)]
    results = engine.draft_batch([DraftRequest(c, 5) for c in contexts])
    for context, result in zip(contexts, results, strict=True):
        assert result.tokens == hf_greedy(model, context, 5)


def test_a_32k_context_beside_twenty_short_ones_in_a_40k_budget():
    # Two 32k prefills on the tiny preset (~10 s on a quiet 2-core CPU); 40k positions could hold only one
    # conversation of a slot-per-conversation cache sized for 32k.
    config = EngineConfig(
        max_seq_len=32 * 1024 + 64, max_batch_size=1, max_draft_tokens=8, kv_cache_tokens=40_000
    )
    engine, fresh = Engine.load("tiny", config), Engine.load("tiny", config)
    long = context_of(50, 32 * 1024, vocab=1024)
    assert engine.draft_batch([DraftRequest(long, 8)])[0].prefilled == len(long)
    for i in range(20):
        short = context_of(60 + i, 200, vocab=1024)
        fresh.reset_cache()
        assert engine.draft(short, 8) == fresh.draft(short, 8)
    grown = long + [1, 2]
    result = engine.draft_batch([DraftRequest(grown, 8)])[0]
    assert result.cached == len(long) and engine.table.counters.evicted_sequences == 0
    fresh.reset_cache()
    assert result.tokens == fresh.draft(grown, 8)


def test_a_budget_below_one_request_is_refused_with_the_flag_to_change():
    with pytest.raises(ConfigError, match="--kv-cache-gb"):
        Engine.load("tiny", EngineConfig(max_seq_len=4096, kv_cache_tokens=1000))


def test_prefix_index_never_trusts_a_key_alone():
    index = PrefixIndex(num_pages=8, page_size=4, max_pages_per_seq=4)
    tokens = np.arange(12)
    index.record([1, 2, 3], tokens, 0)
    assert index.match(tokens, 3) == [1, 2, 3]
    assert index.match(np.concatenate([tokens[:8], [99, 99, 99, 99]]), 3) == [1, 2]
    index.tokens[2, 0] = 77  # a page whose contents no longer match its key (as a collision would)
    assert index.match(tokens, 3) == [1]
    index.parent[1] = 5  # computed after another page than the one matched before it
    assert index.match(tokens, 3) == []


def test_never_written_memory_is_never_read_as_nan(oracle):
    model, directory = oracle
    engine = paged_engine(directory)
    for layer in (*engine.pool.k, *engine.pool.v):
        layer[engine.config.page_size :] = float("nan")  # what uninitialised memory may hold
    context = context_of(70, 50)
    for _ in range(3):
        drafts = engine.draft(context, 8)
        assert drafts == hf_greedy(model, context, 8)
        context = context + drafts[:5] + [1]


def test_a_conversation_that_rolls_back_grows_again_on_consecutive_pages(oracle):
    """A rollback releases full pages (idle in the prefix index, findable by content); the conversation
    (named by its session) takes them back as it grows again, so the CPU path keeps reading one view
    instead of gathering a copy every step."""
    from engine.prefill import contiguous

    model, directory = oracle
    engine = paged_engine(directory, max_draft_tokens=16)
    context = context_of(81, 60)
    for _ in range(4):  # the target accepts every draft
        context = context + engine.draft(context, 16, "conv") + [3]
    context = context[:-40] + [1, 2]  # then goes back 40 tokens and elsewhere
    for _ in range(3):
        context = context + engine.draft(context, 16, "conv") + [4]
    sequence = engine.table.by_session["conv"]
    assert contiguous(sequence.pages, len(sequence.tokens), PAGE) is not None
    assert engine.draft(context, 8) == hf_greedy(model, context, 8)


def test_new_runs_leave_the_largest_gap_whole_for_long_contexts():
    """Conversations of 2k, 8k and then 32k positions (64-position pages) each get consecutive pages."""
    from engine.cache.allocator import PageAllocator

    allocator = PageAllocator(1024)
    runs = [allocator.take(count, after=None) for count in (33, 129, 513)]
    assert all(run == list(range(run[0], run[0] + len(run))) for run in runs)
    assert runs[1][0] - runs[0][-1] > 1  # the run before keeps room to grow


@pytest.mark.parametrize("oracle", ["qwen2-gqa2-tied"], indirect=True)
def test_qwen2_conversations_sharing_a_prefix_diverge_inside_a_page(oracle):
    """The Qwen2 family on shared pages (the same 512-token vocabulary): its biased keys are cached as is.
    (SDPA only: FlexAttention reads the same pages whatever the family, and costs a compile here.)"""
    test_conversations_sharing_a_prefix_diverge_anywhere(oracle, "sdpa", 40)
