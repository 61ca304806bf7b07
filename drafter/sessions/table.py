"""The session table: per conversation, its sequence (the last call's context followed by the drafts returned
to it), the capability token that guards it, and its acceptance estimate, bounded in count and idle time.

A session name only addresses a session; its token (fresh, unguessable, made whenever a full-context call
rebuilds the session) is what lets a v2 call read the stored sequence, so one client never extends another's
context by guessing its name.

Why a buffer: the engine needs each call's whole context as one int64 array, and copying 32k ids per call
costs more than everything else a v2 call does. So a session keeps its last context as the head of a
buffer with room to grow, and a v2 call that goes forward (prefix_len at or past the last context) writes
its accepted drafts and new tokens into the free room after it: O(new tokens), and the context it hands
the engine is a view of the buffer. Nothing the engine was ever handed is written again: a rollback, a
second call of the session still in flight, or a full buffer copies into a new buffer instead (and a
full-context call always starts one). The drafts live apart from the buffer, so the room after the
context is scratch that no reader relies on, and a call that fails leaves the session as it was.

This module knows nothing of HTTP, the engine or the KV cache: the engine may evict a conversation's cache at
any time and re-prefill it; a session is gone only when this table drops it (TTL, count, close, restart).
"""

from __future__ import annotations

import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from drafter.sessions.draft_length import Acceptance
from drafter.sessions.draft_source import SuffixTrack
from drafter.sessions.suffix_index import SuffixDraft

NEW_TRACK = SuffixTrack()  # frozen: one shared default
MIN_CAPACITY = 1024  # ids; a buffer grows by doubling, so a conversation copies O(log length) times


class SessionUnknown(Exception):
    """The table does not hold this session, the token does not match, or prefix_len is past its sequence."""


@dataclass(slots=True, eq=False)
class Session:
    name: str
    token: str
    buffer: np.ndarray  # int64 [capacity]: the last context, then scratch room
    context_len: int  # the last call's context is buffer[:context_len]
    drafts: np.ndarray  # int64 [k], the drafts returned to the last call
    acceptance: Acceptance  # this conversation's estimate for model drafts, see drafter.sessions.draft_length
    touched: float  # clock time of the last call
    in_flight: int = 0  # v2 calls drafting from this session now
    suffix_track: SuffixTrack = NEW_TRACK  # how its suffix drafts fared (drafter.sessions.draft_source)
    head_len: int = 0  # of `drafts`, how many came from the suffix index (the first ones)
    suffix_draft: SuffixDraft | None = None  # the last call's suffix lookup, sent or not, judged by the next
    answered: float = (
        0.0  # perf_counter when the last call's answer left: its next call's gap is the target's
    )
    pass_rows: int = 1  # the rows of the target's pass that answer went into (a /draft/batch request's)
    pass_drafts: int = 0  # and the drafts sent to all of them
    engine_len: int = 0  # the context length the engine last drafted from: its cache holds about that much

    @property
    def context(self) -> np.ndarray:
        return self.buffer[: self.context_len]

    @property
    def sequence_len(self) -> int:
        return self.context_len + len(self.drafts)


def token_matches(session: Session | None, token: str) -> bool:
    """Whether `token` is the session's, in constant time. As bytes: a token from a JSON body or a header may
    hold any character, and compare_digest refuses non-ASCII str."""
    return session is not None and secrets.compare_digest(
        session.token.encode(), token.encode("utf-8", "replace")
    )


def new_buffer(length: int, max_len: int) -> np.ndarray:
    return np.empty(min(max(2 * length, MIN_CAPACITY), max(max_len, length)), dtype=np.int64)


def accepted_drafts(session: Session, context: np.ndarray, known_equal: int) -> int | None:
    """How many of the session's last drafts `context` kept: the common prefix of what follows the last
    context with those drafts. None when `context` does not extend the last context (a rollback or another
    conversation), since then the drafts were never verified. `context[:known_equal]` is known to equal
    the stored sequence (a v2 prefix), so only the rest is compared: O(new tokens) for v2 calls."""
    last, drafts = session.context, session.drafts
    last_len = len(last)
    if len(context) < last_len:
        return None
    if known_equal < last_len and not np.array_equal(context[known_equal:last_len], last[known_equal:]):
        return None
    num_compared = min(len(context) - last_len, len(drafts))
    # At most max_draft_tokens ids: Python lists beat numpy's per-call overhead at this size.
    kept = context[last_len : last_len + num_compared].tolist()
    for position, (token, draft) in enumerate(zip(kept, drafts[:num_compared].tolist(), strict=True)):
        if token != draft:
            return position
    return num_compared


