"""The session table: per conversation, its sequence (the last call's context followed by the drafts returned
to it), the capability token that guards it, and its acceptance estimate, bounded in count and idle time.

A session name only addresses a session; its token (fresh, unguessable, made whenever a full-context call
rebuilds the session) is what lets a v2 call read the stored sequence, so one client never extends another's
context by guessing its name. Sequences are int64 numpy arrays that are never written in place: a call
snapshots what it read, drafts without holding anything, and `commit` swaps in new arrays afterwards.

This module knows nothing of HTTP, the engine or the KV cache: the engine may evict a conversation's cache at
any time and re-prefill it; a session is gone only when this table drops it (TTL, count, close, restart).
"""

from __future__ import annotations

import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from drafter.draft_length import Acceptance


class SessionUnknown(Exception):
    """The table does not hold this session, the token does not match, or prefix_len is past its sequence."""


@dataclass(slots=True, eq=False)
class Session:
    name: str
    token: str
    context_len: int  # length of the last call's context; the rest of `sequence` are the drafts returned
    sequence: np.ndarray  # int64 [context_len + num_drafts], never written in place
    acceptance: Acceptance  # this conversation's estimate, see drafter.draft_length
    touched: float  # clock time of the last call

    @property
    def drafts(self) -> np.ndarray:
        return self.sequence[self.context_len :]


def accepted_drafts(session: Session, context: np.ndarray, known_equal: int) -> int | None:
    """How many of the session's last drafts `context` kept: the common prefix of what follows the last
    context with those drafts. None when `context` does not extend the last context (a rollback or another
    conversation), since then the drafts were never verified. `context[:known_equal]` is known to equal
    the stored sequence (a v2 prefix), so only the rest is compared: O(new tokens) for v2 calls."""
    last_len, sequence = session.context_len, session.sequence
    if len(context) < last_len:
        return None
    if known_equal < last_len and not np.array_equal(
        context[known_equal:last_len], sequence[known_equal:last_len]
    ):
        return None
    drafts = session.drafts
    num_compared = min(len(context) - last_len, len(drafts))
    mismatches = np.flatnonzero(context[last_len : last_len + num_compared] != drafts[:num_compared])
    return int(mismatches[0]) if len(mismatches) else num_compared


class SessionTable:
    def __init__(
        self,
        max_sessions: int,
        ttl_s: float,
        max_draft_tokens: int,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.max_sessions, self.ttl_s, self.max_draft_tokens = max_sessions, ttl_s, max_draft_tokens
        self.clock = clock
        self.sessions: OrderedDict[str, Session] = OrderedDict()  # least recently used first
        self.num_expired = 0
        self.num_evicted = 0

    def __len__(self) -> int:
        self.expire()
        return len(self.sessions)

    def get(self, name: str) -> Session | None:
        self.expire()
        return self.sessions.get(name)

    def extend(
        self, name: str, token: str, prefix_len: int, new_tokens: np.ndarray
    ) -> tuple[Session, np.ndarray]:
        """A v2 call's session and full context (its sequence's first prefix_len tokens, then new_tokens),
        or SessionUnknown; nothing changes either way."""
        session = self.get(name)
        if session is None or not secrets.compare_digest(session.token, token):
            raise SessionUnknown
        if prefix_len > len(session.sequence):
            raise SessionUnknown
        return session, np.concatenate([session.sequence[:prefix_len], new_tokens])

    def commit(
        self,
        name: str,
        read: Session | None,
        rebuild: bool,
        context: np.ndarray,
        drafts: list[int],
        acceptance: Acceptance,
    ) -> str:
        """Store a finished call: its context and drafts become the sequence. A full-context call (rebuild)
        makes a fresh token; a v2 call keeps the one it was granted, and writes nothing when the session it
        read was closed or rebuilt while it drafted (its client will get a 409 and resync). Returns the
        session token the answer carries."""
        now = self.clock()
        sequence = np.concatenate([context, np.asarray(drafts, dtype=np.int64)])
        if not rebuild:
            assert read is not None
            if self.sessions.get(name) is read:
                read.context_len, read.sequence, read.acceptance = len(context), sequence, acceptance
                read.touched = now
                self.sessions.move_to_end(name)
            return read.token
        self.sessions.pop(name, None)
        session = Session(name, secrets.token_urlsafe(16), len(context), sequence, acceptance, now)
        self.sessions[name] = session
        while len(self.sessions) > self.max_sessions:
            self.sessions.popitem(last=False)
            self.num_evicted += 1
        return session.token

    def close(self, name: str, token: str) -> bool:
        session = self.get(name)
        if session is None or not secrets.compare_digest(session.token, token):
            return False
        del self.sessions[name]
        return True

    def expire(self) -> None:
        deadline = self.clock() - self.ttl_s
        while self.sessions:
            oldest = next(iter(self.sessions.values()))
            if oldest.touched >= deadline:
                return
            self.sessions.popitem(last=False)
            self.num_expired += 1

    def describe(self) -> dict:
        return {
            "live": len(self),
            "max_sessions": self.max_sessions,
            "ttl_s": self.ttl_s,
            "expired": self.num_expired,
            "evicted": self.num_evicted,
        }
