"""When to stop asking a failing server: exponential backoff over consecutive failures, never shorter than the
server's `Retry-After`. While backing off the client answers "no drafts" at once, without a request, so a
target never waits on a server that is down, overloaded or not ready."""

from __future__ import annotations

import time
from collections.abc import Callable
from email.utils import parsedate_to_datetime


class Backoff:
    def __init__(self, base_s: float = 0.05, max_s: float = 5.0, clock: Callable[[], float] = time.monotonic):
        if not 0 < base_s <= max_s:
            raise ValueError(f"backoff needs 0 < base_s <= max_s, got {base_s} and {max_s}")
        self.base_s, self.max_s, self.clock = base_s, max_s, clock
        self.num_failures = 0
        self.until = 0.0  # clock() before which no request is sent

    @property
    def active(self) -> bool:
        return self.clock() < self.until

    def failed(self, retry_after_s: float | None = None) -> None:
        """Doubles the pause per consecutive failure up to max_s; the server's Retry-After wins when longer
        (it knows how long it needs: a model still loading says so)."""
        self.num_failures += 1
        delay = min(self.base_s * 2 ** (self.num_failures - 1), self.max_s)
        if retry_after_s is not None:
            delay = max(delay, retry_after_s)
        self.until = self.clock() + delay

    def succeeded(self) -> None:
        self.num_failures, self.until = 0, 0.0


def retry_after_seconds(header: str | None) -> float | None:
    """`Retry-After` as seconds: delta-seconds or an HTTP date (RFC 9110); None if absent or unreadable."""
    if header is None:
        return None
    text = header.strip()
    if text.isdigit():
        return float(text)
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None
    return max(when.timestamp() - time.time(), 0.0)
