"""Which drafter session holds each of vLLM's batch rows. vLLM hands a proposer its batch as rows of token
ids, with no request ids, and moves a request to another row when others finish; so a row is matched to a
session by its tokens: a session fits a row whose context begins with the context of the session's last
call (a request only ever grows between two of its steps). No I/O here: the proposer
(drafter/integrations/vllm_proposer.py) makes and closes the sessions.

Rows come as numpy views of vLLM's token array. A step's work per row is O(new tokens) in Python: the match
is a numpy compare (C speed, ~6 us at 8k tokens), and the Python list of the row's context, which the client
needs, grows by the new tokens only instead of being rebuilt from the array (~95 us at 8k).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import numpy as np

Session = TypeVar("Session")

# A request missing from this many steps in a row has finished (or was preempted: it comes back as a fresh
# session, which the server's prefix cache still serves from the pages it holds).
DEFAULT_MAX_IDLE_STEPS = 16


@dataclass(slots=True)
class Tracked(Generic[Session]):
    session: Session
    row: int  # its row at its last step
    array: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))  # its context then
    tokens: list[int] = field(default_factory=list)  # the same, as the list the client sends from
    known_len: int = 0  # this step: how many leading tokens were already its context last step
    idle_steps: int = 0

    def fits(self, context: np.ndarray) -> bool:
        """Whether `context` begins with this request's last context (both ends first: cheap rejections)."""
        n = len(self.array)
        return (
            len(context) >= n > 0
            and context[0] == self.array[0]
            and context[n - 1] == self.array[-1]
            and np.array_equal(context[:n], self.array)
        )

    def take(self, context: np.ndarray, row: int) -> None:
        """This step's context: the list grows by what is new (all of it for a new request)."""
        self.known_len = len(self.array)
        self.tokens.extend(context[self.known_len :].tolist())
        self.array, self.row, self.idle_steps = context.copy(), row, 0


class RowSessions(Generic[Session]):
    def __init__(self, new_session: Callable[[], Session], max_idle_steps: int = DEFAULT_MAX_IDLE_STEPS):
        if max_idle_steps < 0:
            raise ValueError(f"max_idle_steps must be >= 0, got {max_idle_steps}")
        self.new_session, self.max_idle_steps = new_session, max_idle_steps
        self.tracked: list[Tracked[Session]] = []

    def assign(self, contexts: dict[int, np.ndarray]) -> tuple[dict[int, Tracked[Session]], list[Session]]:
        """row -> its request's Tracked for this step's rows (new for a request not seen before; `tokens` is
        the row's context as a list, `known_len` how much of it the session already had), and the sessions of
        requests gone for more than `max_idle_steps` steps, for the caller to close."""
        by_row = {tracked.row: tracked for tracked in self.tracked}
        taken: dict[int, Tracked[Session]] = {}
        used: set[int] = set()  # id() of the Tracked already taken this step
        unmatched = []
        for row, context in contexts.items():  # most requests keep their row: try it first
            tracked = by_row.get(row)
            if tracked is not None and tracked.fits(context):
                taken[row] = tracked
                used.add(id(tracked))
            else:
                unmatched.append(row)
        for row in unmatched:  # moved rows, then new requests
            context = contexts[row]
            candidates = (t for t in self.tracked if id(t) not in used and t.fits(context))
            tracked = max(candidates, key=lambda t: len(t.array), default=None)
            if tracked is None:
                tracked = Tracked(self.new_session(), row)
                self.tracked.append(tracked)
            taken[row] = tracked
            used.add(id(tracked))
        gone = []
        for tracked in self.tracked:
            if id(tracked) not in used:
                tracked.idle_steps += 1
                if tracked.idle_steps > self.max_idle_steps:
                    gone.append(tracked)
        if gone:
            gone_ids = {id(t) for t in gone}
            self.tracked = [t for t in self.tracked if id(t) not in gone_ids]
        for row, tracked in taken.items():
            tracked.take(contexts[row], row)
        return taken, [t.session for t in gone]

    def clear(self) -> list[Session]:
        """Forgets every request; returns their sessions to close."""
        sessions = [tracked.session for tracked in self.tracked]
        self.tracked = []
        return sessions

    def __len__(self) -> int:
        return len(self.tracked)
