"""The session table: capability tokens, v2 context reconstruction, acceptance from the next context, and
the count and idle-time bounds."""

from __future__ import annotations

import numpy as np
import pytest

from drafter.draft_length import Acceptance
from drafter.sessions import SessionTable, SessionUnknown, accepted_drafts


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def ids(*values) -> np.ndarray:
    return np.asarray(values, dtype=np.int64)


def table(max_sessions: int = 4, ttl_s: float = 10.0, clock=None) -> SessionTable:
    return SessionTable(max_sessions, ttl_s, max_draft_tokens=8, clock=clock or Clock())


def rebuild(sessions: SessionTable, name: str, context, drafts) -> str:
    return sessions.commit(name, sessions.get(name), True, ids(*context), list(drafts), Acceptance())


def test_session_extend_rebuilds_the_context_from_prefix_and_new_tokens():
    sessions = table()
    token = rebuild(sessions, "a", [1, 2, 3], [7, 8, 9])
    session, context = sessions.extend("a", token, 5, ids(4))
    assert context.tolist() == [1, 2, 3, 7, 8, 4]
    assert session.sequence.tolist() == [1, 2, 3, 7, 8, 9]  # reading changes nothing
    assert sessions.extend("a", token, 0, ids(5))[1].tolist() == [5]
    assert sessions.extend("a", token, 6, ids())[1].tolist() == [1, 2, 3, 7, 8, 9]


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
    assert sessions.get("a").sequence.tolist() == [1, 2, 3, 7, 8, 9]
    assert sessions.get("a").token == real


def test_session_token_is_new_on_every_rebuild_and_kept_by_extensions():
    sessions = table()
    first = rebuild(sessions, "a", [1, 2], [3])
    second = rebuild(sessions, "a", [1, 2], [3])
    assert first != second and len(second) >= 20
    session, context = sessions.extend("a", second, 3, ids(4))
    assert sessions.commit("a", session, False, context, [5, 6], session.acceptance) == second
    assert sessions.get("a").sequence.tolist() == [1, 2, 3, 4, 5, 6]
    assert sessions.get("a").context_len == 4


def test_session_extension_finishing_after_a_close_or_rebuild_writes_nothing():
    sessions = table()
    token = rebuild(sessions, "a", [1, 2], [3])
    session, context = sessions.extend("a", token, 3, ids(4))
    assert sessions.close("a", token)
    sessions.commit("a", session, False, context, [5], session.acceptance)
    assert sessions.get("a") is None
    newer = rebuild(sessions, "a", [9], [9])
    sessions.commit("a", session, False, context, [5], session.acceptance)
    assert sessions.get("a").token == newer and sessions.get("a").sequence.tolist() == [9, 9]


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
    session, context = sessions.extend("a", tokens["a"], 2, ids(3))
    sessions.commit("a", session, False, context, [], session.acceptance)  # "a" is now the most recent
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
