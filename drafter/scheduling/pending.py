"""The handler's side of the batcher (drafter/scheduling/batcher.py): the `Pending` request it gets back from
`submit` (a future, its arrival, its deadline, when its batch started), the ways that ends other than in
drafts (`QueueFull` at once, `Expired` still queued at its deadline, `EngineFailed`), and the `with` blocks
that tell an idle engine companions are on their way: `Arrival` around reading and checking a body,
`Together` around queueing several requests (a /draft/batch).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from engine.requests import DraftRequest

if TYPE_CHECKING:
    from drafter.scheduling.batcher import Batcher


class QueueFull(Exception):
    pass


class Expired(Exception):
    pass


class EngineFailed(Exception):
    pass


@dataclass(slots=True, eq=False)
class Pending:
    request: DraftRequest
    arrived: float  # event-loop time
    deadline: float  # it must start on the engine before this
    future: asyncio.Future = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    started: float | None = None  # when its batch went to the engine


class Arrival:
    """A handler reading and checking a body: a companion on its way (a class, not a generator-based
    context manager: this is on every request)."""

    __slots__ = ("batcher",)

    def __init__(self, batcher: Batcher):
        self.batcher = batcher

    def __enter__(self) -> None:
        batcher = self.batcher
        if batcher.running or batcher.waiting:
            batcher.contended()
        batcher.arriving += 1

    def __exit__(self, kind, error, traceback) -> None:
        self.batcher.arriving -= 1
        self.batcher.pump()


class Together:
    """`with batcher.together():` around queueing several requests (a /draft/batch), so no batch starts
    before they are all queued: they share the next batch (up to the max batch size) whatever the window."""

    __slots__ = ("batcher",)

    def __init__(self, batcher: Batcher):
        self.batcher = batcher

    def __enter__(self) -> None:
        self.batcher.holding += 1

    def __exit__(self, kind, error, traceback) -> None:
        self.batcher.holding -= 1
        self.batcher.pump()
