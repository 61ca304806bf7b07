"""The traffic buffer: what targets emitted on live traffic, with just enough context before it to predict it.

A call that verified a session's last drafts (`accepted` is known) shows what the target emitted in that round:
the `accepted` drafts it kept and the one token it added itself, `context[last_len : last_len + accepted + 1]`.
Only those are taken, even when the call sent more (a new user turn is not the target's output). An example
is a span of one conversation: at most `context_window` tokens before its first target token, then target
tokens. The next round of the same session usually starts exactly where the example ends, so its target
tokens are appended to the same example instead of storing the context again (up to `max_example_tokens`);
otherwise a new example starts with its own context window. So the buffer never holds more of a prompt than
the window before a target token.

Every `held_out_every`-th new example (a counter: deterministic) is held out: training never reads it, and
candidates are scored on it (drafter/adaptation/score.py). Each side keeps its share of `max_tokens` (every
stored id, context included) and drops its oldest examples beyond it. Fed on the event loop: a call costs a
copy of its few target ids, and of the context window when it starts an example.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np


@dataclass(slots=True, eq=False)
class Example:
    session: str
    tokens: list[int]  # the context window, then target tokens
    num_context: int  # leading tokens that are context only; every later one is the target's
    num_draft_tokens: int  # k of the session's latest verified round: the rounds it is scored at
    held_out: bool
    evicted: bool = False
    end: int = 0  # the conversation position right after its last token (where a next round would append)
    number: int = 0  # examples started before this one: which traffic came after a swap

    @property
    def num_targets(self) -> int:
        return len(self.tokens) - self.num_context


@dataclass(slots=True)
class BufferCounters:
    examples: int = 0  # started
    target_tokens: int = 0  # taken in
    evicted_examples: int = 0


@dataclass
class TrafficBuffer:
    max_tokens: int
    context_window: int = 256
    max_example_tokens: int = 1024
    held_out_every: int = 5
    training: deque[Example] = field(default_factory=deque)
    held_out: deque[Example] = field(default_factory=deque)
    num_tokens: dict[bool, int] = field(default_factory=lambda: {False: 0, True: 0})  # by held_out
    open: dict[str, Example] = field(default_factory=dict)  # session -> its newest example, maybe growing
    counters: BufferCounters = field(default_factory=BufferCounters)

    def __post_init__(self):
        if self.context_window < 1 or self.held_out_every < 2:
            raise ValueError("context_window must be >= 1 and held_out_every >= 2")
        if self.max_example_tokens <= self.context_window:
            raise ValueError("max_example_tokens must exceed context_window")

    def add(
        self, session: str, context: np.ndarray, last_len: int, accepted: int, num_draft_tokens: int
    ) -> None:
        """A call of `session` whose `context` extends the session's last context (`last_len` ids) and kept
        `accepted` of the `num_draft_tokens` drafts it was sent."""
        end = min(len(context), last_len + accepted + 1)
        if end <= last_len:  # nothing after the last context: the target emitted nothing here
            return
        targets = context[last_len:end].tolist()
        example = self.open.get(session)
        if (
            example is None
            or example.evicted
            or example.end != last_len
            or len(example.tokens) + len(targets) > self.max_example_tokens
        ):
            example = self.start(session, context, last_len)
            self.open[session] = example
        example.tokens += targets
        example.end = end
        example.num_draft_tokens = num_draft_tokens
        self.counters.target_tokens += len(targets)
        self.num_tokens[example.held_out] += len(targets)
        self.evict(example.held_out)

    def start(self, session: str, context: np.ndarray, last_len: int) -> Example:
        window = context[max(0, last_len - self.context_window) : last_len].tolist()
        held_out = self.counters.examples % self.held_out_every == self.held_out_every - 1
        example = Example(
            session, window, len(window), 0, held_out, end=last_len, number=self.counters.examples
        )
        self.counters.examples += 1
        (self.held_out if held_out else self.training).append(example)
        self.num_tokens[held_out] += len(window)
        return example

    def evict(self, held_out: bool) -> None:
        """Drop the side's oldest examples while it holds more than its share (never the newest one)."""
        examples = self.held_out if held_out else self.training
        while self.num_tokens[held_out] > self.share(held_out) and len(examples) > 1:
            old = examples.popleft()
            old.evicted = True
            if self.open.get(old.session) is old:  # so `open` never outgrows the examples held
                del self.open[old.session]
            self.num_tokens[held_out] -= len(old.tokens)
            self.counters.evicted_examples += 1

    def share(self, held_out: bool) -> int:
        held_out_share = self.max_tokens // self.held_out_every
        return held_out_share if held_out else self.max_tokens - held_out_share

    def describe(self) -> dict:
        return {
            "max_tokens": self.max_tokens,
            "tokens": self.num_tokens[False] + self.num_tokens[True],
            "held_out_tokens": self.num_tokens[True],
            "examples": len(self.training) + len(self.held_out),
            "held_out_examples": len(self.held_out),
            "target_tokens_seen": self.counters.target_tokens,
            "evicted_examples": self.counters.evicted_examples,
        }
