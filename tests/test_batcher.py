"""The batcher on the real tiny engine: a lone request never waits for the batching window, companions on
their way do form one batch, a request refused by the engine never fails its companions, and a lone short
request is drafted on the event loop's own thread unless companions show up first."""

from __future__ import annotations

import asyncio
import threading

import pytest

from drafter.scheduling import batcher as batcher_module
from drafter.scheduling.batcher import Batcher, EngineFailed
from drafter.scheduling.engine_thread import EngineThread
from drafter.server.metrics import Metrics
from engine.config import EngineConfig
from engine.engine import Engine
from engine.requests import DraftError, DraftRequest

LONG_WINDOW_S = 30.0  # a window no test may wait out


@pytest.fixture(scope="module")
def engine():
    return Engine.load("tiny", EngineConfig(max_seq_len=128, max_batch_size=4, max_draft_tokens=4))


failures: list[BaseException] = []  # what the batchers reported as engine failures


def batcher_for(
    draft_batch, window_s: float = LONG_WINDOW_S, inline: bool = False
) -> tuple[Batcher, list[int], list[int]]:
    """The batcher, the size of each batch it drafts, and the thread that drafted it."""
    sizes: list[int] = []
    threads: list[int] = []

    def counted(requests):
        sizes.append(len(requests))
        threads.append(threading.get_ident())
        return draft_batch(requests)

    batcher = Batcher(
        EngineThread(), counted, max_batch_size=4, max_queue=8, window_s=window_s,
        metrics=Metrics(4), on_engine_failure=failures.append, runs_inline=lambda request: inline,
    )  # fmt: skip
    return batcher, sizes, threads


def test_a_lone_request_starts_at_once_whatever_the_window(engine):
    async def run():
        batcher, sizes, threads = batcher_for(engine.draft_batch)
        pending = batcher.submit(DraftRequest([1, 2, 3], 2), timeout_s=60)
        assert pending.started is not None, "nobody else was on the way, yet the request waited"
        result = await asyncio.wait_for(pending.future, 10)
        assert result.tokens == engine.draft([1, 2, 3], 2) and sizes == [1]
        assert threads == [batcher.engine_thread.thread.ident]

    asyncio.run(run())


def test_requests_on_their_way_join_the_first_one(engine):
    async def run():
        batcher, sizes, _ = batcher_for(engine.draft_batch)
        with batcher.arrival():  # a second handler is still reading its body
            first = batcher.submit(DraftRequest([1, 2, 3], 2), timeout_s=60)
            assert first.started is None
            await asyncio.sleep(0.01)
            assert first.started is None, "the batch started before its companion arrived"
            second = batcher.submit(DraftRequest([4, 5], 3), timeout_s=60)
        results = await asyncio.wait_for(asyncio.gather(first.future, second.future), 10)
        assert sizes == [2]
        assert [r.tokens for r in results] == [engine.draft([1, 2, 3], 2), engine.draft([4, 5], 3)]

    asyncio.run(run())


def test_the_window_ends_even_if_a_companion_never_arrives(engine):
    async def run():
        batcher, sizes, _ = batcher_for(engine.draft_batch, window_s=0.005)
        with batcher.arrival():  # a client that stalls mid-body
            pending = batcher.submit(DraftRequest([1, 2, 3], 2), timeout_s=60)
            await asyncio.wait_for(pending.future, 10)
        assert sizes == [1]

    asyncio.run(run())


def test_a_request_the_engine_refuses_does_not_fail_its_companions(engine):
    def refuse_batches_with_a_seven(requests):
        if any(7 in r.tokens for r in requests):
            raise DraftError("tokens must not contain 7 (this test's engine)", "tokens")
        return engine.draft_batch(requests)

    async def run():
        batcher, sizes, _ = batcher_for(refuse_batches_with_a_seven)
        with batcher.arrival():
            good = batcher.submit(DraftRequest([1, 2, 3], 2), timeout_s=60)
            bad = batcher.submit(DraftRequest([7, 7], 2), timeout_s=60)
        assert (await asyncio.wait_for(good.future, 10)).tokens == engine.draft([1, 2, 3], 2)
        with pytest.raises(DraftError):
            await asyncio.wait_for(bad.future, 10)
        assert sizes == [2, 1, 1]  # together, then one by one

    asyncio.run(run())


def test_a_lone_short_request_is_drafted_on_the_event_loop_thread(engine):
    async def run():
        batcher, sizes, threads = batcher_for(engine.draft_batch, inline=True)
        for context in ([1, 2, 3], [1, 2, 3, 4, 5]):
            pending = batcher.submit(DraftRequest(context, 3), timeout_s=60)
            assert (await asyncio.wait_for(pending.future, 10)).tokens == engine.draft(context, 3)
        assert sizes == [1, 1] and threads == [threading.get_ident()] * 2
        assert batcher.metrics.inline_batches._value.get() == 2

    asyncio.run(run())


