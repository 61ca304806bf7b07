"""The traffic buffer (drafter/adaptation/buffer.py), fed through the real session table and Speculation as a
`/draft` call goes through them: it holds exactly what the target emitted (kept drafts and its own token), a
bounded window of context before it, a held-out share, and never more tokens than its bound."""

from __future__ import annotations

import random

import numpy as np

from drafter.adaptation.buffer import TrafficBuffer
from drafter.draft_params import DraftParams
from drafter.server.metrics import Metrics
from drafter.sessions.draft_length import DraftCost, DraftLengthPolicy, Load
from drafter.sessions.speculation import Speculation
from drafter.sessions.table import SessionTable

K = 4
IDLE = Load(queue_depth=0, running=0)


def speculation(buffer: TrafficBuffer) -> Speculation:
    table = SessionTable(max_sessions=16, ttl_s=600, max_len=4096)
    policy = DraftLengthPolicy(DraftCost(20.0, 1.0, 1.0), K, max_batch_size=1, max_queue_depth=1)
    return Speculation(table, policy, Metrics(1), K, 4096, on_verified=buffer.add)


class Conversation:
    """A target's side of one session: a full-context first call, then v2 rounds that keep some drafts."""

    def __init__(self, spec: Speculation, name: str, prompt: list[int], rng: random.Random):
        self.spec, self.name, self.rng = spec, name, rng
        self.context, self.drafts = list(prompt), self.new_drafts()
        params = DraftParams(np.asarray(prompt, dtype=np.int64), K, session=name)
        self.token = spec.finish(spec.prepare(params, IDLE), self.drafts)["session_token"]

    def new_drafts(self) -> list[int]:
        return [self.rng.randrange(1000, 2000) for _ in range(K)]

    def round(self, accepted: int, extra: list[int] = ()) -> list[int]:
        """Keep `accepted` drafts, add the target's own token (and `extra` tokens it did not generate)."""
        emitted = [*self.drafts[:accepted], self.rng.randrange(2000, 3000)]
        prefix_len = len(self.context) + accepted
        new = [emitted[-1], *extra]
        params = DraftParams(
            np.asarray(new, dtype=np.int64),
            K,
            session=self.name,
            prefix_len=prefix_len,
            session_token=self.token,
        )
        self.context += [*emitted, *extra]
        self.drafts = self.new_drafts()
        self.spec.finish(self.spec.prepare(params, IDLE), self.drafts)
        return emitted


def test_buffer_holds_what_the_target_emitted_after_a_context_window():
    buffer = TrafficBuffer(max_tokens=10_000, context_window=8, held_out_every=1000)
    rng = random.Random(0)
    prompt = list(range(100, 130))
    talk = Conversation(speculation(buffer), "a", prompt, rng)
    assert buffer.describe()["examples"] == 0  # a first call verified nothing
    emitted = [token for accepted in (2, 0, 4, 1) for token in talk.round(accepted)]
    (example,) = buffer.training
    assert example.tokens == prompt[-8:] + emitted  # consecutive rounds grow one example
    assert example.num_context == 8 and example.num_targets == 2 + 1 + 0 + 1 + 4 + 1 + 1 + 1
    assert example.num_draft_tokens == K


def test_tokens_the_target_did_not_generate_end_an_example():
    """A call that sends more than the target's token (a new user turn) adds only the kept drafts and the
    first token; the next round starts a new example, its context window holding the turn."""
    buffer = TrafficBuffer(max_tokens=10_000, context_window=6, held_out_every=1000)
    talk = Conversation(speculation(buffer), "a", list(range(100, 120)), random.Random(0))
    first = talk.round(1, extra=[7, 7, 7, 7, 7])
    second = talk.round(3)
    old, new = buffer.training
    assert old.tokens[old.num_context :] == first
    assert new.tokens == talk.context[-len(second) - 6 : -len(second)] + second
    assert new.tokens[:5] == [first[-1], 7, 7, 7, 7]


def test_buffer_never_holds_more_tokens_than_its_bound_and_holds_some_out():
    buffer = TrafficBuffer(max_tokens=300, context_window=16, max_example_tokens=40, held_out_every=4)
    spec, rng = speculation(buffer), random.Random(1)
    talks = [Conversation(spec, f"s{i}", [rng.randrange(100) for _ in range(50)], rng) for i in range(5)]
    for _ in range(150):
        rng.choice(talks).round(rng.randrange(K + 1))
        described = buffer.describe()
        assert described["tokens"] == sum(len(e.tokens) for e in (*buffer.training, *buffer.held_out))
        assert described["tokens"] <= 300
        assert all(len(e.tokens) <= 40 for e in (*buffer.training, *buffer.held_out))
    assert buffer.held_out and buffer.training and buffer.counters.evicted_examples > 0
    assert len(buffer.open) <= len(buffer.training) + len(buffer.held_out)
    seen = buffer.counters.examples
    assert len([e for e in (*buffer.training, *buffer.held_out) if e.held_out]) <= seen // 4 + 1


def test_a_rollback_or_rebuild_adds_nothing():
    buffer = TrafficBuffer(max_tokens=10_000, context_window=8)
    spec = speculation(buffer)
    talk = Conversation(spec, "a", list(range(100, 120)), random.Random(0))
    params = DraftParams(
        np.asarray([5], dtype=np.int64), K, session="a", prefix_len=10, session_token=talk.token
    )
    spec.finish(spec.prepare(params, IDLE), [1, 2, 3, 4])  # a rollback into the prompt: nothing verified
    Conversation(spec, "a", list(range(200, 240)), random.Random(1))  # a full-context rebuild
    assert buffer.describe()["target_tokens_seen"] == 0
