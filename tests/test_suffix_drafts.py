"""The server's suffix drafts (drafter/sessions/suffix_drafts.py) against the brute-force reference of
tests/test_suffix_index.py: a session's lookup is the best of the reference over its own context and the
reference over the responses the global index should hold, as contexts grow, roll back, share content
between sessions and are evicted; and the rules on whose text a lookup may read."""

from __future__ import annotations

import random

import numpy as np
import pytest

from drafter.sessions.suffix_drafts import SuffixDrafts, SuffixRules
from drafter.sessions.suffix_index import SuffixDraft
from tests.test_suffix_index import reference_counts, reference_speculate

RULES = SuffixRules(max_depth=8, max_spec_factor=2.0, max_spec_offset=1.0, min_token_prob=0.1)
MAX_TOKENS = 6


def reference(
    local: list[int] | None,
    responses: list[list[int]],
    context: list[int],
    rules: SuffixRules = RULES,
    max_tokens: int = MAX_TOKENS,
) -> SuffixDraft:
    """The best draft of the session's own context (if it may be read) and the global responses; the
    local one wins a tie, as the store's lookup does."""
    args = (context, max_tokens, rules.max_spec_factor, rules.max_spec_offset, rules.min_token_prob)
    best = SuffixDraft([], [], 0.0, 0)
    if local:
        best = reference_speculate(reference_counts([local], rules.max_depth), rules.max_depth, *args)
    responses = [tokens for tokens in responses if tokens]
    if responses:
        found = reference_speculate(reference_counts(responses, rules.max_depth), rules.max_depth, *args)
        if found.score > best.score:
            best = found
    return best


def settle(store: SuffixDrafts) -> None:
    while store.work(budget_s=1.0):
        pass
    assert store.pending_tokens == 0


def array(tokens: list[int]) -> np.ndarray:
    return np.asarray(tokens, dtype=np.int64)


def random_tokens(rng: random.Random, n: int, alphabet: int = 5) -> list[int]:
    return [rng.randrange(alphabet) for _ in range(n)]


