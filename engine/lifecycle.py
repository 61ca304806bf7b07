"""The engine's observable phases: loading → compiling → capturing → ready, or failed with a reason.

The server reports this object as is on `/health/ready` and `/info`; it is written by the engine thread
and read by the event loop, so every update replaces whole values (no torn reads of a half-built dict).
"""

from __future__ import annotations

import enum
import logging
import time
from contextlib import contextmanager

log = logging.getLogger(__name__)


class State(enum.StrEnum):
    LOADING = "loading"
    COMPILING = "compiling"
    CAPTURING = "capturing"
    READY = "ready"
    FAILED = "failed"


class Lifecycle:
    def __init__(self):
        self.state = State.LOADING
        self.reason: str | None = None  # why it failed
        self.stage_seconds: dict[str, float] = {}
        self.captured: dict = {}  # what the CUDA graphs cover, once captured
        self.fallbacks: list[str] = []  # what did not work and what runs instead

    @contextmanager
    def stage(self, state: State):
        """Enter `state` and record how long it took (stages are named by their state)."""
        self.state = state
        start = time.perf_counter()
        try:
            yield
        finally:
            self.stage_seconds = self.stage_seconds | {state.value: round(time.perf_counter() - start, 3)}

    def fall_back(self, what: str) -> None:
        log.warning("%s", what)
        # A compiler error can run to megabytes; readiness shows its first line, the log keeps all of it.
        first = what.splitlines()[0] if what else what
        self.fallbacks = [*self.fallbacks, first[:500]]

    def fail(self, reason: str) -> None:
        log.error("engine failed: %s", reason)
        self.reason = reason
        self.state = State.FAILED

    @property
    def ready(self) -> bool:
        return self.state is State.READY

    def snapshot(self) -> dict:
        return {
            "state": self.state.value,
            "reason": self.reason,
            "stage_seconds": self.stage_seconds,
            "captured": self.captured,
            "fallbacks": self.fallbacks,
        }
