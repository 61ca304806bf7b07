"""Which drafter session holds each of vLLM's batch rows. vLLM hands a proposer its batch as rows of token
ids, with no request ids, and moves a request to another row when others finish; so a row is matched to a
session by its tokens: a session fits a row whose context begins with the context of the session's last
call (a request only ever grows between two of its steps). No I/O here: the proposer
(drafter/integrations/vllm_proposer.py) makes and closes the sessions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

Session = TypeVar("Session")

# A request missing from this many steps in a row has finished (or was preempted: it comes back as a fresh
# session, which the server's prefix cache still serves from the pages it holds).
DEFAULT_MAX_IDLE_STEPS = 16


@dataclass(slots=True)
class Tracked(Generic[Session]):
    session: Session
    context: list[int]  # the context of its last call
    row: int  # the row it had then
    idle_steps: int = 0


def extends(context: list[int], earlier: list[int]) -> bool:
    """Whether `context` begins with `earlier` (cheap checks of both ends first, then a C-speed compare)."""
    n = len(earlier)
    return (
        len(context) >= n > 0
        and context[0] == earlier[0]
        and context[n - 1] == earlier[-1]
        and context[:n] == earlier
    )


class RowSessions(Generic[Session]):
    def __init__(self, new_session: Callable[[], Session], max_idle_steps: int = DEFAULT_MAX_IDLE_STEPS):
        if max_idle_steps < 0:
            raise ValueError(f"max_idle_steps must be >= 0, got {max_idle_steps}")
        self.new_session, self.max_idle_steps = new_session, max_idle_steps
        self.tracked: list[Tracked[Session]] = []

    def assign(self, contexts: dict[int, list[int]]) -> tuple[dict[int, Session], list[Session]]:
        """row -> session for this step's rows (a new session for a request not seen before), and the
        sessions of requests gone for more than `max_idle_steps` steps, for the caller to close."""
        by_row = {tracked.row: tracked for tracked in self.tracked}
        taken: dict[int, Tracked[Session]] = {}  # row -> its session this step
        used: set[int] = set()  # id() of the Tracked already taken
        unmatched = []
        for row, context in contexts.items():  # most requests keep their row: try it first
            tracked = by_row.get(row)
            if tracked is not None and extends(context, tracked.context):
                taken[row] = tracked
                used.add(id(tracked))
            else:
                unmatched.append(row)
        for row in unmatched:  # moved rows, then new requests
            context = contexts[row]
            candidates = (t for t in self.tracked if id(t) not in used and extends(context, t.context))
            tracked = max(candidates, key=lambda t: len(t.context), default=None)
            if tracked is None:
                tracked = Tracked(self.new_session(), context, row)
                self.tracked.append(tracked)
            taken[row] = tracked
            used.add(id(tracked))
        gone = []
        for tracked in self.tracked:
            if id(tracked) in used:
                continue
            tracked.idle_steps += 1
            if tracked.idle_steps > self.max_idle_steps:
                gone.append(tracked)
        if gone:
            gone_ids = {id(t) for t in gone}
            self.tracked = [t for t in self.tracked if id(t) not in gone_ids]
        for row, tracked in taken.items():
            tracked.context, tracked.row, tracked.idle_steps = contexts[row], row, 0
        return {row: tracked.session for row, tracked in taken.items()}, [t.session for t in gone]

    def clear(self) -> list[Session]:
        """Forgets every request; returns their sessions to close."""
        sessions = [tracked.session for tracked in self.tracked]
        self.tracked = []
        return sessions

    def __len__(self) -> int:
        return len(self.tracked)
