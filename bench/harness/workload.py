"""The contexts a target model posts, simulated.

- `growing`: one conversation per client. Each call posts the whole context; the target then accepts a
  random prefix of the drafts (0 to k, uniformly: the drafts are from random weights, so acceptance itself
  is simulated) and adds one token of its own, so the next context extends this one by 1 to k + 1 tokens,
  exactly as in speculative decoding. The first call of a conversation is its cold join and not measured.
- `cold`: every call posts a fresh random context of the same length, sharing no prefix with any other:
  a new conversation per call, the worst case for a KV cache.
- `shared`: every call a new conversation too, but its first three quarters are a system prompt common to
  every client of the case (a deployment's fixed instructions): what prefix sharing across conversations
  saves a new conversation, against `cold` of the same length.
Seeded, so every variant of one run sees the same contexts (and, drafting identically, the same growth).
"""

from __future__ import annotations

import random
import zlib

PATTERNS = ("growing", "cold", "shared")


class Conversation:
    def __init__(self, pattern: str, context_len: int, vocab_size: int, seed: int, prompt_seed: int = 0):
        if pattern not in PATTERNS:
            raise ValueError(f"pattern must be one of {PATTERNS}, got {pattern!r}")
        self.pattern, self.context_len, self.vocab_size = pattern, context_len, vocab_size
        self.rng = random.Random(seed)
        self.prompt: list[int] = []
        if pattern == "shared":  # the same for every conversation built with this prompt_seed
            prompt_rng = random.Random(prompt_seed)
            self.prompt = [prompt_rng.randrange(vocab_size) for _ in range(context_len * 3 // 4)]
        self.tokens = self.fresh()

    def fresh(self) -> list[int]:
        own = self.context_len - len(self.prompt)
        return self.prompt + [self.rng.randrange(self.vocab_size) for _ in range(own)]

    def context(self) -> list[int]:
        return self.tokens

    def accept(self, drafts: list[int]) -> None:
        """The target's verdict on this call's drafts, which shapes the next context."""
        if self.pattern != "growing":
            self.tokens = self.fresh()
            return
        accepted = self.rng.randint(0, len(drafts))
        self.tokens = [*self.tokens, *drafts[:accepted], self.rng.randrange(self.vocab_size)]


def longest_context(context_len: int, num_draft_tokens: int, num_calls: int) -> int:
    """The most positions a conversation of `num_calls` calls (plus its unmeasured join) can need."""
    return context_len + (num_calls + 1) * (num_draft_tokens + 1) + num_draft_tokens


def conversations(case: dict, vocab_size: int, seed: int) -> list[Conversation]:
    """One conversation per client of a case (`pattern`, `context_len`, `concurrency`), seeded by the case."""
    # crc32, not hash(): str hashes change between processes, and runs must be reproducible.
    base = seed * 1_000_003 + zlib.crc32(repr(sorted(case.items())).encode())
    return [
        Conversation(case["pattern"], case["context_len"], vocab_size, base + i, prompt_seed=base)
        for i in range(case["concurrency"])
    ]