class SessionTable:
    def __init__(
        self,
        max_sessions: int,
        ttl_s: float,
        max_len: int,
        clock: Callable[[], float] = time.monotonic,
        on_drop: Callable[[str], None] = lambda name: None,  # a session left the table (its name)
    ):
        self.max_sessions, self.ttl_s, self.max_len = max_sessions, ttl_s, max_len  # max_len: longest context
        self.clock, self.on_drop = clock, on_drop
        self.sessions: OrderedDict[str, Session] = OrderedDict()  # least recently used first
        self.num_expired = 0
        self.num_evicted = 0

    def __len__(self) -> int:
        self.expire()
        return len(self.sessions)

    def get(self, name: str) -> Session | None:
        self.expire()
        return self.sessions.get(name)

    def full_context(self, tokens: Sequence[int]) -> np.ndarray:
        """A full-context call's context, converted once into the head of a new session buffer."""
        buffer = new_buffer(len(tokens), self.max_len)
        buffer[: len(tokens)] = tokens
        return buffer[: len(tokens)]

    def extend(
        self, name: str, token: str, prefix_len: int, new_tokens: np.ndarray
    ) -> tuple[Session, np.ndarray]:
        """A v2 call's session and whole context (the sequence's first prefix_len tokens, then new_tokens),
        or SessionUnknown. The call then holds the session until `commit` or `release`."""
        session = self.get(name)
        if not token_matches(session, token):
            raise SessionUnknown
        if prefix_len > session.sequence_len:
            raise SessionUnknown
        last_len, end = session.context_len, prefix_len + len(new_tokens)
        num_kept = max(prefix_len - last_len, 0)  # drafts the new context keeps
        if prefix_len >= last_len and session.in_flight == 0 and end <= len(session.buffer):
            buffer = session.buffer  # forward, alone, with room: write only into the scratch room
        else:
            buffer = new_buffer(end, self.max_len)
            buffer[: min(prefix_len, last_len)] = session.buffer[: min(prefix_len, last_len)]
        buffer[last_len : last_len + num_kept] = session.drafts[:num_kept]
        buffer[prefix_len:end] = new_tokens
        session.in_flight += 1
        return session, buffer[:end]

    def release(self, session: Session) -> None:
        """A v2 call that holds `session` failed: the session stays as it was."""
        session.in_flight -= 1

    def commit(
        self,
        name: str,
        read: Session | None,
        rebuild: bool,
        context: np.ndarray,
        drafts: list[int],
        acceptance: Acceptance,
        suffix_track: SuffixTrack = NEW_TRACK,
        head_len: int = 0,
        suffix_draft: SuffixDraft | None = None,
        target_pass: tuple[int, int] = (1, 0),  # (rows, drafts in all) of the pass the answer goes into
        engine_len: int = 0,  # the context length the engine last drafted from for this session
    ) -> str:
        """Store a finished call: its context (a view of a session buffer, from `extend` or `full_context`)
        and drafts become the sequence. A full-context call (rebuild) makes a fresh token; a v2 call keeps
        the one it was granted, and writes nothing when the session it read was closed or rebuilt while it
        drafted (its client will get a 409 and resync). Returns the session token the answer carries."""
        now, draft_array = self.clock(), np.asarray(drafts, dtype=np.int64)
        assert context.base is not None  # a view of a session buffer
        if not rebuild:
            assert read is not None
            read.in_flight -= 1
            if self.sessions.get(name) is read:
                read.buffer, read.context_len, read.drafts = context.base, len(context), draft_array
                read.acceptance, read.touched, read.answered = acceptance, now, time.perf_counter()
                read.suffix_track, read.head_len, read.suffix_draft = suffix_track, head_len, suffix_draft
                read.pass_rows, read.pass_drafts = target_pass
                read.engine_len = engine_len
                self.sessions.move_to_end(name)
            return read.token
        self.sessions.pop(name, None)
        token = secrets.token_urlsafe(16)
        self.sessions[name] = Session(
            name,
            token,
            context.base,
            len(context),
            draft_array,
            acceptance,
            now,
            suffix_track=suffix_track,
            head_len=head_len,
            suffix_draft=suffix_draft,
            answered=time.perf_counter(),
            pass_rows=target_pass[0],
            pass_drafts=target_pass[1],
            engine_len=engine_len,
        )
        while len(self.sessions) > self.max_sessions:
            evicted, _ = self.sessions.popitem(last=False)
            self.num_evicted += 1
            self.on_drop(evicted)
        return token

    def close(self, name: str, token: str) -> bool:
        session = self.get(name)
        if not token_matches(session, token):
            return False
        del self.sessions[name]
        self.on_drop(name)
        return True

    def expire(self) -> None:
        deadline = self.clock() - self.ttl_s
        while self.sessions:
            oldest = next(iter(self.sessions.values()))
            if oldest.touched >= deadline:
                return
            expired, _ = self.sessions.popitem(last=False)
            self.num_expired += 1
            self.on_drop(expired)

    def describe(self) -> dict:
        return {
            "live": len(self),
            "max_sessions": self.max_sessions,
            "ttl_s": self.ttl_s,
            "expired": self.num_expired,
            "evicted": self.num_evicted,
        }
