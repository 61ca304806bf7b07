"""The suffix index against a brute-force reference: after any mix of adds, chunked extends, rollbacks and
removals, every substring's count, the number of trie nodes (so removal frees them) and every draft equal
what a direct scan of the stored sequences gives; and examples of what drafts it proposes and why."""

from __future__ import annotations

import math
import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from drafter.sessions.suffix_index import SuffixDraft, SuffixIndex

SPEC_FACTORS = [0.0, 0.5, 1.0, 1.5, 2.0, 4.0]
SPEC_OFFSETS = [-1.0, 0.0, 0.5, 1.0, 3.0]
MIN_TOKEN_PROBS = [0.0, 0.1, 0.3, 0.5, 0.9]


def reference_counts(sequences: list[list[int]], max_depth: int) -> Counter:
    """Occurrences of every substring of 1 to max_depth tokens, each sequence scanned on its own."""
    counts: Counter = Counter()
    for tokens in sequences:
        for start in range(len(tokens)):
            for end in range(start + 1, min(len(tokens), start + max_depth) + 1):
                counts[tuple(tokens[start:end])] += 1
    return counts


def reference_speculate(
    counts: Counter,
    max_depth: int,
    context: list[int],
    max_tokens: int,
    max_spec_factor: float,
    max_spec_offset: float,
    min_token_prob: float,
) -> SuffixDraft:
    """The draft rules, straight from the counts: every match length, greedy by count, best score wins."""
    vocabulary = sorted({key[0] for key in counts})
    best = SuffixDraft([], [], 0.0, 0)
    for match_len in range(1, min(len(context), max_depth - 1) + 1):
        pattern = tuple(context[-match_len:])
        if counts[pattern] == 0:
            break
        limit = min(
            max_tokens, math.floor(max_spec_factor * match_len + max_spec_offset), max_depth - match_len
        )
        tokens, probs, extended, p = [], [], pattern, 1.0
        while len(tokens) < limit:
            followers = [(counts[extended + (t,)], -t) for t in vocabulary if counts[extended + (t,)] > 0]
            if not followers:
                break
            next_count, negated = max(followers)
            step_p = p * (next_count / counts[extended])
            if step_p < min_token_prob:
                break
            p = step_p
            tokens.append(-negated)
            probs.append(p)
            extended += (-negated,)
        if tokens and sum(probs) >= best.score:
            best = SuffixDraft(tokens, probs, sum(probs), match_len)
    return best


def contexts_to_try(rng: random.Random, sequences: list[list[int]], alphabet: int) -> list[list[int]]:
    """Random contexts, and contexts that end with a stored substring (a hit), after random lead-ins."""
    contexts = [[], [rng.randrange(alphabet + 1)]]
    for _ in range(4):
        contexts.append([rng.randrange(alphabet + 1) for _ in range(rng.randrange(1, 12))])
    for tokens in sequences:
        if tokens:
            end = rng.randrange(1, len(tokens) + 1)
            lead_in = [rng.randrange(alphabet + 1) for _ in range(rng.randrange(4))]
            contexts.append(lead_in + tokens[rng.randrange(end) : end])
            contexts.append(tokens[:end])
    return contexts


def check_against_reference(
    index: SuffixIndex, model: dict[int, list[int]], rng: random.Random, alphabet: int
):
    max_depth = index.max_depth
    counts = reference_counts(list(model.values()), max_depth)
    assert index.ids() == list(model)
    assert all(index.sequence(seq_id) == tokens for seq_id, tokens in model.items())
    assert len(index) == sum(map(len, model.values()))
    assert index.num_nodes == len(counts)
    for pattern, expected in counts.items():
        assert index.count(pattern) == expected, pattern
    for _ in range(5):  # patterns that mostly do not occur
        pattern = [rng.randrange(alphabet + 1) for _ in range(rng.randrange(1, max_depth + 1))]
        assert index.count(pattern) == counts[tuple(pattern)]
    for context in contexts_to_try(rng, list(model.values()), alphabet):
        knobs = (
            rng.randrange(9),
            rng.choice(SPEC_FACTORS),
            rng.choice(SPEC_OFFSETS),
            rng.choice(MIN_TOKEN_PROBS),
        )
        expected = reference_speculate(counts, max_depth, context, *knobs)
        assert index.speculate(context, *knobs) == expected, (context, knobs)


def chunk(alphabet: int):
    return st.lists(st.integers(0, alphabet - 1), max_size=10)


@st.composite
def workloads(draw):
    """A max_depth, an alphabet small enough that substrings repeat, and a list of operations."""
    alphabet = draw(st.integers(3, 6))
    slot = st.integers(0, 7)  # which live sequence, modulo how many there are
    operation = st.one_of(
        st.tuples(st.just("add"), chunk(alphabet)),
        st.tuples(st.just("extend"), slot, chunk(alphabet)),
        st.tuples(st.just("extend"), slot, chunk(alphabet)),
        st.tuples(st.just("truncate"), slot, st.integers(0, 30)),
        st.tuples(st.just("remove"), slot),
    )
    return draw(st.integers(1, 8)), alphabet, draw(st.lists(operation, min_size=1, max_size=12))


def apply(index: SuffixIndex, model: dict[int, list[int]], op: tuple) -> None:
    if op[0] == "add":
        model[index.add(op[1])] = list(op[1])
        return
    if not model:
        return
    seq_id = list(model)[op[1] % len(model)]
    if op[0] == "extend":
        index.extend(seq_id, op[2])
        model[seq_id] += op[2]
    elif op[0] == "truncate":
        length = op[2] % (len(model[seq_id]) + 1)
        index.truncate(seq_id, length)
        del model[seq_id][length:]
    else:
        index.remove(seq_id)
        del model[seq_id]


