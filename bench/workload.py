"""The contexts a target model posts, simulated.

- `growing`: one conversation per client. Each call posts the whole context; the target then accepts a
  random prefix of the drafts (0 to k, uniformly: the drafts are from random weights, so acceptance itself
  is simulated) and adds one token of its own, so the next context extends this one by 1 to k + 1 tokens,
  exactly as in speculative decoding. The first call of a conversation is its cold join and not measured.
- `cold`: every call posts a fresh random context of the same length, sharing no prefix with any other:
  a new conversation per call, the worst case for a KV cache.
Seeded, so every variant of one run sees the same contexts (and, drafting identically, the same growth).
"""

from __future__ import annotations

import random

PATTERNS = ("growing", "cold")


class Conversation:
    def __init__(self, pattern: str, context_len: int, vocab_size: int, seed: int):
        if pattern not in PATTERNS:
            raise ValueError(f"pattern must be one of {PATTERNS}, got {pattern!r}")
        self.pattern, self.context_len, self.vocab_size = pattern, context_len, vocab_size
        self.rng = random.Random(seed)
        self.tokens = self.fresh()

    def fresh(self) -> list[int]:
        return [self.rng.randrange(self.vocab_size) for _ in range(self.context_len)]

    def context(self) -> list[int]:
        return self.tokens

    def accept(self, drafts: list[int]) -> None:
        """The target's verdict on this call's drafts, which shapes the next context."""
        if self.pattern == "cold":
            self.tokens = self.fresh()
            return
        accepted = self.rng.randint(0, len(drafts))
        self.tokens = [*self.tokens, *drafts[:accepted], self.rng.randrange(self.vocab_size)]


def longest_context(context_len: int, num_draft_tokens: int, num_calls: int) -> int:
    """The most positions a conversation of `num_calls` calls (plus its unmeasured join) can need."""
    return context_len + (num_calls + 1) * (num_draft_tokens + 1) + num_draft_tokens
