"""A depth-limited suffix trie with occurrence counts over token sequences, and the greedy draft it proposes
for a context: what earlier text went on to say after the context's tail, as in SuffixDecoding (Oliaro et
al., NeurIPS 2025) and Snowflake arctic-inference's suffix cache.

Every substring of a stored sequence with 1 to `max_depth` tokens is a trie node that counts the positions
where it occurs (within one sequence, never across two sequences' boundary). Sequences grow one chunk at a
time (`extend`, O(tokens * max_depth): each sequence keeps the nodes of its own suffixes, so a new token only
steps each of them down one edge), shrink on a rollback (`truncate`) and go away (`remove`), which deletes
the nodes nothing counts any more, so memory follows what is stored.

`speculate` tries every tail of the context that the trie holds (match length m = 1, 2, ...), drafts from
each by always taking the most frequent next token while the running probability (the product of count
ratios) stays above `min_token_prob`, and keeps the draft with the highest expected number of accepted
tokens (the sum of its probabilities), preferring longer matches on a tie.

Where it stops: one draft chain, not arctic-inference's tree of drafts; no eviction policy (the caller
decides what to `remove`); no per-request prompt trie beside the global one; not thread-safe. Pure Python,
standard library only.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

NO_CHILDREN: dict = {}  # shared by every childless node, never written: most nodes are leaves, and a dict
# apiece would double the index's memory and the garbage collector's work


class _Node:
    """One substring: how often it occurs, the token that ends it, its length (`depth`), its one-token
    extensions (`children`), and the most frequent of them (`best`: max count, then smallest token id),
    kept current so a draft step is one attribute read."""

    __slots__ = ("count", "token", "depth", "children", "best")

    def __init__(self, token: int, depth: int) -> None:
        self.count = 0
        self.token = token
        self.depth = depth
        self.children: dict[int, _Node] = NO_CHILDREN
        self.best: _Node | None = None


def _beats(child: _Node, best: _Node | None) -> bool:
    """Whether `child` should be its parent's best child instead of `best`."""
    return (
        best is None or child.count > best.count or (child.count == best.count and child.token < best.token)
    )


def _best_child(node: _Node) -> _Node | None:
    best = None
    for child in node.children.values():
        if _beats(child, best):
            best = child
    return best


class _Sequence:
    """A stored sequence: its tokens and its active nodes, the trie nodes of its suffixes shorter than
    `max_depth` (the root first, then by increasing depth): the ones the next token extends."""

    __slots__ = ("tokens", "active")

    def __init__(self, root: _Node) -> None:
        self.tokens: list[int] = []
        self.active: list[_Node] = [root]


@dataclass(frozen=True, slots=True)
class SuffixDraft:
    """A proposed continuation: its tokens, each one's probability of being reached (the product of count
    ratios up to it), their sum `score` (the expected number of accepted tokens), and how many of the
    context's last tokens it was matched on."""

    tokens: list[int]
    probs: list[float]
    score: float
    match_len: int


class _Chain:
    """The greedy walk from one node, grown on demand: while consecutive match lengths have the same count
    their subtrees hold the same counts (see `speculate`), so they share one chain."""

    __slots__ = ("node", "tokens", "probs", "p", "done")

    def __init__(self, node: _Node) -> None:
        self.node = node  # where the walk goes on from
        self.tokens: list[int] = []
        self.probs: list[float] = []
        self.p = 1.0
        self.done = False  # stopped for good: no children, or below min_token_prob

    def grow_to(self, length: int, min_token_prob: float) -> None:
        node, tokens, probs, p = self.node, self.tokens, self.probs, self.p
        while len(tokens) < length:
            child = node.best
            if child is None:
                self.done = True
                break
            step_p = p * (child.count / node.count)
            if step_p < min_token_prob:
                self.done = True
                break
            p = step_p
            tokens.append(child.token)
            probs.append(p)
            node = child
        self.node, self.p = node, p


