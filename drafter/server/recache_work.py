"""After a swap, the conversations' caches made again while the engine is quiet (`--adapt`,
docs/adaptation.md).

A swap drops every cached sequence (their keys and values are of the old weights), so each conversation's
next call would prefill its whole context again inside the call: on the real pair's 2-core CPU a call that
prefills a prompt took 0.8-0.9 s, one that finds its context cached a few ms. So once a swap is in, the
sessions the table holds are prefilled with the new weights by the adaptation's background work, under its
gate (drafter/server/adapt_work.py: only after the engine has answered nothing for its quiet spell, never in
a conversation's gaps, where on a shared CPU or GPU the time is the target's), before the cycle's next
round: the most recently used first, one session a piece, stopping for any request. A session whose call
came meanwhile is skipped (that call cached it), and sessions past half the KV pool are left to prefill
themselves: more would evict one another.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import numpy as np

from drafter.sessions.table import Session, SessionTable
from engine.engine import Engine
from engine.requests import DraftError, DraftRequest

log = logging.getLogger(__name__)

POOL_SHARE = 0.5  # of the KV pool's tokens, the most a swap's recaching fills


@dataclass(slots=True)
class RecacheCounters:
    sessions: int = 0  # prefilled again after a swap
    tokens: int = 0  # context tokens that took
    seconds: float = 0.0  # engine-thread time
    skipped: int = 0  # a call came first, or no room for it
    pending: int = 0  # still to do since the last swap

    def describe(self) -> dict:
        return {
            "sessions": self.sessions,
            "tokens": self.tokens,
            "seconds": round(self.seconds, 3),
            "skipped": self.skipped,
            "pending": self.pending,
        }


def recache(engine: Engine, context: np.ndarray | list[int], name: str) -> int:
    """Cache a session's context as its next call would (one step decoded past it, answered to no one and
    counted in no request statistics); the tokens prefilled."""
    return engine.draft_batch([DraftRequest(context, 1, name)], counted=False)[0].prefilled


class RecacheWork:
    def __init__(self, engine: Engine, sessions: SessionTable):
        self.engine, self.sessions = engine, sessions
        self.todo: list[tuple[Session, float, np.ndarray]] = []  # done from the end
        self.counters = RecacheCounters()

    def after_swap(self) -> None:
        """On the event loop, once a swap is in (no work of this runs then): what to prefill again, as
        (session, its `touched` now, its context), the most recently used last."""
        budget = int(POOL_SHARE * self.engine.pool.num_pages * self.engine.config.page_size)
        self.sessions.expire()
        todo = []
        for session in reversed(self.sessions.sessions.values()):  # most recently used first
            budget -= session.context_len
            if budget < 0:
                break
            if session.context_len >= 2:  # a lone token is no prefill
                todo.append((session, session.touched, session.context.copy()))
        todo.reverse()
        self.counters.skipped += len(self.todo)  # the last swap's leftovers: moot
        self.todo = todo
        self.counters.pending = len(todo)

    def work(self, stop) -> None:
        """On the engine thread: prefill sessions until `stop()` or all are done."""
        while self.todo and not stop():
            session, touched, context = self.todo.pop()
            current = self.sessions.sessions.get(session.name) is session
            if not current or session.touched != touched or session.in_flight:
                self.counters.skipped += 1
            else:
                began = time.perf_counter()
                try:
                    self.counters.tokens += recache(self.engine, context, session.name)
                    self.counters.sessions += 1
                except DraftError as error:  # no room beside the others now: its call will prefill it
                    log.info("not cached again after the swap: %s", error)
                    self.counters.skipped += 1
                self.counters.seconds += time.perf_counter() - began
            self.counters.pending = len(self.todo)
