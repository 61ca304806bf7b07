"""`POST /draft/batch`: several draft calls in one request, drafted together. A target that drafts for many
conversations each step (vLLM's proposer) sends them as one request instead of one per conversation: one
round trip, one body to read, and every row queued before the engine looks, so they share one engine batch
(up to --max-batch-size) instead of splitting by the order their requests happened to arrive in.

Body: `{"requests": [call, ...]}`, each call exactly a `/draft` body (v1 or v2), 1 to --max-queue of them.
Answer 200: `{"results": [row, ...]}` in the same order, each row a `/draft` answer with `"status": 200`,
or `{"status": N, "error": {...}}` (with `"retry_after"` seconds where /draft would send Retry-After): a
bad row is that row's error, never the others'. Refusals of the request itself (auth, content type, size,
malformed body, not ready) are /draft's, as the whole answer. Each row counts in /metrics as one /draft
request would.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import orjson
from starlette.requests import Request
from starlette.responses import Response

from drafter.scheduling.batcher import Expired
from drafter.server.auth import require_auth
from drafter.server.draft_route import (
    EMPTY_RESULT,
    ClientLeft,
    answer_fields,
    not_ready,
    read_checked_body,
    settled,
    submit,
)
from drafter.server.errors import REFUSED, ApiError, as_api_error
from drafter.server.request_body import ClientGone
from drafter.server.runtime import Runtime
from drafter.server.validation import (
    check_content_length,
    check_content_type,
    parse_batch_body,
    parse_draft_fields,
)
from drafter.sessions.draft_length import Load
from drafter.sessions.speculation import Call
from engine.requests import DraftResult

CLIENT_GONE = 499


@dataclass(slots=True)
class Row:
    call: Call | None = None  # prepared (its session work done), unless the row was refused
    pending: object = None  # the batcher's Pending; None for a refused row or an empty "auto" draft
    error: ApiError | None = None


async def draft_batch(request: Request) -> Response:
    runtime: Runtime = request.app.state.runtime
    started = time.perf_counter()
    runtime.in_flight += 1
    statuses = [500]
    try:
        response, statuses = await answer(request, runtime)
        return response
    except ApiError as error:
        statuses = [error.status]
        raise
    except ClientGone:
        runtime.metrics.rejections.labels("disconnected").inc()
        statuses = [CLIENT_GONE]
        return Response(status_code=CLIENT_GONE)
    finally:
        runtime.in_flight -= 1
        seconds = time.perf_counter() - started
        for status in statuses:
            runtime.metrics.request_seconds.labels(str(status)).observe(seconds)


async def answer(request: Request, runtime: Runtime) -> tuple[Response, list[int]]:
    require_auth(request, runtime.config.api_key)
    if not runtime.ready:
        raise not_ready(runtime.stage, runtime.lifecycle.reason)
    receiving = time.thread_time()
    max_rows = runtime.config.max_queue
    max_bytes = runtime.limits.max_body_bytes * max_rows
    check_content_type(request.headers.get("content-type"))
    check_content_length(request.headers.get("content-length"), max_bytes)
    with runtime.batcher.arrival():  # an idle engine waits for this request's rows
        body = await read_checked_body(request, runtime, max_bytes)
        host_started = time.thread_time()
        with runtime.batcher.together():
            batch = parse_batch_body(body, max_bytes, max_rows)
            load = runtime.batcher.load()  # what else the engine has: this request's rows share a batch
            rows = [prepare(data, runtime, load, len(batch)) for data in batch]
            runtime.speculation.together([row.call for row in rows if row.call is not None], load)
            for row in rows:
                queue(row, runtime)
    host_s = time.thread_time() - host_started
    try:
        results = await wait_for_rows(request, runtime, rows)
    except BaseException:  # cancelled: no row's session stays reserved
        for row in rows:
            if row.call is not None:
                runtime.speculation.abandon(row.call)
        raise
    answered = time.thread_time()
    share_pass(rows, results)
    entries = [entry(runtime, row, result) for row, result in zip(rows, results, strict=True)]
    content = orjson.dumps({"results": entries})
    host_ms = (host_s + time.thread_time() - answered) * 1e3
    engine_ms = max((r.engine_ms for r in results if isinstance(r, DraftResult)), default=0.0)
    receive_ms = (host_started - receiving) * 1e3
    timing = f"engine;dur={engine_ms:.3f}, receive;dur={receive_ms:.3f}, host;dur={host_ms:.3f}"
    response = Response(content, media_type="application/json", headers={"Server-Timing": timing})
    return response, [row["status"] for row in entries]


def prepare(data, runtime: Runtime, load: Load, num_rows: int) -> Row:
    """One row validated and its session work done; or the ApiError that refused it."""
    if isinstance(data, ApiError):
        return Row(error=data)
    try:
        params = parse_draft_fields(data, runtime.limits)
        return Row(runtime.speculation.prepare(params, load, num_rows))
    except REFUSED as error:
        return Row(error=as_api_error(error))


def queue(row: Row, runtime: Runtime) -> None:
    """A prepared row to the engine, unless "auto" answers it with no model drafts (no engine work)."""
    if row.call is None or row.call.num_draft_tokens == 0:
        return
    try:
        row.pending = submit(row.call, runtime)
    except REFUSED as error:
        runtime.speculation.abandon(row.call)
        row.call, row.error = None, as_api_error(error)


def share_pass(rows: list[Row], results: list) -> None:
    """The rows are one step of a batching target: all their drafts go into one verify pass, which every row
    waits for. Each session keeps the pass's drafts, so its next call's gap is learned as its share of that
    pass (drafter.sessions.target_cost), not as a pass of its own drafts."""
    drafts = sum(
        len(row.call.head.tokens) + len(result.tokens)
        for row, result in zip(rows, results, strict=True)
        if row.call is not None and isinstance(result, DraftResult)
    )
    for row in rows:
        if row.call is not None:
            row.call.pass_drafts = drafts


async def wait_for_rows(request: Request, runtime: Runtime, rows: list[Row]) -> list:
    """Each row's DraftResult, or the ApiError it ended with. While rows are queued, the client leaving or
    the deadline passing takes them out of the queue, as for /draft."""
    queued = [row.pending for row in rows if row.pending is not None]
    batcher = runtime.batcher

    def give_up(error: Exception) -> None:
        for pending in queued:
            if batcher.withdraw(pending):
                pending.future.set_exception(error)

    watch = any(pending.started is None for pending in queued)
    if watch:
        disconnected = asyncio.ensure_future(request.receive())
        disconnected.add_done_callback(lambda watcher: watcher.cancelled() or give_up(ClientLeft()))
        deadline_at = max(pending.deadline for pending in queued)
        deadline = asyncio.get_running_loop().call_at(deadline_at, give_up, Expired())
    try:
        return await asyncio.gather(*(outcome(runtime, row) for row in rows))
    finally:
        if watch:
            deadline.cancel()
            disconnected.cancel()


async def outcome(runtime: Runtime, row: Row):
    if row.error is not None:
        return row.error
    if row.pending is None:
        return EMPTY_RESULT
    try:
        result = await settled(runtime, row.pending)
    except ApiError as error:
        return error
    return CLIENT_GONE if result is None else result


def entry(runtime: Runtime, row: Row, result) -> dict:
    if isinstance(result, DraftResult):
        return {"status": 200, **answer_fields(row.call, runtime, result)}
    if row.call is not None:  # prepared, then expired, refused by the engine, or its client left
        runtime.speculation.abandon(row.call)
    if result == CLIENT_GONE:  # nobody reads this answer
        return {"status": CLIENT_GONE}
    runtime.metrics.rejections.labels(result.reason).inc()
    error = {"type": result.type, "message": result.message, "param": result.param}
    fields = {"status": result.status, "error": error}
    if "Retry-After" in result.headers:
        fields["retry_after"] = int(result.headers["Retry-After"])
    return fields
