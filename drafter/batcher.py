"""Concurrent requests → one `draft_batch` on the engine thread, with a bounded queue and deadlines.

One dispatcher task runs batches one after another. While the engine is busy, arriving requests queue up
and form the next batch; when it is idle, the first request waits at most `window_s` for companions (the
window is sub-millisecond, so it is spent yielding to the event loop, whose timers are only ms-precise).
A request that cannot queue fails at once (`QueueFull`), one still queued at its deadline fails
(`Expired`), and one withdrawn (client gone) is simply never drafted. The batcher knows nothing of HTTP.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from drafter.draft_length import Load
from drafter.engine_thread import EngineThread
from drafter.metrics import Metrics
from engine.requests import DraftError, DraftRequest, DraftResult

log = logging.getLogger(__name__)


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


class Batcher:
    def __init__(
        self,
        engine_thread: EngineThread,
        draft_batch: Callable[[list[DraftRequest]], list[DraftResult]],
        max_batch_size: int,
        max_queue: int,
        window_s: float,
        metrics: Metrics,
        on_engine_failure: Callable[[BaseException], None],
        on_decode: Callable[[float, int], None] = lambda decode_ms, num_steps: None,
    ):
        self.engine_thread, self.draft_batch = engine_thread, draft_batch
        self.max_batch_size, self.max_queue, self.window_s = max_batch_size, max_queue, window_s
        self.metrics, self.on_engine_failure, self.on_decode = metrics, on_engine_failure, on_decode
        self.waiting: deque[Pending] = deque()
        self.running = 0  # requests in the batch on the engine now
        self.wakeup = asyncio.Event()
        self.failure: BaseException | None = None
        self.task: asyncio.Task | None = None

    def start(self) -> None:
        self.task = asyncio.create_task(self.run(), name="drafter-batcher")

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
        self.fail_waiting(EngineFailed("server stopped"))

    def submit(self, request: DraftRequest, timeout_s: float) -> Pending:
        if self.failure is not None:
            raise EngineFailed(str(self.failure))
        if len(self.waiting) >= self.max_queue:
            raise QueueFull
        now = asyncio.get_running_loop().time()
        pending = Pending(request, now, now + timeout_s)
        self.waiting.append(pending)
        self.metrics.queue_depth.set(len(self.waiting))
        self.wakeup.set()
        return pending

    def load(self) -> Load:
        return Load(queue_depth=len(self.waiting), running=self.running)

    def withdraw(self, pending: Pending) -> bool:
        """Take a request out of the queue; False if its batch has already started."""
        try:
            self.waiting.remove(pending)
        except ValueError:
            return False
        self.metrics.queue_depth.set(len(self.waiting))
        return True

    async def run(self) -> None:
        while True:
            if not self.waiting:
                self.wakeup.clear()
                await self.wakeup.wait()
                await self.gather()
            batch = self.take()
            if batch:
                await self.dispatch(batch)

    async def gather(self) -> None:
        """Give requests already on their way a chance to join the first one."""
        loop = asyncio.get_running_loop()
        end = loop.time() + self.window_s
        while len(self.waiting) < self.max_batch_size and (remaining := end - loop.time()) > 0:
            await asyncio.sleep(0 if remaining < 0.002 else 0.001)

    def take(self) -> list[Pending]:
        now = asyncio.get_running_loop().time()
        batch = []
        while self.waiting and len(batch) < self.max_batch_size:
            pending = self.waiting.popleft()
            if pending.future.done():  # its handler gave up on it
                continue
            if now > pending.deadline:
                pending.future.set_exception(Expired())
                continue
            pending.started = now
            batch.append(pending)
        self.metrics.queue_depth.set(len(self.waiting))
        return batch

    async def dispatch(self, batch: list[Pending]) -> None:
        for pending in batch:
            self.metrics.queue_wait_seconds.observe(pending.started - pending.arrived)
        self.running = len(batch)
        try:
            results = await self.engine_thread.run(self.draft_batch, [p.request for p in batch])
        except DraftError as error:
            # The server validates exactly what the engine checks, so this is a bug; never let one bad
            # request fail its companions.
            log.error("engine refused a validated request: %s", error)
            if len(batch) == 1:
                batch[0].future.set_exception(error)
                return
            for pending in batch:
                await self.dispatch([pending])
            return
        except Exception as error:  # noqa: BLE001 - a device error the engine cannot recover from
            self.failure = error
            self.on_engine_failure(error)
            for pending in batch:
                pending.future.set_exception(EngineFailed(str(error)))
            self.fail_waiting(EngineFailed(str(error)))
            return
        finally:
            self.running = 0
        self.record(results)
        self.on_decode(results[0].decode_ms, max(p.request.num_draft_tokens for p in batch))
        for pending, result in zip(batch, results, strict=True):
            if not pending.future.done():
                pending.future.set_result(result)

    def record(self, results: list[DraftResult]) -> None:
        metrics = self.metrics
        metrics.batch_size.observe(len(results))
        metrics.prefill_seconds.observe(results[0].prefill_ms / 1e3)
        metrics.decode_seconds.observe(results[0].decode_ms / 1e3)
        for result in results:
            metrics.cache_tokens.labels("reused").inc(result.cached)
            metrics.cache_tokens.labels("prefilled").inc(result.prefilled)
            metrics.shared_tokens.inc(result.shared)
            metrics.evictions.inc(int(result.evicted))

    def fail_waiting(self, error: Exception) -> None:
        while self.waiting:
            pending = self.waiting.popleft()
            if not pending.future.done():
                pending.future.set_exception(error)
        self.metrics.queue_depth.set(0)
