"""The batcher on the real tiny engine: a lone request never waits for the batching window, companions on
their way do form one batch, and a request refused by the engine never fails its companions."""

from __future__ import annotations

import asyncio

import pytest

from drafter.batcher import Batcher
from drafter.engine_thread import EngineThread
from drafter.metrics import Metrics
from engine.config import EngineConfig
from engine.engine import Engine
from engine.requests import DraftError, DraftRequest

LONG_WINDOW_S = 30.0  # a window no test may wait out


@pytest.fixture(scope="module")
def engine():
    return Engine.load("tiny", EngineConfig(max_seq_len=128, max_batch_size=4, max_draft_tokens=4))


def batcher_for(draft_batch, window_s: float = LONG_WINDOW_S) -> tuple[Batcher, list[int]]:
    sizes: list[int] = []

    def counted(requests):
        sizes.append(len(requests))
        return draft_batch(requests)

    batcher = Batcher(
        EngineThread(), counted, max_batch_size=4, max_queue=8, window_s=window_s,
        metrics=Metrics(4), on_engine_failure=lambda error: None,
    )  # fmt: skip
    return batcher, sizes


def test_a_lone_request_starts_at_once_whatever_the_window(engine):
    async def run():
        batcher, sizes = batcher_for(engine.draft_batch)
        pending = batcher.submit(DraftRequest([1, 2, 3], 2), timeout_s=60)
        assert pending.started is not None, "nobody else was on the way, yet the request waited"
        result = await asyncio.wait_for(pending.future, 10)
        assert result.tokens == engine.draft([1, 2, 3], 2) and sizes == [1]

    asyncio.run(run())


def test_requests_on_their_way_join_the_first_one(engine):
    async def run():
        batcher, sizes = batcher_for(engine.draft_batch)
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
        batcher, sizes = batcher_for(engine.draft_batch, window_s=0.005)
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
        batcher, sizes = batcher_for(refuse_batches_with_a_seven)
        with batcher.arrival():
            good = batcher.submit(DraftRequest([1, 2, 3], 2), timeout_s=60)
            bad = batcher.submit(DraftRequest([7, 7], 2), timeout_s=60)
        assert (await asyncio.wait_for(good.future, 10)).tokens == engine.draft([1, 2, 3], 2)
        with pytest.raises(DraftError):
            await asyncio.wait_for(bad.future, 10)
        assert sizes == [2, 1, 1]  # together, then one by one

    asyncio.run(run())