def test_requests_arriving_in_the_same_loop_turn_batch_instead_of_one_running_inline(engine):
    """What the loop schedules together (say, clients that sent while it drafted) still forms one batch."""

    async def run():
        batcher, sizes, threads = batcher_for(engine.draft_batch, inline=True)
        first = batcher.submit(DraftRequest([1, 2, 3], 2), timeout_s=60)  # would run inline next turn
        second = batcher.submit(DraftRequest([4, 5], 3), timeout_s=60)
        with batcher.arrival():  # and a third handler starts reading its body in the same turn
            await asyncio.sleep(0.01)
            assert not first.future.done(), "the first ran alone while a companion was on its way"
            third = batcher.submit(DraftRequest([6], 1), timeout_s=60)
        results = await asyncio.wait_for(asyncio.gather(first.future, second.future, third.future), 10)
        assert sizes == [3] and threads == [batcher.engine_thread.thread.ident]
        assert [r.tokens for r in results] == [
            engine.draft([1, 2, 3], 2),
            engine.draft([4, 5], 3),
            engine.draft([6], 1),
        ]

    asyncio.run(run())


def test_after_clients_overlap_lone_requests_go_to_the_engine_thread_for_a_while(engine, monkeypatch):
    monkeypatch.setattr(batcher_module, "CONTENTION_COOL_DOWN_S", 0.3)

    async def run():
        batcher, sizes, threads = batcher_for(engine.draft_batch, inline=True)
        engine_thread, loop_thread = batcher.engine_thread.thread.ident, threading.get_ident()
        overlapping = [batcher.submit(DraftRequest([i, 2], 2), timeout_s=60) for i in (1, 3)]
        await asyncio.wait_for(asyncio.gather(*(p.future for p in overlapping)), 10)
        lone = batcher.submit(DraftRequest([5, 6], 2), timeout_s=60)
        assert (await asyncio.wait_for(lone.future, 10)).tokens == engine.draft([5, 6], 2)
        assert sizes == [2, 1] and threads == [engine_thread, engine_thread]
        await asyncio.sleep(0.35)  # nobody overlapped since: the loop drafts a lone request again
        again = batcher.submit(DraftRequest([5, 6, 7], 2), timeout_s=60)
        assert (await asyncio.wait_for(again.future, 10)).tokens == engine.draft([5, 6, 7], 2)
        assert threads[-1] == loop_thread

    asyncio.run(run())


def test_an_inline_request_the_engine_refuses_or_fails_on_ends_as_on_the_engine_thread(engine):
    def refuse_sevens_fail_on_eights(requests):
        if any(7 in r.tokens for r in requests):
            raise DraftError("tokens must not contain 7 (this test's engine)", "tokens")
        if any(8 in r.tokens for r in requests):
            raise RuntimeError("device lost (this test's engine)")
        return engine.draft_batch(requests)

    async def run():
        batcher, sizes, threads = batcher_for(refuse_sevens_fail_on_eights, inline=True)
        refused = batcher.submit(DraftRequest([7, 7], 2), timeout_s=60)
        with pytest.raises(DraftError):
            await asyncio.wait_for(refused.future, 10)
        served = batcher.submit(DraftRequest([1, 2], 2), timeout_s=60)
        assert (await asyncio.wait_for(served.future, 10)).tokens == engine.draft([1, 2], 2)
        failed = batcher.submit(DraftRequest([8], 2), timeout_s=60)
        with pytest.raises(EngineFailed):
            await asyncio.wait_for(failed.future, 10)
        assert str(failures[-1]) == "device lost (this test's engine)"
        with pytest.raises(EngineFailed):  # and nothing more is drafted
            batcher.submit(DraftRequest([1], 1), timeout_s=60)
        assert threads == [threading.get_ident()] * 3

    asyncio.run(run())


def test_a_request_waiting_to_run_inline_when_the_server_stops_fails_as_the_queue_does(engine):
    async def run():
        batcher, sizes, _ = batcher_for(engine.draft_batch, inline=True)
        pending = batcher.submit(DraftRequest([1, 2, 3], 2), timeout_s=60)
        await batcher.stop()
        with pytest.raises(EngineFailed):
            await asyncio.wait_for(pending.future, 10)
        assert sizes == []

    asyncio.run(run())


def test_a_yielding_background_job_stops_for_one_queued_after_it_and_that_one_runs_next(engine):
    """Online adaptation's cycle yields to drafting ahead: a branch answers the next call in milliseconds,
    and queued behind a cycle that ran until a real request came, it was not ready when that call came."""

    async def run():
        batcher, _, _ = batcher_for(engine.draft_batch)
        started, order = threading.Event(), []
        done = asyncio.get_running_loop().create_future()

        def cycle(stop):
            started.set()
            while not stop():  # a training step per turn, until told to stop
                threading.Event().wait(0.005)
            return "yielded"

        def ahead(stop):
            return "ahead"

        def finished(result, error):
            order.append(result)
            if len(order) == 2:
                done.set_result(None)

        batcher.run_in_background("\0cycle", cycle, finished, yields=True)
        await asyncio.to_thread(started.wait, 10)
        assert batcher.background_running
        batcher.run_in_background("session", ahead, finished)
        await asyncio.wait_for(done, 10)
        assert order == ["yielded", "ahead"] and batcher.background_ended > 0

    asyncio.run(run())
