"""The thread that owns the device: load, warmup and every draft batch run here, one after another.

Compiled and graph-captured code is not thread-safe, so the engine is only ever called by one thread at a
time: this one, or the event loop's own thread for a lone short draft while this one is idle (the batcher
guarantees it: drafter/scheduling/inline.py). The thread is a daemon, and `stop` does not wait for it: a SIGTERM during
a minutes-long load or warmup ends the process instead of waiting (a ThreadPoolExecutor's workers are
joined at interpreter exit).

The hand-off is as short as asyncio allows: a job's outcome comes back as one `call_soon_threadsafe` of its
callback. (`run_in_executor` / `wrap_future` go through a concurrent.futures.Future, its lock and two more
event-loop hops: ~0.1 ms per draft on a 2-core machine.)
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

Done = Callable[[Any, BaseException | None], None]  # (result, error), called on the event loop


class EngineThread:
    def __init__(self, name: str = "drafter-engine"):
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.thread = threading.Thread(target=self.work, name=name, daemon=True)
        self.thread.start()

    def work(self) -> None:
        while True:
            job = self.jobs.get()
            if job is None:
                return
            loop, done, fn, args = job
            result, error = None, None
            try:
                result = fn(*args)
            except BaseException as caught:  # noqa: BLE001 - handed to the event loop
                error = caught
            try:
                loop.call_soon_threadsafe(done, result, error)
            except RuntimeError:  # the loop has closed: the server stopped while this job ran
                log.debug("engine job finished after the event loop closed")

    def post(self, done: Done, fn: Callable[..., Any], *args) -> None:
        """Queue `fn(*args)` on the engine thread; `done(result, error)` then runs on this event loop."""
        self.jobs.put((asyncio.get_running_loop(), done, fn, args))

    def run(self, fn: Callable[..., Any], *args) -> asyncio.Future:
        """Queue `fn(*args)` on the engine thread; await the returned future on the event loop."""
        future = asyncio.get_running_loop().create_future()

        def settle(result: Any, error: BaseException | None) -> None:
            if future.cancelled():  # its awaiter gave up while the job ran
                return
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(result)

        self.post(settle, fn, *args)
        return future

    def stop(self, timeout_s: float) -> bool:
        """Let queued jobs finish, then end the thread; False if it is still busy after `timeout_s`."""
        self.jobs.put(None)
        self.thread.join(timeout_s)
        return not self.thread.is_alive()
