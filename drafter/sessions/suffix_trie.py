"""A depth-limited suffix trie with occurrence counts over token sequences: the storage the suffix index
(drafter/sessions/suffix_index.py) drafts from.

Every substring of a stored sequence with 1 to `max_depth` tokens is a trie node that counts the positions
where it occurs (within one sequence, never across two sequences' boundary). Sequences grow one chunk at a
time (`extend`, O(tokens * max_depth): each sequence keeps the nodes of its own suffixes, so a new token only
steps each of them down one edge), shrink on a rollback (`truncate`) and go away (`remove`), which deletes
the nodes nothing counts any more, so memory follows what is stored. Each node keeps its most frequent child
and a suffix link, which are what a draft walks.

How it is stored: flat, in `array`s indexed by node id and one dict from (node, token) to child, all of
ints. A node per object would make the index millions of objects the cyclic garbage collector must walk:
at the server's default caps a full collection (which Python runs every time a quarter more objects have
survived) stalled the whole event loop for hundreds of milliseconds. Arrays of ints and a dict of ints are
invisible to the collector.

Where it stops: no drafting (the subclass in suffix_index.py), no eviction policy (the caller decides what
to `remove`); not thread-safe. Pure Python, standard library only.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Sequence

ROOT, NONE = 0, -1  # node ids: the root (the empty substring), and "no node"
STRIDE = 1 << 32  # a child's key: parent * STRIDE + token (token ids are below 2**32)
MAX_DEPTH = 127  # depths are stored as signed bytes
SHARDS = 256  # child dicts, by the parent's id (see SuffixTrie.__init__)
SHARD_MASK = SHARDS - 1


class _Sequence:
    """A stored sequence: its tokens and its active nodes, the trie nodes of its suffixes shorter than
    `max_depth` (the root first, then by increasing depth): the ones the next token extends."""

    __slots__ = ("tokens", "active")

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.active: list[int] = [ROOT]


class SuffixTrie:
    """Suffix trie over several token sequences, each named by the int id `add` hands out."""

    def __init__(self, max_depth: int = 24) -> None:
        if not 1 <= max_depth <= MAX_DEPTH:
            raise ValueError(f"max_depth must be in [1, {MAX_DEPTH}], got {max_depth}")
        self._max_depth = max_depth
        # Per node id (the root is 0): occurrences, the token that ends it, its length, its most frequent
        # child (max count, then smallest token id; NONE if childless), and its children as a linked list
        # (first child, next and previous sibling), walked only to elect a new best child after a removal.
        self._count = array("q", [0])
        self._token = array("q", [NONE])
        self._depth = array("b", [0])
        self._best = array("q", [NONE])
        self._first = array("q", [NONE])
        self._next = array("q", [NONE])
        self._prev = array("q", [NONE])
        # Suffix link: the node of this node's substring without its first token (always stored, and counted
        # at least as often: every occurrence of a substring is one of its suffix's). It lets a lookup find
        # the nodes of all the context's tails in one pass instead of one walk from the root per tail.
        self._link = array("q", [NONE])
        # parent * STRIDE + token -> child, in SHARDS dicts by the parent's id: Python grows a dict by copying
        # all of it at once, which at a million nodes would hold the event loop for tens of milliseconds.
        self._child: list[dict[int, int]] = [{} for _ in range(SHARDS)]
        self._num_nodes = 0
        self._free = array("q")  # ids of removed nodes, reused first
        self._sequences: dict[int, _Sequence] = {}
        self._next_id = 0
        self._num_tokens = 0

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
        self._sequences[seq_id] = _Sequence()
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
        return 0 if node == NONE else self._count[node]

    def _get(self, seq_id: int) -> _Sequence:
        try:
            return self._sequences[seq_id]
        except KeyError:
            raise KeyError(f"no sequence with id {seq_id}") from None

    def _find(self, tokens: Sequence[int], start: int) -> int:
        """The node of tokens[start:], or NONE where it does not occur."""
        node, child = ROOT, self._child
        for token in tokens[start:]:
            node = child[node & SHARD_MASK].get(node * STRIDE + token, NONE)
            if node == NONE:
                return NONE
        return node

    def _append(self, seq: _Sequence, token: int) -> None:
        """Count the occurrences that end at the new token: one per active node, extended by it."""
        max_depth, child_of, count, best, token_of = (
            self._max_depth,
            self._child,
            self._count,
            self._best,
            self._token,
        )
        active = [ROOT]
        shorter = ROOT  # the child just counted for the active node one token shorter: the new child's link
        # Active nodes come by depth from the root's 0, so the one at position i has children of depth i + 1.
        for child_depth, node in enumerate(seq.active, start=1):
            child = child_of[node & SHARD_MASK].get(node * STRIDE + token, NONE)
            if child == NONE:
                child = self._new_node(node, token, shorter)
            shorter = child
            grown = count[child] + 1
            count[child] = grown
            # Only this child grew, so it is the only possible new best.
            leader = best[node]
            if leader != child and (
                leader == NONE
                or grown > count[leader]
                or (grown == count[leader] and token < token_of[leader])
            ):
                best[node] = child
            if child_depth < max_depth:  # a node at max_depth has no children to step into
                active.append(child)
        seq.active = active
        seq.tokens.append(token)
        self._num_tokens += 1

    def _new_node(self, parent: int, token: int, link: int) -> int:
        depth = self._depth[parent] + 1
        if self._free:
            node = self._free.pop()
            self._count[node], self._token[node], self._depth[node] = 0, token, depth
            self._best[node] = self._first[node] = NONE
            self._link[node] = link
        else:
            node = len(self._count)
            self._count.append(0)
            self._token.append(token)
            self._depth.append(depth)
            self._best.append(NONE)
            self._first.append(NONE)
            self._next.append(NONE)
            self._prev.append(NONE)
            self._link.append(link)
        following = self._first[parent]  # becomes the parent's first child
        self._next[node], self._prev[node] = following, NONE
        if following != NONE:
            self._prev[following] = node
        self._first[parent] = node
        self._child[parent & SHARD_MASK][parent * STRIDE + token] = node
        self._num_nodes += 1
        return node

    def _uncount(self, tokens: list[int], keep: int) -> None:
        """Take back every occurrence in `tokens` that ends at position `keep` or later."""
        max_depth, child_of = self._max_depth, self._child
        for start in range(max(0, keep - max_depth + 1), len(tokens)):
            path = [ROOT]
            for token in tokens[start : start + max_depth]:
                parent = path[-1]
                path.append(child_of[parent & SHARD_MASK][parent * STRIDE + token])
            # Deepest first: a node's count never drops below a child's, so a node that reaches 0 here has
            # no counted children left and can go with its whole (empty) subtree.
            for depth in range(len(path) - 1, max(1, keep - start + 1) - 1, -1):
                self._decrement(path[depth - 1], path[depth])

    def _decrement(self, parent: int, node: int) -> None:
        self._count[node] -= 1
        if self._count[node] == 0:
            self._unlink(parent, node)
        if self._best[parent] == node:  # the best child shrank or went: another may now lead
            self._best[parent] = self._best_child(parent)

    def _unlink(self, parent: int, node: int) -> None:
        del self._child[parent & SHARD_MASK][parent * STRIDE + self._token[node]]
        self._num_nodes -= 1
        before, after = self._prev[node], self._next[node]
        if before == NONE:
            self._first[parent] = after
        else:
            self._next[before] = after
        if after != NONE:
            self._prev[after] = before
        self._free.append(node)

    def _best_child(self, parent: int) -> int:
        count, token_of, best = self._count, self._token, NONE
        child = self._first[parent]
        while child != NONE:
            if (
                best == NONE
                or count[child] > count[best]
                or (count[child] == count[best] and token_of[child] < token_of[best])
            ):
                best = child
            child = self._next[child]
        return best

    def _suffix_nodes(self, tokens: list[int]) -> list[int]:
        """The active nodes of a sequence of these tokens: its suffixes shorter than max_depth, by depth."""
        active = [ROOT]
        end = len(tokens)
        for depth in range(1, min(end, self._max_depth - 1) + 1):
            node = self._find(tokens, end - depth)
            assert node != NONE, "a stored sequence's suffix is always counted"
            active.append(node)
        return active
