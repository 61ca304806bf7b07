"""The session table: capability tokens, v2 context reconstruction, acceptance from the next context, and
the count and idle-time bounds."""

from __future__ import annotations

import numpy as np
import pytest

from drafter.sessions.draft_length import Acceptance
from drafter.sessions.table import SessionTable, SessionUnknown, accepted_drafts


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def ids(*values) -> np.ndarray:
    return np.asarray(values, dtype=np.int64)


def sequence(session) -> list[int]:
    return session.context.tolist() + session.drafts.tolist()


def table(max_sessions: int = 4, ttl_s: float = 10.0, clock=None) -> SessionTable:
    return SessionTable(max_sessions, ttl_s, max_len=4096, clock=clock or Clock())


def rebuild(sessions: SessionTable, name: str, context, drafts) -> str:
    full = sessions.full_context(list(context))
    return sessions.commit(name, sessions.get(name), True, full, list(drafts), Acceptance())


def finish(sessions: SessionTable, name: str, token: str, prefix_len: int, new, drafts) -> np.ndarray:
    session, context = sessions.extend(name, token, prefix_len, ids(*new))
    sessions.commit(name, session, False, context, list(drafts), session.acceptance)
    return context


@pytest.mark.parametrize(
    "prefix_len, new, expected",
    [(5, [4], [1, 2, 3, 7, 8, 4]), (0, [5], [5]), (2, [5], [1, 2, 5]), (6, [], [1, 2, 3, 7, 8, 9])],
)
def test_session_extend_rebuilds_the_context_from_prefix_and_new_tokens(prefix_len, new, expected):
    sessions = table()
    token = rebuild(sessions, "a", [1, 2, 3], [7, 8, 9])
    session, context = sessions.extend("a", token, prefix_len, ids(*new))
    assert context.tolist() == expected
    assert sequence(session) == [1, 2, 3, 7, 8, 9]  # reading changes nothing a reader sees
    sessions.release(session)
    assert session.in_flight == 0


def test_session_forward_extension_writes_in_place_and_never_touches_what_the_engine_was_given():
    sessions = table()
    token = rebuild(sessions, "a", list(range(10)), [50, 51, 52])
    first = sessions.get("a").context
    context = finish(sessions, "a", token, 12, [99], [60, 61])  # two drafts kept, then the target's token
    assert context.base is first.base  # no copy: the new ids went into the buffer's free room
    assert first.tolist() == list(range(10))
    rolled = finish(sessions, "a", token, 4, [77], [62])  # a rollback copies into a new buffer
    assert rolled.base is not context.base
    assert context.tolist() == list(range(10)) + [50, 51, 99] and rolled.tolist() == [0, 1, 2, 3, 77]
    assert sequence(sessions.get("a")) == [0, 1, 2, 3, 77, 62]


def test_session_second_call_in_flight_copies_and_a_failed_call_changes_nothing():
    sessions = table()
    token = rebuild(sessions, "a", [1, 2, 3], [7, 8])
    session, first = sessions.extend("a", token, 4, ids(5))
    _, second = sessions.extend("a", token, 3, ids(6))  # the first still drafts from the buffer
    assert first.tolist() == [1, 2, 3, 7, 5] and second.tolist() == [1, 2, 3, 6]
    assert second.base is not first.base
    sessions.release(session)
    sessions.release(session)
    assert sequence(sessions.get("a")) == [1, 2, 3, 7, 8] and session.in_flight == 0


def test_session_buffer_grows_when_a_context_outgrows_it():
    sessions = table()
    token = rebuild(sessions, "a", [1], [2])
    long_tail = list(range(3000))
    context = finish(sessions, "a", token, 2, long_tail, [5])
    assert context.tolist() == [1, 2, *long_tail] and len(sessions.get("a").buffer) >= len(context)


