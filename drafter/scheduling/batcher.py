"""Concurrent requests → one `draft_batch` on the engine thread, with a bounded queue and deadlines.

Event-driven, no task of its own: a batch starts the moment the engine is idle and the queue is ready
(`pump`, called on every submit, on every finished batch and whenever a request stops arriving). While the
engine is busy, arriving requests queue up and form the next batch. When it is idle, the first request
waits for companions only if some are on their way (a handler reading or checking its body: `arriving`),
and at most `window_s`; a lone client never waits. A request that cannot queue fails at once
(`QueueFull`), one still queued at its deadline fails (`Expired`), and one withdrawn (client gone) is
simply never drafted (what a handler holds: drafter/scheduling/pending.py). A lone request that
`runs_inline` deems short is drafted on the event loop's own thread, without the two thread hand-offs
(drafter/scheduling/inline.py). The batcher knows nothing of HTTP.

Background work (drafting ahead: drafter/sessions/ahead.py) runs only on an idle engine with nothing
queued, arriving or held, one job at a time, oldest session first, and is told to stop between decode
steps the moment a real request shows up; it never counts as load or as contention.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections import deque
from collections.abc import Callable

from drafter.reporting import BatcherMetrics
from drafter.scheduling.engine_thread import EngineThread
from drafter.scheduling.pending import Arrival, EngineFailed, Expired, Pending, QueueFull, Together
from drafter.sessions.draft_length import Load
from engine.requests import DraftError, DraftRequest, DraftResult

log = logging.getLogger(__name__)

# After clients last overlapped, how long every batch goes to the engine thread: long enough that a steady
# stream of concurrent clients never sees the loop draft (measured: 4 clients batched 1.2 per batch
# instead of 1.8 when it did), short enough that a lone client gets it back within a second.
CONTENTION_COOL_DOWN_S = 1.0


class Batcher:
    def __init__(
        self,
        engine_thread: EngineThread,
        draft_batch: Callable[[list[DraftRequest]], list[DraftResult]],
        max_batch_size: int,
        max_queue: int,
        window_s: float,
        metrics: BatcherMetrics,  # the HTTP face implements it (drafter/reporting.py)
        on_engine_failure: Callable[[BaseException], None],
        on_decode: Callable[..., None] = lambda decode_ms, num_steps, *batch: (
            None
        ),  # DraftLengthPolicy.observe
        runs_inline: Callable[[DraftRequest], bool] = lambda request: False,
    ):
        self.engine_thread, self.draft_batch = engine_thread, draft_batch
        self.max_batch_size, self.max_queue, self.window_s = max_batch_size, max_queue, window_s
        self.metrics, self.on_engine_failure, self.on_decode = metrics, on_engine_failure, on_decode
        self.runs_inline = runs_inline
        self.inline_after = 0.0  # event-loop time: no request runs inline before it (see `contended`)
        self.waiting: deque[Pending] = deque()
        self.alone: deque[Pending] = deque()  # retried one by one after the engine refused their batch
        self.running = 0  # requests in the batch on the engine now
        self.arriving = 0  # requests whose handler is reading or checking the body: companions on their way
        self.holding = 0  # handlers queueing several requests (`together`): no batch starts meanwhile
        self.timer: asyncio.TimerHandle | None = None  # the end of the window, while one is open
        self.failure: BaseException | None = None
        self.stopped = False
        # Background jobs by key (a session: a newer job replaces its older one), oldest first.
        self.background: dict[str, tuple[Callable, Callable, bool]] = {}
        self.background_running = False
        self.background_ended = 0.0  # event-loop time the last background job ended

    async def stop(self) -> None:
        self.stopped = True
        self.close_window()
        self.fail_waiting(EngineFailed("server stopped"))

    def arrival(self) -> Arrival:
        """`with batcher.arrival():` around a handler's reading and checking of a body, so an idle engine's
        window waits for it."""
        return Arrival(self)

    def together(self) -> Together:
        return Together(self)

    def contended(self, now: float | None = None) -> None:
        """A request arrived while the engine was busy or others waited: clients overlap. While they do, a
        draft on the event loop would keep it from reading the others (their bodies, their health
        probes) and from batching them, so nothing runs inline until none has overlapped for a while."""
        if now is None:
            now = asyncio.get_running_loop().time()
        self.inline_after = now + CONTENTION_COOL_DOWN_S

    def submit(self, request: DraftRequest, timeout_s: float) -> Pending:
        if self.failure is not None:
            raise EngineFailed(str(self.failure))
        if self.stopped:
            raise EngineFailed("server stopped")
        if len(self.waiting) >= self.max_queue:
            raise QueueFull
        now = asyncio.get_running_loop().time()
        if self.running or self.waiting:
            self.contended(now)
        pending = Pending(request, now, now + timeout_s)
        self.waiting.append(pending)
        self.metrics.queue_depth.set(len(self.waiting))
        self.pump()
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

    def run_in_background(self, key: str, job: Callable, done: Callable, yields: bool = False) -> None:
        """Run `job(stop)` on the engine thread once it idles with no real work; `stop()` turns true when
        a real request is waiting or on its way, and for a job that `yields`, also when another background
        job is queued. `done(result, error)` runs on this loop; a job still queued when a newer one with its
        key comes is dropped unrun."""
        self.background.pop(key, None)
        self.background[key] = (job, done, yields)
        self.pump()

    def cancel_background(self, key: str) -> None:
        self.background.pop(key, None)

    def real_work_pending(self) -> bool:
        """Read from the engine thread between decode steps: plain reads, safe without a lock."""
        return bool(self.waiting or self.arriving or self.holding or self.alone or self.stopped)

    def pump(self, window_over: bool = False) -> None:
        """Start the next batch if the engine is idle and the queue is ready: the batch is full, nobody
        else is on the way, or the first request has waited `window_s`; with nothing to draft, background
        work."""
        if (
            self.running
            or self.background_running
            or self.holding
            or self.failure is not None
            or self.stopped
        ):
            return
        while self.alone:
            pending = self.alone.popleft()
            if not pending.future.done():
                self.dispatch([pending])
                return
        if not self.waiting:
            if self.background and not self.arriving:
                self.start_background()
            return
        loop = asyncio.get_running_loop()
        window_end = self.waiting[0].arrived + self.window_s
        waiting_for_more = self.arriving and len(self.waiting) < self.max_batch_size
        if waiting_for_more and not window_over and loop.time() < window_end:
            if self.timer is None:  # asyncio's timers are ms-precise: a fallback for a slow body only
                self.timer = loop.call_at(window_end, self.end_window)
            return
        self.close_window()
        if batch := self.take():
            self.dispatch(batch)

    def start_background(self) -> None:
        key = next(iter(self.background))
        job, done, yields = self.background.pop(key)
        self.background_running = True

        def finished(result, error: BaseException | None) -> None:
            self.background_running = False
            self.background_ended = asyncio.get_running_loop().time()
            if error is not None and not isinstance(error, DraftError):
                self.failure = error  # the device failed: as if a batch had
                self.on_engine_failure(error)
                self.fail_waiting(EngineFailed(str(error)))
            done(result, error)
            self.pump()

        stop = (
            (lambda: self.real_work_pending() or bool(self.background)) if yields else self.real_work_pending
        )
        self.engine_thread.post(finished, job, stop)

    def end_window(self) -> None:
        self.timer = None
        self.pump(window_over=True)

    def close_window(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

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

    def dispatch(self, batch: list[Pending]) -> None:
        self.running = len(batch)
        # The engine thread is idle here, so `runs_inline` may read the engine's cache table.
        if (
            len(batch) == 1
            and not self.waiting
            and not self.arriving
            and asyncio.get_running_loop().time() >= self.inline_after
            and self.runs_inline(batch[0].request)
        ):
            # One loop turn later: handlers the loop has already scheduled (requests that arrived together,
            # say while the loop was drafting) get to queue or start reading first.
            asyncio.get_running_loop().call_soon(self.run_inline, batch[0])
            return
        self.engine_thread.post(
            functools.partial(self.finish, batch), self.draft_batch, [p.request for p in batch]
        )

    def run_inline(self, pending: Pending) -> None:
        """Draft a lone request on this thread, unless companions showed up since it was dispatched."""
        if self.stopped or self.waiting or self.arriving:
            # Back to the front of the queue, to run with them on the engine thread (or fail with the rest
            # if the server stopped). Its handler set no disconnect or deadline watch for a started
            # request; a batch starts within the window anyway, and `take` still enforces the deadline.
            pending.started = None
            self.waiting.appendleft(pending)
            self.running = 0
            if self.stopped:
                self.fail_waiting(EngineFailed("server stopped"))
            self.pump()
            return
        self.metrics.inline_batches.inc()
        try:
            results, error = self.draft_batch([pending.request]), None
        except Exception as caught:  # noqa: BLE001 - the same outcomes as from the engine thread
            results, error = None, caught
        self.finish([pending], results, error)

    def finish(
        self, batch: list[Pending], results: list[DraftResult] | None, error: BaseException | None
    ) -> None:
        self.running = 0
        if error is None:
            for pending, result in zip(batch, results, strict=True):
                if not pending.future.done():
                    pending.future.set_result(result)
            # After the handlers' wake-ups in the loop's queue: their answers go out before the bookkeeping.
            asyncio.get_running_loop().call_soon(self.record, batch, results)
        elif isinstance(error, DraftError):
            # The server validates exactly what the engine checks, so this is a bug; never let one bad
            # request fail its companions.
            log.error("engine refused a validated request: %s", error)
            if len(batch) == 1:
                if not batch[0].future.done():
                    batch[0].future.set_exception(error)
            else:
                self.alone.extend(batch)
        else:  # a device error the engine cannot recover from
            self.failure = error
            self.on_engine_failure(error)
            for pending in batch:
                if not pending.future.done():
                    pending.future.set_exception(EngineFailed(str(error)))
            self.fail_waiting(EngineFailed(str(error)))
        self.pump()

    def record(self, batch: list[Pending], results: list[DraftResult]) -> None:
        first = results[0]  # the steps that ran, not the k asked; the batch's whole engine time
        prefilled = sum(result.prefilled for result in results)
        self.on_decode(
            first.decode_ms, first.num_steps, len(results), first.engine_ms, first.prefill_ms, prefilled
        )
        metrics = self.metrics
        for pending in batch:
            metrics.queue_wait_seconds.observe(pending.started - pending.arrived)
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
