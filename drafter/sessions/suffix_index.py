"""The greedy draft a suffix trie (drafter/sessions/suffix_trie.py) proposes for a context: what earlier text
went on to say after the context's tail, as in SuffixDecoding (Oliaro et al., NeurIPS 2025) and Snowflake
arctic-inference's suffix cache.

`speculate` tries every tail of the context that the trie holds (match length m = 1, 2, ...), drafts from
each by always taking the most frequent next token while the running probability (the product of count
ratios) stays above `min_token_prob`, and keeps the draft with the highest expected number of accepted
tokens (the sum of its probabilities), preferring longer matches on a tie.

Where it stops: one draft chain, not arctic-inference's tree of drafts; no per-request prompt trie beside
the global one; storing, rolling back and removing sequences are the trie's. Pure Python, standard library
only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from drafter.sessions.suffix_trie import NONE, ROOT, SHARD_MASK, STRIDE, SuffixTrie


@dataclass(frozen=True, slots=True)
class SuffixDraft:
    """A proposed continuation: its tokens, each one's probability of being reached (the product of count
    ratios up to it), their sum `score` (the expected number of accepted tokens), and how many of the
    context's last tokens it was matched on."""

    tokens: list[int]
    probs: list[float]
    score: float
    match_len: int

    def cut(self, length: int) -> SuffixDraft:
        """Its first `length` tokens."""
        if length >= len(self.tokens):
            return self
        probs = self.probs[:length]
        return SuffixDraft(self.tokens[:length], probs, sum(probs), self.match_len)


class _Chain:
    """The greedy walk from one node, grown on demand: while consecutive match lengths have the same count
    their subtrees hold the same counts (see `speculate`), so they share one chain."""

    __slots__ = ("node", "tokens", "probs", "p", "done")

    def __init__(self, node: int) -> None:
        self.node = node  # where the walk goes on from
        self.tokens: list[int] = []
        self.probs: list[float] = []
        self.p = 1.0
        self.done = False  # stopped for good: no children, or below min_token_prob

    def grow_to(self, index: SuffixIndex, length: int, min_token_prob: float) -> None:
        best, count, token_of = index._best, index._count, index._token
        node, tokens, probs, p = self.node, self.tokens, self.probs, self.p
        while len(tokens) < length:
            child = best[node]
            if child == NONE:
                self.done = True
                break
            step_p = p * (count[child] / count[node])
            if step_p < min_token_prob:
                self.done = True
                break
            p = step_p
            tokens.append(token_of[child])
            probs.append(p)
            node = child
        self.node, self.p = node, p


class SuffixIndex(SuffixTrie):
    """The suffix trie over several token sequences, and the greedy draft it proposes for a context."""

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
        max_depth, count = self._max_depth, self._count
        # The best so far is kept as (score, match length, chain, its length); one SuffixDraft is built at the end.
        best_score, best_match_len, best_chain, best_length = 0.0, 0, None, 0
        chain: _Chain | None = None
        previous_count = 0
        # A match of max_depth tokens has no children to draft from; every tail shorter than the longest that
        # occurs occurs too (the stored substrings are closed under suffixes).
        for match_len, node in enumerate(self._tail_nodes(context), start=1):
            # Same count as the match one token shorter: every occurrence of that shorter tail is preceded by
            # this tail's first token, so both subtrees hold the same counts down to this one's depth limit,
            # and the greedy walk from here is the same walk (up to `limit`, which respects that limit). By
            # induction this holds back to the match the chain started from, so the chain is shared.
            if chain is None or count[node] != previous_count:
                chain = _Chain(node)
            previous_count = count[node]
            limit = min(
                max_tokens, math.floor(max_spec_factor * match_len + max_spec_offset), max_depth - match_len
            )
            if limit <= 0:
                continue
            if not chain.done and len(chain.tokens) < limit:
                chain.grow_to(self, limit, min_token_prob)
            if not chain.tokens:
                continue
            score = sum(chain.probs[:limit])
            if score >= best_score:  # ties go to the longer match
                best_score, best_match_len, best_chain = score, match_len, chain
                best_length = min(limit, len(chain.tokens))  # the chain may grow later, for longer matches
            if best_score > min(max_tokens, max_depth - match_len - 1):
                break  # no longer match may draft as many tokens as this score, so none can beat or tie it
        if best_chain is None:
            return SuffixDraft([], [], 0.0, 0)
        tokens, probs = best_chain.tokens[:best_length], best_chain.probs[:best_length]
        return SuffixDraft(tokens, probs, best_score, best_match_len)

    def best_possible_score(
        self, context_len: int, max_tokens: int, max_spec_factor: float = 1.0, max_spec_offset: float = 0.0
    ) -> int:
        """The most any draft for a context of this length could score (each token counts at most 1)."""
        return max(
            (
                min(max_tokens, math.floor(max_spec_factor * m + max_spec_offset), self._max_depth - m)
                for m in range(1, min(context_len, self._max_depth - 1) + 1)
            ),
            default=0,
        )

    def _tail_nodes(self, context: Sequence[int]) -> list[int]:
        """The nodes of the context's tails that occur, shortest first, up to max_depth - 1 tokens: the
        longest is found in one pass (as a suffix automaton matches text: on a miss, drop the match's first
        token through the suffix link and try again), the shorter ones by following links from it."""
        child_of, link, depth = self._child, self._link, self._depth
        longest = self._max_depth - 1
        if not context or longest < 1 or child_of[ROOT].get(ROOT * STRIDE + context[-1], NONE) == NONE:
            return []  # the last token never occurred: no tail does (the common miss, answered at once)
        node = ROOT
        for token in context[max(0, len(context) - longest) :]:
            if depth[node] == longest:  # the match may not grow past max_depth - 1: drop its first token
                node = link[node]
            while True:
                found = child_of[node & SHARD_MASK].get(node * STRIDE + token, NONE)
                if found != NONE:
                    node = found
                    break
                if node == ROOT:
                    break
                node = link[node]
        nodes = []
        while node != ROOT:
            nodes.append(node)
            node = link[node]
        nodes.reverse()
        return nodes
