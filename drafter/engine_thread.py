"""The one thread that owns the device: load, warmup and every draft batch run here, one after another.

Compiled and graph-captured code is not thread-safe, so nothing else may call the engine. The thread is a
daemon, and `stop` does not wait for it: a SIGTERM during a minutes-long load or warmup ends the process
instead of waiting (a ThreadPoolExecutor's workers are joined at interpreter exit).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)


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
            future, fn, args = job
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = fn(*args)
            except BaseException as error:  # noqa: BLE001 - handed to the awaiting coroutine
                future.set_exception(error)
            else:
                future.set_result(result)

    def run(self, fn: Callable[..., Any], *args) -> asyncio.Future:
        """Queue `fn(*args)` on the engine thread; await the returned future on the event loop."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        self.jobs.put((future, fn, args))
        return asyncio.wrap_future(future)

    def stop(self, timeout_s: float) -> bool:
        """Let queued jobs finish, then end the thread; False if it is still busy after `timeout_s`."""
        self.jobs.put(None)
        self.thread.join(timeout_s)
        return not self.thread.is_alive()