class SuffixIndex:
    """Suffix trie over several token sequences, each named by the int id `add` hands out."""

    def __init__(self, max_depth: int = 24) -> None:
        if max_depth < 1:
            raise ValueError(f"max_depth must be at least 1, got {max_depth}")
        self._max_depth = max_depth
        self._root = _Node(-1, 0)
        self._sequences: dict[int, _Sequence] = {}
        self._next_id = 0
        self._num_tokens = 0
        self._num_nodes = 0

    @property
    def max_depth(self) -> int:
        return self._max_depth

    @property
    def num_nodes(self) -> int:
        """Nodes in the trie, the root not counted."""
        return self._num_nodes

    def __len__(self) -> int:
        """Tokens stored, over all sequences."""
        return self._num_tokens

    def ids(self) -> list[int]:
        """Live sequence ids, oldest first."""
        return list(self._sequences)

    def sequence(self, seq_id: int) -> list[int]:
        return list(self._get(seq_id).tokens)

    def sequence_len(self, seq_id: int) -> int:
        return len(self._get(seq_id).tokens)

    def add(self, tokens: Iterable[int] = ()) -> int:
        seq_id = self._next_id
        self._next_id += 1
        self._sequences[seq_id] = _Sequence(self._root)
        self.extend(seq_id, tokens)
        return seq_id

    def extend(self, seq_id: int, tokens: Iterable[int]) -> None:
        seq = self._get(seq_id)
        for token in tokens:
            self._append(seq, token)

    def truncate(self, seq_id: int, length: int) -> None:
        """Keep the first `length` tokens (a rollback): forget every occurrence that ended past them."""
        seq = self._get(seq_id)
        if not 0 <= length <= len(seq.tokens):
            raise ValueError(f"cannot truncate a sequence of {len(seq.tokens)} tokens to {length}")
        self._uncount(seq.tokens, length)
        self._num_tokens -= len(seq.tokens) - length
        del seq.tokens[length:]
        seq.active = self._suffix_nodes(seq.tokens)

    def remove(self, seq_id: int) -> None:
        seq = self._get(seq_id)
        self._uncount(seq.tokens, 0)
        self._num_tokens -= len(seq.tokens)
        del self._sequences[seq_id]

    def count(self, pattern: Sequence[int]) -> int:
        """Positions where `pattern` (1 to max_depth tokens) occurs in the stored sequences."""
        if not 1 <= len(pattern) <= self._max_depth:
            raise ValueError(f"patterns have 1 to max_depth={self._max_depth} tokens, got {len(pattern)}")
        node = self._find(pattern, 0)
        return 0 if node is None else node.count

    def speculate(
        self,
        context: Sequence[int],
        max_tokens: int,
        max_spec_factor: float = 1.0,
        max_spec_offset: float = 0.0,
        min_token_prob: float = 0.1,
    ) -> SuffixDraft:
        """The best greedy draft over every match length of the context's tail (see the module docstring).

        A draft matched on m tokens is at most min(max_tokens, floor(max_spec_factor * m + max_spec_offset),
        max_depth - m) long: short matches are weak evidence, so they earn short drafts.
        """
        if max_tokens < 0:
            raise ValueError(f"max_tokens must be at least 0, got {max_tokens}")
        max_depth, end = self._max_depth, len(context)
        # The best so far is kept as (score, match length, chain, its length); one SuffixDraft is built at the end.
        best_score, best_match_len, best_chain, best_length = 0.0, 0, None, 0
        chain: _Chain | None = None
        previous_count = 0
        # A match of max_depth tokens has no children to draft from.
        for match_len in range(1, min(end, max_depth - 1) + 1):
            node = self._find(context, end - match_len)
            if node is None:
                break  # every longer tail contains this one, so none of them occurs either
            # Same count as the match one token shorter: every occurrence of that shorter tail is preceded by
            # this tail's first token, so both subtrees hold the same counts down to this one's depth limit,
            # and the greedy walk from here is the same walk (up to `limit`, which respects that limit). By
            # induction this holds back to the match the chain started from, so the chain is shared.
            if chain is None or node.count != previous_count:
                chain = _Chain(node)
            previous_count = node.count
            limit = min(
                max_tokens, math.floor(max_spec_factor * match_len + max_spec_offset), max_depth - match_len
            )
            if limit <= 0:
                continue
            if not chain.done and len(chain.tokens) < limit:
                chain.grow_to(limit, min_token_prob)
            if not chain.tokens:
                continue
            score = sum(chain.probs[:limit])
            if score >= best_score:  # ties go to the longer match
                best_score, best_match_len, best_chain = score, match_len, chain
                best_length = min(limit, len(chain.tokens))  # the chain may grow later, for longer matches
        if best_chain is None:
            return SuffixDraft([], [], 0.0, 0)
        tokens, probs = best_chain.tokens[:best_length], best_chain.probs[:best_length]
        return SuffixDraft(tokens, probs, best_score, best_match_len)

    def _get(self, seq_id: int) -> _Sequence:
        try:
            return self._sequences[seq_id]
        except KeyError:
            raise KeyError(f"no sequence with id {seq_id}") from None

    def _find(self, tokens: Sequence[int], start: int) -> _Node | None:
        """The node of tokens[start:], or None where it does not occur."""
        node = self._root
        for token in tokens[start:]:
            node = node.children.get(token)
            if node is None:
                return None
        return node

    def _append(self, seq: _Sequence, token: int) -> None:
        """Count the occurrences that end at the new token: one per active node, extended by it."""
        max_depth = self._max_depth
        active = [self._root]
        for node in seq.active:
            child = node.children.get(token)
            if child is None:
                if node.children is NO_CHILDREN:
                    node.children = {}
                child = node.children[token] = _Node(token, node.depth + 1)
                self._num_nodes += 1
            child.count += 1
            if _beats(child, node.best):  # only this child grew, so it is the only possible new best
                node.best = child
            if child.depth < max_depth:  # a node at max_depth has no children to step into
                active.append(child)
        seq.active = active
        seq.tokens.append(token)
        self._num_tokens += 1

    def _uncount(self, tokens: list[int], keep: int) -> None:
        """Take back every occurrence in `tokens` that ends at position `keep` or later."""
        max_depth, root = self._max_depth, self._root
        for start in range(max(0, keep - max_depth + 1), len(tokens)):
            path = [root]
            for token in tokens[start : start + max_depth]:
                path.append(path[-1].children[token])
            # Deepest first: a node's count never drops below a child's, so a node that reaches 0 here has
            # no counted children left and can go with its whole (empty) subtree.
            for depth in range(len(path) - 1, max(1, keep - start + 1) - 1, -1):
                self._decrement(path[depth - 1], path[depth])

    def _decrement(self, parent: _Node, node: _Node) -> None:
        node.count -= 1
        if node.count == 0:
            del parent.children[node.token]
            if not parent.children:
                parent.children = NO_CHILDREN
            self._num_nodes -= 1
        if parent.best is node:  # the best child shrank: another may now lead, so look at all of them
            parent.best = _best_child(parent)

    def _suffix_nodes(self, tokens: list[int]) -> list[_Node]:
        """The active nodes of a sequence of these tokens: its suffixes shorter than max_depth, by depth."""
        active = [self._root]
        end = len(tokens)
        for depth in range(1, min(end, self._max_depth - 1) + 1):
            node = self._find(tokens, end - depth)
            assert node is not None, "a stored sequence's suffix is always counted"
            active.append(node)
        return active
