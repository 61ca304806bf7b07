"""Drafting ahead's per-session bookkeeping (drafter/server/ahead_work.py) holds entries only for sessions in
the table: thousands of names whose first call fails after the ahead lookup (429, 504, client gone: the call
is abandoned and never enters the table) leave nothing behind, nor does a session closed by its own call.
Real parts throughout: the tiny engine, the batcher on its engine thread, the session table, Speculation."""

from __future__ import annotations

import asyncio

import numpy as np

from drafter.draft_params import DraftParams
from drafter.scheduling.batcher import Batcher
from drafter.scheduling.engine_thread import EngineThread
from drafter.server.ahead_work import AheadWork
from drafter.server.metrics import Metrics
from drafter.sessions.ahead import DraftAhead
from drafter.sessions.draft_length import DraftCost, DraftLengthPolicy, Load
from drafter.sessions.speculation import Speculation
from drafter.sessions.table import SessionTable
from engine.config import EngineConfig
from engine.engine import Engine
from engine.requests import DraftRequest

K = 4
IDLE = Load(queue_depth=0, running=0)


def tracked(work: AheadWork) -> int:
    ahead = work.ahead
    return len(work.calls) + len(work.answered_at) + len(work.gap_ms) + len(ahead.plans) + len(ahead.sent)


async def exercise() -> None:
    engine = Engine.load(
        "tiny", EngineConfig(max_seq_len=256, max_batch_size=4, max_draft_tokens=8, top_choices=3)
    )
    metrics = Metrics(4)
    metrics.add_ahead(8)
    work: AheadWork | None = None
    table = SessionTable(max_sessions=64, ttl_s=600, max_len=256, on_drop=lambda name: work.forget(name))
    policy = DraftLengthPolicy(DraftCost(20.0, 1.0, 1.0), 8, max_batch_size=4, max_queue_depth=4)
    spec = Speculation(table, policy, metrics, 8, 256)
    thread = EngineThread()
    batcher = Batcher(thread, engine.draft_batch, 4, 128, 0.0, metrics, lambda error: None)
    work = AheadWork(DraftAhead(8, policy, 256, 8, metrics), batcher, engine, table)
    context = np.arange(1, 20, dtype=np.int64)
    try:
        for i in range(5000):  # each first call is looked up, then fails before it is answered
            call = spec.prepare(DraftParams(context, K, session=f"refused-{i}"), IDLE)
            assert work.answer(call) == (None, "none")
            spec.abandon(call)
        assert tracked(work) == 0 and len(table) == 0

        # A session that was answered is tracked until it leaves the table, and one that closes with its own
        # call is never tracked.
        for name, close in (("kept", False), ("closing", True)):
            call = spec.prepare(DraftParams(context, K, session=name, close=close), IDLE)
            work.answer(call)
            result = engine.draft_batch([DraftRequest(call.engine_context, K)])[0]
            spec.finish(call, result.tokens)
            work.after(call, result)
        assert set(work.answered_at) == {"kept"}
        table.close("kept", table.get("kept").token)
        assert tracked(work) == 0
    finally:
        thread.stop(5.0)


def test_names_whose_first_call_fails_leave_no_ahead_bookkeeping():
    asyncio.run(exercise())
