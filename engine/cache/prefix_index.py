"""Full pages found by content, so a conversation reuses keys and values another one already computed.

A full page at logical index i holds the keys and values of tokens [i*P, (i+1)*P) *given everything before
them*, so it is named by its whole prefix: key_i = sum over j <= i of hash(page j's tokens) x M_j (mod 2^64,
M_j random per index), computed for a whole context in one vectorized pass — the page-aligned prefix tree of
SGLang's radix cache and vLLM's automatic prefix caching, flattened into a dict. A key only finds a
candidate: a match is accepted only if the page holds exactly the request's tokens and was computed on top
of the page matched before it (`parent`), so a hash collision can cost a reuse, never a wrong draft.

Pages no sequence holds stay findable ("idle") until the allocator needs them back, least recently used
first.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

NO_PARENT = -1


class PrefixIndex:
    def __init__(self, num_pages: int, page_size: int, max_pages_per_seq: int, seed: int = 0):
        rng = np.random.default_rng(seed)
        self.page_size = page_size
        self.token_weights = rng.integers(1, 2**63, size=page_size, dtype=np.uint64) | np.uint64(1)
        self.page_weights = rng.integers(1, 2**63, size=max_pages_per_seq, dtype=np.uint64) | np.uint64(1)
        self.tokens = np.full((num_pages, page_size), -1, dtype=np.int64)  # [num_pages, P] each page's ids
        self.parent = np.full(num_pages, NO_PARENT, dtype=np.int64)  # [num_pages] page it was computed after
        self.page_of: dict[int, int] = {}
        self.key_of: dict[int, int] = {}
        self.idle: OrderedDict[int, None] = OrderedDict()  # indexed pages no sequence holds, LRU first

    def keys(self, tokens: np.ndarray, first: int = 0, before: int = 0) -> np.ndarray:
        """[len(tokens) // P - first] the keys of `tokens`' full pages from logical page `first` on, given
        `before`, the key of page first - 1 (a key sums over its prefix, so a tail costs only its pages)."""
        size, num_full = self.page_size, len(tokens) // self.page_size
        # Ids are non-negative int64: viewed as uint64 they keep their values, without a copy. Wrapping mod
        # 2^64 is the point, and numpy's array arithmetic (a matmul too) wraps without a warning. Few ops:
        # each costs a few microseconds with the caches cold from a decode step.
        pages = tokens[first * size : num_full * size].reshape(-1, size).view(np.uint64)
        hashes = pages @ self.token_weights
        return np.cumsum(hashes * self.page_weights[first:num_full]) + np.uint64(before)

    def match(self, tokens: np.ndarray, max_pages: int) -> list[int]:
        """The pages holding the longest run of `tokens`' leading full pages (at most `max_pages`)."""
        keys = self.keys(tokens[: max_pages * self.page_size])
        found: list[int] = []
        for key in keys.tolist():
            page = self.page_of.get(key)
            if page is None or self.parent[page] != (found[-1] if found else NO_PARENT):
                break
            found.append(page)
        if found:  # exact check of the candidates' contents, all pages at once
            want = tokens[: len(found) * self.page_size].reshape(len(found), self.page_size)
            same = (self.tokens[found] == want).all(axis=1)
            found = found[: int(np.argmin(same)) if not same.all() else len(found)]
        return found

    def record(self, pages: list[int], tokens: np.ndarray, start: int) -> None:
        """The sequence holding `pages` now has `tokens` at positions [0, len(tokens)); offer its full pages
        from logical page `start // P` on to the index."""
        size = self.page_size
        first = start // size
        end = -(-len(tokens) // size)  # one past the last page holding a token
        if end - first <= 4:  # a growing conversation's usual commit: a slice per page beats one gather
            for i in range(first, end):
                chunk = tokens[i * size : (i + 1) * size]
                self.tokens[pages[i], : len(chunk)] = chunk
        else:
            positions = np.arange(first * size, len(tokens))
            page_array = np.asarray(pages, dtype=np.int64)
            self.tokens.reshape(-1)[page_array[positions // size] * size + positions % size] = tokens[
                positions
            ]
        for i in range(max(first, 1), end):
            self.parent[pages[i]] = pages[i - 1]
        if first == 0 and pages:
            self.parent[pages[0]] = NO_PARENT
        if first >= len(tokens) // size:  # no new full page (most calls of a growing conversation)
            return
        before = self.key_of.get(pages[first - 1]) if first else 0
        # A page not indexed (another page took its key) gives no base: then the whole prefix is hashed.
        keys = self.keys(tokens)[first:] if before is None else self.keys(tokens, first, before)
        for i, key in enumerate(keys.tolist(), start=first):
            if key not in self.page_of and pages[i] not in self.key_of:
                self.page_of[key] = pages[i]
                self.key_of[pages[i]] = key

    def is_indexed(self, page: int) -> bool:
        return page in self.key_of

    def forget(self, page: int) -> None:
        """The page's contents are about to change (or it is evicted): it can no longer be found."""
        key = self.key_of.pop(page, None)
        if key is not None:
            del self.page_of[key]
        self.idle.pop(page, None)