def assert_lookups(store, session, local, responses, rng, trusted=True):
    """Lookups for the stored context itself, its prefixes and random tails all equal the reference."""
    contexts = [local, local[: len(local) // 2], local + random_tokens(rng, 3)]
    contexts += [random_tokens(rng, rng.randrange(1, 9)) for _ in range(4)]
    for context in contexts:
        if not context:
            continue
        got = store.lookup(session, array(context), MAX_TOKENS, trusted)
        readable = local if trusted or context[: len(local)] == local else None
        expected = reference(readable, responses, context)
        assert (got.tokens, got.match_len) == (expected.tokens, expected.match_len), context
        assert got.score == pytest.approx(expected.score), (got, expected, context)


@pytest.mark.parametrize("seed", range(6))
def test_growth_and_rollback_equal_the_reference(seed):
    rng = random.Random(seed)
    store = SuffixDrafts(RULES, local_tokens=10_000, global_tokens=10_000)
    context = random_tokens(rng, rng.randrange(5, 40))
    prompt_len = len(context)  # the first call's context: what the global index leaves out
    for call in range(8):
        if call and rng.random() < 0.3:  # a rollback: the target went back, then on another way
            context = context[: rng.randrange(len(context))]
        if call:
            context += random_tokens(rng, rng.randrange(1, 12))
        store.update("a", array(context))
        settle(store)
        response = context[prompt_len:]  # by position: what comes after the first call's context
        assert_lookups(store, "a", context, [response] if response else [], rng)


def test_two_sessions_share_responses_not_prompts():
    rng = random.Random(7)
    store = SuffixDrafts(RULES, local_tokens=10_000, global_tokens=10_000)
    prompt_a, prompt_b = random_tokens(rng, 20, 50), random_tokens(rng, 20, 50)
    answer_a = random_tokens(rng, 12, 50)
    store.update("a", array(prompt_a))
    store.update("a", array(prompt_a + answer_a))
    store.update("b", array(prompt_b))
    settle(store)
    # b drafts a's answer from the global index when its tail matches it...
    got = store.lookup("b", array(prompt_b + answer_a[:4]), MAX_TOKENS, trusted=True)
    assert got == reference(prompt_b, [answer_a], prompt_b + answer_a[:4])
    assert got.tokens and got.tokens[0] == answer_a[4]
    # ...but never a's prompt, which only a's own index holds.
    got = store.lookup("b", array(prompt_b + prompt_a[:6]), MAX_TOKENS, trusted=True)
    assert got == reference(prompt_b, [answer_a], prompt_b + prompt_a[:6])
    assert store.lookup("a", array(prompt_a[:6]), MAX_TOKENS, trusted=True).tokens


def test_global_index_evicts_the_oldest_responses():
    rng = random.Random(3)
    store = SuffixDrafts(RULES, local_tokens=10_000, global_tokens=40)
    responses = {}
    for name in "abcd":
        prompt, answer = random_tokens(rng, 10, 6), random_tokens(rng, 15, 6)
        store.update(name, array(prompt))
        store.update(name, array(prompt + answer))
        settle(store)
        responses[name] = answer
    # 4 x 15 tokens against a cap of 40: a and b went, oldest first.
    assert len(store.global_index) == 30 and store.num_global_evicted == 2
    for context in ([1, 2], responses["a"][:5], responses["c"][:5], responses["d"][-3:]):
        got = store.lookup(None, array(context), MAX_TOKENS, trusted=False)
        assert got == reference(None, [responses["c"], responses["d"]], context)


def test_local_cap_drops_the_least_recently_updated_session():
    store = SuffixDrafts(RULES, local_tokens=50, global_tokens=0)
    for name in "abc":
        store.update(name, array([1, 2, 3] * 8))  # 24 tokens each
        settle(store)
    assert list(store.conversations) == ["b", "c"] and store.num_local == 48
    assert store.lookup("a", array([1, 2]), MAX_TOKENS, trusted=True).tokens == []  # gone, no global index
    assert store.lookup("c", array([1, 2]), MAX_TOKENS, trusted=True).tokens


def test_drop_frees_the_session_index_and_keeps_its_response():
    store = SuffixDrafts(RULES, local_tokens=1000, global_tokens=1000)
    store.update("a", array([5, 6, 7, 8]))
    store.update("a", array([5, 6, 7, 8, 1, 2, 3, 4]))
    settle(store)
    store.drop("a")
    assert store.num_local == 0 and "a" not in store.conversations
    assert store.lookup("x", array([1, 2]), MAX_TOKENS, trusted=False).tokens == [3, 4]  # its response
    assert store.lookup("x", array([5, 6]), MAX_TOKENS, trusted=False).tokens == []  # its prompt is gone


def test_a_full_context_call_reads_a_session_index_only_when_it_sent_that_text():
    store = SuffixDrafts(RULES, local_tokens=1000, global_tokens=0)
    secret = [9, 8, 7, 6, 5, 4, 3, 2]
    store.update("a", array(secret))
    settle(store)
    probe, resent = [9, 8, 7], secret + [9, 8]
    assert store.lookup("a", array(probe), MAX_TOKENS, trusted=False).tokens == []  # names it, never sent it
    assert store.lookup("a", array(resent), MAX_TOKENS, trusted=False) == reference(secret, [], resent)
    assert store.lookup("a", array(probe), MAX_TOKENS, trusted=True) == reference(secret, [], probe)
    assert reference(secret, [], probe).tokens  # so the first lookup's empty draft was a refusal


def test_indexing_runs_in_slices_and_a_lookup_meanwhile_sees_a_prefix():
    rng = random.Random(11)
    store = SuffixDrafts(RULES, local_tokens=10_000, global_tokens=0)
    context = random_tokens(rng, 200, 4)
    store.update("a", array(context))
    assert store.pending_tokens == 200
    slices = 0
    while store.work(budget_s=0.0):  # one chunk a slice
        slices += 1
        indexed = store.conversations["a"].indexed
        assert 0 < indexed < 200 and store.pending_tokens == 200 - indexed
        got = store.lookup("a", array(context), MAX_TOKENS, trusted=True)
        assert got == reference(context[:indexed], [], context)
    assert slices >= 10 and store.pending_tokens == 0


def test_a_long_rollback_restarts_the_session_index_and_leaves_the_old_response():
    """Undoing hundreds of tokens in place would hold up the call; the index starts again instead."""
    rng = random.Random(19)
    store = SuffixDrafts(RULES, local_tokens=10_000, global_tokens=10_000)
    first = random_tokens(rng, 50)
    answered = first + random_tokens(rng, 350)
    store.update("a", array(first))
    store.update("a", array(answered))
    settle(store)
    regenerated = answered[:60] + random_tokens(rng, 40)
    store.update("a", array(regenerated))
    assert store.num_local == 0 and store.conversations["a"].indexed == 0  # nothing undone on the call's path
    settle(store)
    assert store.conversations["a"].local.sequence(0) == regenerated
    old_response, new_response = answered[50:], regenerated[60:]
    assert sorted(map(store.global_index.sequence, store.global_index.ids())) == sorted(
        [old_response, new_response]
    )
    assert_lookups(store, "a", regenerated, [old_response, new_response], rng)


def test_updates_coalesce_and_undo_only_what_changed():
    store = SuffixDrafts(RULES, local_tokens=1000, global_tokens=1000)
    store.update("a", array([1, 2, 3, 4]))
    store.update("a", array([1, 2, 3, 4, 5, 6]))  # before any work: one job, the newest context
    settle(store)
    assert store.conversations["a"].local.sequence(0) == [1, 2, 3, 4, 5, 6]
    store.update("a", array([1, 2, 9]))  # a rollback is undone at once, before any lookup
    assert store.conversations["a"].local.sequence(0) == [1, 2]
    assert store.global_index.sequence(store.conversations["a"].global_seq) == []
    settle(store)
    assert store.conversations["a"].local.sequence(0) == [1, 2, 9]