@pytest.mark.parametrize(
    "name, token, prefix_len",
    [("b", None, 3), ("a", "wrong-token", 3), ("a", None, 7)],
    ids=["unknown name", "wrong token", "prefix past the sequence"],
)
def test_session_extend_refuses_unknown_sessions_wrong_tokens_and_long_prefixes(name, token, prefix_len):
    sessions = table()
    real = rebuild(sessions, "a", [1, 2, 3], [7, 8, 9])
    with pytest.raises(SessionUnknown):
        sessions.extend(name, token or real, prefix_len, ids(4))
    assert sequence(sessions.get("a")) == [1, 2, 3, 7, 8, 9]
    assert sessions.get("a").token == real


def test_session_token_is_new_on_every_rebuild_and_kept_by_extensions():
    sessions = table()
    first = rebuild(sessions, "a", [1, 2], [3])
    second = rebuild(sessions, "a", [1, 2], [3])
    assert first != second and len(second) >= 20
    session, context = sessions.extend("a", second, 3, ids(4))
    assert sessions.commit("a", session, False, context, [5, 6], session.acceptance) == second
    assert session.in_flight == 0
    assert sequence(sessions.get("a")) == [1, 2, 3, 4, 5, 6]
    assert sessions.get("a").context.tolist() == [1, 2, 3, 4]


def test_session_extension_finishing_after_a_close_or_rebuild_writes_nothing():
    sessions = table()
    token = rebuild(sessions, "a", [1, 2], [3])
    session, context = sessions.extend("a", token, 3, ids(4))
    assert sessions.close("a", token)
    sessions.commit("a", session, False, context, [5], session.acceptance)
    assert sessions.get("a") is None
    newer = rebuild(sessions, "a", [9], [9])
    sessions.commit("a", session, False, context, [5], session.acceptance)
    assert sessions.get("a").token == newer and sequence(sessions.get("a")) == [9, 9]


def test_session_close_needs_the_token():
    sessions = table()
    token = rebuild(sessions, "a", [1], [2])
    assert not sessions.close("a", "nope") and not sessions.close("b", token)
    assert sessions.close("a", token) and not sessions.close("a", token)


def test_session_table_drops_least_recently_used_past_its_count_and_idle_ones_past_ttl():
    clock = Clock()
    sessions = table(max_sessions=2, ttl_s=10.0, clock=clock)
    tokens = {name: rebuild(sessions, name, [1], [2]) for name in "ab"}
    clock.now = 5.0
    finish(sessions, "a", tokens["a"], 2, [3], [])  # "a" is now the most recent
    rebuild(sessions, "c", [1], [2])
    assert sessions.get("b") is None and sessions.get("a") is not None and len(sessions) == 2
    clock.now = 15.5  # "a" was touched at 5 and "c" at 5: both idle past 10 s
    assert len(sessions) == 0 and sessions.num_expired == 2 and sessions.num_evicted == 1


def session_with(context, drafts):
    sessions = table()
    rebuild(sessions, "s", context, drafts)
    return sessions.get("s")


@pytest.mark.parametrize(
    "new_context, known_equal, expected",
    [
        ([1, 2, 3, 7, 8, 9, 4], 0, 3),  # all drafts kept, plus the target's own token
        ([1, 2, 3, 7, 8, 5], 0, 2),  # two kept, the third replaced
        ([1, 2, 3, 5], 0, 0),  # the first draft rejected
        ([1, 2, 3, 7, 8, 5], 5, 2),  # the same, as a v2 call with prefix_len 5
        ([1, 2, 3, 7], 0, 1),  # a context that ends inside the drafts keeps what it has
        ([1, 2, 3], 0, 0),  # a retry of the same context
        ([1, 2], 0, None),  # a rollback into the old context: the drafts were never verified
        ([1, 9, 3, 7], 0, None),  # a different conversation under the same name
        ([1, 9, 3, 7], 1, None),  # ... found by comparing only past prefix_len
    ],
)
def test_accepted_drafts_is_the_common_prefix_with_the_last_drafts(new_context, known_equal, expected):
    session = session_with([1, 2, 3], [7, 8, 9])
    assert accepted_drafts(session, ids(*new_context), known_equal) == expected
