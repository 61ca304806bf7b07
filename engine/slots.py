"""Which conversation's keys and values each KV-cache slot holds, and which slot a new request should use.

A slot remembers the token ids whose keys/values it holds at positions 0..length-1. A request keeps the
longest common prefix with its slot and prefills the rest; whatever the slot held past that prefix (drafts
the target rejected, another branch) is overwritten in place. Matching compares a request against every
slot at once with numpy, so a 32k-token context costs one vectorized compare, not a Python loop.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class Assignment:
    slot: int
    reuse: int  # context tokens whose keys/values are already in the slot
    evicted: bool  # the slot held another conversation, none of which is reused


class SlotTable:
    def __init__(self, num_slots: int, cache_len: int):
        self.tokens = np.zeros((num_slots, cache_len), dtype=np.int64)  # [slots, cache_len]
        self.lengths = np.zeros(num_slots, dtype=np.int64)  # valid prefix of each row
        self.last_used = np.zeros(num_slots, dtype=np.int64)  # tick of the last request, for LRU
        self.owner: list[str | None] = [None] * num_slots  # session hint that last used each slot
        self.session_slot: dict[str, int] = {}
        self.tick = 0

    def common_prefix(self, tokens: np.ndarray) -> np.ndarray:
        """[slots] length of the prefix each slot shares with `tokens`."""
        n = min(len(tokens), self.tokens.shape[1])
        differs = self.tokens[:, :n] != tokens[None, :n]
        differs |= np.arange(n)[None, :] >= self.lengths[:, None]
        return np.where(differs.any(axis=1), differs.argmax(axis=1), n)

    def assign(self, batch: list[tuple[np.ndarray, str | None]]) -> list[Assignment]:
        """A distinct slot for each (tokens, session) of one batch; no slot is given out twice."""
        taken: set[int] = set()
        out = []
        for tokens, session in batch:
            prefix = self.common_prefix(tokens)
            free = [s for s in range(len(self.lengths)) if s not in taken]
            slot = self.session_slot.get(session) if session is not None else None
            if slot is None or slot in taken:
                best = max(free, key=lambda s: (prefix[s], self.last_used[s]))
                if prefix[best] > 0:
                    slot = best
                else:  # nothing to reuse: an empty slot, else the least recently used one
                    slot = min(free, key=lambda s: (self.lengths[s] > 0, self.last_used[s]))
            # The last context token is always fed to the decode loop, so at most n - 1 are reused.
            reuse = int(min(prefix[slot], len(tokens) - 1))
            out.append(Assignment(slot, reuse, evicted=bool(self.lengths[slot] > 0 and prefix[slot] == 0)))
            taken.add(slot)
        return out

    def begin(self, assignment: Assignment, session: str | None) -> None:
        """Before the slot is written: only the reused prefix stays valid, whatever happens next."""
        slot = assignment.slot
        self.lengths[slot] = assignment.reuse
        previous = self.owner[slot]
        if previous is not None and previous != session and self.session_slot.get(previous) == slot:
            del self.session_slot[previous]
        self.owner[slot] = session
        if session is not None:
            self.session_slot[session] = slot
        self.tick += 1
        self.last_used[slot] = self.tick

    def commit(self, slot: int, tokens: np.ndarray) -> None:
        """After a successful draft: the slot holds keys/values for exactly `tokens`."""
        n = min(len(tokens), self.tokens.shape[1])
        self.tokens[slot, :n] = tokens[:n]
        self.lengths[slot] = n
