"""The engine's side of drafting ahead: branches, the top choices that name them, and the adoptions and drops
other threads ask for.

While the target verifies a session's drafts, the server drafts the session's likely next contexts (the
drafts it will keep, then the target's own token: drafter/sessions/ahead.py) as *branches*: sequences of the
cache table that share the session's full pages and copy its partly filled one (nothing to prefill: the
session's sequence already holds the kept drafts' keys), drafted in one batched decode loop that stops
between steps when a real request comes in, so a real request waits at most one decode step. They
are ordinary sequences to the decode loop, so a branch's drafts are exactly those a call with its context
would get. The session's next call either matches one — the branch becomes the session's sequence — or
drops them all.

Those decisions are made on the event loop, but the cache table belongs to whichever thread drafts, so they
are queued here and applied at the start of the next engine job.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass

from engine.cache.sequences import Sequence, SequenceTable
from engine.requests import DraftResult


@dataclass(frozen=True, slots=True)
class AheadBranch:
    result: DraftResult  # the branch's drafts, as a call with its context gets them
    sequence: Sequence  # an opaque handle for `BranchOps.adopt`


def top_choices(row: list[float], count: int) -> list[list[tuple[int, float]]]:
    """A read-back row of [steps, 2 * count] floats (per step: ids, then probabilities) as per-step
    (id, probability) pairs."""
    if not count:
        return []
    width = 2 * count
    return [
        list(zip(map(int, row[i : i + count]), row[i + count : i + width], strict=True))
        for i in range(0, len(row), width)
    ]


class BranchOps:
    """Adoptions and drops asked from any thread; deque appends and pops are atomic, so no lock."""

    def __init__(self):
        self.queue: collections.deque = collections.deque()

    def adopt(self, session: str, sequence: Sequence) -> None:
        self.queue.append((session, sequence))

    def drop(self, session: str) -> None:
        self.queue.append((session, None))

    def apply(self, table: SequenceTable) -> None:
        while self.queue:
            session, sequence = self.queue.popleft()
            if sequence is None:
                table.drop_branches(session)
            else:
                table.adopt(session, sequence)