@settings(max_examples=300, deadline=None)
@given(workload=workloads(), seed=st.integers(0, 2**32 - 1))
def test_suffix_index_matches_brute_force_after_every_operation(workload, seed):
    max_depth, alphabet, operations = workload
    rng = random.Random(seed)
    index, model = SuffixIndex(max_depth), {}
    for op in operations:
        apply(index, model, op)
        check_against_reference(index, model, rng, alphabet)
    for seq_id in list(model):
        index.remove(seq_id)
    assert index.num_nodes == 0 and len(index) == 0 and index.ids() == []


@settings(max_examples=60, deadline=None)
@given(
    max_depth=st.integers(2, 8),
    tokens=st.lists(st.integers(0, 2), min_size=1, max_size=60),
    seed=st.integers(0, 2**32 - 1),
)
def test_suffix_index_drafts_like_the_reference_on_long_repetitive_sequences(max_depth, tokens, seed):
    # Three token values over up to 60 tokens: long runs of equal counts, where match lengths share a walk.
    index = SuffixIndex(max_depth)
    index.add(tokens)
    check_against_reference(index, {0: tokens}, random.Random(seed), 3)


def test_suffix_index_drafts_a_repeated_phrase():
    index = SuffixIndex()
    index.add([10, 11, 12, 13, 14, 15])
    draft = index.speculate([99, 10, 11, 12], max_tokens=8)
    # The 3-token match earns a 3-token draft (max_spec_factor 1.0), each token certain.
    assert draft == SuffixDraft([13, 14, 15], [1.0, 1.0, 1.0], 3.0, 3)


def test_suffix_index_min_token_prob_cuts_the_draft():
    index = SuffixIndex()
    index.add([1, 2, 3, 7])
    index.add([1, 2, 3, 8])
    # After 1 2 3 the two endings are equally likely: 0.5 each, the smaller id first.
    assert index.speculate([1], 8, max_spec_factor=4.0, min_token_prob=0.4).tokens == [2, 3, 7]
    assert index.speculate([1], 8, max_spec_factor=4.0, min_token_prob=0.6).tokens == [2, 3]


def test_suffix_index_spec_factor_times_match_len_caps_the_length():
    index = SuffixIndex()
    index.add(list(range(1, 11)))
    assert index.speculate([1, 2], 16, max_spec_factor=1.0).tokens == [3, 4]
    assert index.speculate([1, 2], 16, max_spec_factor=2.0).tokens == [3, 4, 5, 6]
    assert index.speculate([1, 2], 3, max_spec_factor=2.0).tokens == [3, 4, 5]  # max_tokens caps it too
    assert index.speculate([1, 2], 16, max_spec_factor=0.0, max_spec_offset=1.0).tokens == [3]


def test_suffix_index_counts_of_two_sequences_add_up_but_never_across_them():
    index = SuffixIndex()
    index.add([1, 2, 1])
    index.add([2, 1])
    assert index.count([1]) == 3
    assert index.count([2, 1]) == 2
    assert index.count([1, 2]) == 1  # not the end of one and the start of the next
    assert len(index) == 5


def test_suffix_index_rollback_forgets_what_was_removed():
    index = SuffixIndex()
    seq_id = index.add([1, 2, 3])
    assert index.speculate([1], 4, max_spec_factor=2.0).tokens == [2, 3]
    index.truncate(seq_id, 1)
    index.extend(seq_id, [5, 6])
    assert index.speculate([1], 4, max_spec_factor=2.0).tokens == [5, 6]
    assert index.count([2]) == 0 and index.count([3]) == 0
    assert index.sequence(seq_id) == [1, 5, 6] and index.ids() == [seq_id]


def test_suffix_index_remove_gives_every_node_back():
    index = SuffixIndex(max_depth=24)
    rng = random.Random(0)
    kept = index.add([rng.randrange(50) for _ in range(300)])
    nodes = index.num_nodes
    gone = index.add([rng.randrange(50) for _ in range(2000)])
    index.remove(gone)
    assert index.num_nodes == nodes and index.ids() == [kept]
    index.remove(kept)
    assert index.num_nodes == 0 and len(index) == 0


def test_suffix_index_misses_give_the_empty_draft():
    index = SuffixIndex()
    assert index.speculate([1, 2, 3], 8) == SuffixDraft([], [], 0.0, 0)
    index.add([1, 2, 3])
    assert index.speculate([4], 8) == SuffixDraft([], [], 0.0, 0)
    assert index.speculate([1], 0) == SuffixDraft([], [], 0.0, 0)
    assert index.speculate([], 8) == SuffixDraft([], [], 0.0, 0)


def test_suffix_index_rejects_bad_arguments():
    with pytest.raises(ValueError, match="max_depth"):
        SuffixIndex(max_depth=0)
    index = SuffixIndex()
    seq_id = index.add([1, 2])
    with pytest.raises(ValueError, match="max_tokens"):
        index.speculate([1], -1)
    with pytest.raises(ValueError):
        index.truncate(seq_id, 3)
    for call in (
        index.sequence,
        index.remove,
        lambda bad: index.extend(bad, [1]),
        lambda bad: index.truncate(bad, 0),
    ):
        with pytest.raises(KeyError):
            call(seq_id + 1)
