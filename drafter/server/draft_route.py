"""`POST /draft`: gate, read, validate, queue, wait (deadline and disconnect aware), answer.

Every refusal happens before the request is queued, and a queued request leaves the queue if its client
goes away or its deadline passes, so the device only ever drafts for someone still waiting.
"""

from __future__ import annotations

import asyncio
import time

import orjson
from starlette.requests import Request
from starlette.responses import Response

from drafter.scheduling.batcher import EngineFailed, Expired, Pending, QueueFull
from drafter.server.auth import require_auth
from drafter.server.errors import REFUSED, ApiError, OrjsonResponse, as_api_error
from drafter.server.request_body import BodyTimeout, BodyTooLarge, ClientGone, read_body
from drafter.server.runtime import Runtime
from drafter.server.validation import (
    check_content_length,
    check_content_type,
    parse_draft_body,
    too_large,
)
from drafter.sessions.draft_source import MODEL, token_probs
from drafter.sessions.speculation import Call
from engine.requests import DraftError, DraftRequest, DraftResult

RETRY_AFTER_OVERLOADED_S = "1"
RETRY_AFTER_NOT_READY_S = "5"
EMPTY_RESULT = DraftResult(
    tokens=[], probs=[], cached=0, prefilled=0, evicted=False, prefill_ms=0.0, decode_ms=0.0
)


async def draft(request: Request) -> Response:
    runtime: Runtime = request.app.state.runtime
    started = time.perf_counter()
    runtime.in_flight += 1  # /metrics reads it as drafter_requests_in_flight
    status = 500
    try:
        response = await answer(request, runtime)
        status = response.status_code
        return response
    except REFUSED as error:
        status = as_api_error(error).status
        raise
    except ClientGone:  # hung up mid-body: nobody reads an answer, and it is not a server error
        runtime.metrics.rejections.labels("disconnected").inc()
        status = 499
        return OrjsonResponse(None, status_code=status)
    finally:
        runtime.in_flight -= 1
        runtime.metrics.request_seconds.labels(str(status)).observe(time.perf_counter() - started)


async def answer(request: Request, runtime: Runtime) -> Response:
    require_auth(request, runtime.config.api_key)
    if not runtime.ready:
        raise not_ready(runtime.stage, runtime.lifecycle.reason)
    # Server-Timing reports the event-loop thread's CPU time (not wall time, so other processes on a busy
    # machine do not inflate it): `receive` while the body is read (other requests' work at that await is
    # counted too), and `host` from the bytes in hand until queued plus from the result to the serialized
    # answer (parse, validate, session work, answer; nothing in between awaits).
    receiving = time.thread_time()
    limits = runtime.limits
    check_content_type(request.headers.get("content-type"))
    check_content_length(request.headers.get("content-length"), limits.max_body_bytes)
    with runtime.batcher.arrival():  # an idle engine waits for this request's batch companions
        body = await read_checked_body(request, runtime, limits.max_body_bytes)
        started = time.thread_time()
        params = parse_draft_body(body, limits)
        call = runtime.speculation.prepare(params, runtime.batcher.load())
    call.receive_ms = (started - receiving) * 1e3
    try:
        return await draft_for(call, request, runtime, started)
    except BaseException:
        runtime.speculation.abandon(call)
        raise


async def read_checked_body(request: Request, runtime: Runtime, max_bytes: int) -> bytes:
    """The body, read under its deadline, or the ApiError that answers a body too large or too slow."""
    try:
        return await read_body(request, max_bytes, runtime.body_deadlines)
    except BodyTooLarge:
        raise too_large(max_bytes) from None
    except BodyTimeout:
        if runtime.draining:
            raise not_ready("draining", None) from None
        raise body_timeout(runtime.config.body_timeout_s) from None


async def draft_for(call: Call, request: Request, runtime: Runtime, started: float) -> Response:
    ahead = None  # hit, miss or none: what drafting ahead had for this call
    if runtime.ahead is not None and call.params.session is not None:
        result, ahead = runtime.ahead.answer(call)
        if result is not None:  # answered from a branch: no engine work
            return answered(call, runtime, result, None, started, ahead)
    if call.num_draft_tokens == 0:  # auto under load: an empty draft now beats any wait
        return draft_response(call, runtime, EMPTY_RESULT, None, started, ahead)
    pending = submit(call, runtime)
    host_s = time.thread_time() - started
    result = await wait_for_result(request, runtime, pending)
    if result is None:  # the client is gone; nobody reads this
        runtime.speculation.abandon(call)
        return OrjsonResponse(None, status_code=499)
    return answered(call, runtime, result, pending, time.thread_time() - host_s, ahead)


def answered(call, runtime: Runtime, result: DraftResult, pending, host_started: float, ahead) -> Response:
    """The answer; then, once it is out, drafting ahead plans the session's next round."""
    response = draft_response(call, runtime, result, pending, host_started, ahead)
    if ahead is not None:
        asyncio.get_running_loop().call_soon(runtime.ahead.after, call, result)
    return response


def submit(call: Call, runtime: Runtime) -> Pending:
    """Queue a prepared call for the engine, or the ApiError that says why not."""
    choices = runtime.ahead is not None and runtime.ahead.wants_choices(call)
    try:
        return runtime.batcher.submit(
            DraftRequest(call.engine_context, call.num_draft_tokens, call.params.session, choices),
            runtime.config.request_timeout_s,
        )
    except QueueFull:
        raise ApiError(
            429,
            "overloaded",
            f"the draft queue is full ({runtime.config.max_queue} waiting); retry shortly",
            headers={"Retry-After": RETRY_AFTER_OVERLOADED_S},
        ) from None
    except EngineFailed:
        raise not_ready("failed", runtime.lifecycle.reason) from None


class ClientLeft(Exception):
    """The client disconnected while its request was still queued."""


async def wait_for_result(request: Request, runtime: Runtime, pending: Pending) -> DraftResult | None:
    """The request's drafts; None if its client left while it was queued. While it is queued, the client
    leaving or the deadline passing takes it out of the queue; once its batch runs the device work is
    spent, so it waits for it either way. A request an idle engine took at once (a lone client) needs
    neither watch: no task, no timer (they cost ~0.05 ms a call)."""
    if pending.started is not None:
        return await settled(runtime, pending)
    batcher = runtime.batcher

    def give_up(error: Exception) -> None:
        if batcher.withdraw(pending):
            pending.future.set_exception(error)

    # After the body is read, the next ASGI message can only be http.disconnect.
    disconnected = asyncio.ensure_future(request.receive())
    disconnected.add_done_callback(lambda watcher: watcher.cancelled() or give_up(ClientLeft()))
    deadline = asyncio.get_running_loop().call_at(pending.deadline, give_up, Expired())
    try:
        return await settled(runtime, pending)
    finally:
        deadline.cancel()
        disconnected.cancel()


async def settled(runtime: Runtime, pending: Pending) -> DraftResult | None:
    """The outcome of a submitted request, as an answer or an ApiError."""
    try:
        return await pending.future
    except ClientLeft:
        runtime.metrics.rejections.labels("disconnected").inc()
        return None
    except Expired:
        raise timed_out(runtime.config.request_timeout_s) from None
    except EngineFailed:
        raise not_ready("failed", runtime.lifecycle.reason) from None
    except DraftError as error:
        raise ApiError(400, "invalid_request", str(error), error.param) from None


def draft_response(
    call: Call,
    runtime: Runtime,
    result: DraftResult,
    pending: Pending | None,
    host_started: float,
    ahead: str | None = None,
) -> Response:
    """The answer; `host_started` is the thread time when this call's host work began, less what it spent
    before queueing, so `host` is the server's own per-call work: parse, validate, session work and
    serializing the answer."""
    body = answer_fields(call, runtime, result)
    queue_ms = 0.0 if pending is None else (pending.started - pending.arrived) * 1e3
    content = orjson.dumps(body)  # serialized here, so the host time below includes it
    host_ms = (time.thread_time() - host_started) * 1e3
    timing = (
        f"queue;dur={queue_ms:.3f}, prefill;dur={result.prefill_ms:.3f}, "
        f"decode;dur={result.decode_ms:.3f}, engine;dur={result.engine_ms:.3f}, "
        f"receive;dur={call.receive_ms:.3f}, host;dur={host_ms:.3f}"
    )
    if call.wanted != MODEL:  # the suffix lookup, inside `host`
        timing += f", suffix;dur={call.lookup_ms:.3f}"
    if ahead is not None:  # whether a branch drafted ahead answered it
        timing += f", ahead;desc={ahead}"
    return Response(content, media_type="application/json", headers={"Server-Timing": timing})


def answer_fields(call: Call, runtime: Runtime, result: DraftResult) -> dict:
    """A settled call's answer (its session stored, its feedback counted), as /draft and each /draft/batch
    row give it."""
    params = call.params
    tokens, probs = result.tokens, result.probs
    if call.head.tokens:
        tokens, probs = call.head.tokens + tokens, token_probs(call.head) + probs
    if params.min_confidence > 0:
        keep = next((i for i, p in enumerate(probs) if p < params.min_confidence), len(probs))
        tokens, probs = tokens[:keep], probs[:keep]
    body = {"tokens": tokens, "cached": result.cached, **runtime.speculation.finish(call, tokens)}
    if runtime.adapt is not None:
        runtime.adapt.answered(call, result)
    if params.return_probs:
        body["probs"] = probs
    runtime.metrics.draft_tokens.inc(len(tokens))
    return body


def not_ready(stage: str, reason: str | None) -> ApiError:
    message = f"the draft engine is not ready: {stage}"
    if stage == "failed" and reason:
        message += " (see the server log; restart the process)"
    return ApiError(
        503,
        "not_ready",
        message,
        headers={"Retry-After": RETRY_AFTER_NOT_READY_S},
        reason=f"not_ready_{stage}",
    )


def body_timeout(timeout_s: float) -> ApiError:
    # Hypercorn closes an HTTP/1.1 connection whose request was not fully read after the answer.
    return ApiError(408, "body_timeout", f"the request body did not arrive within {timeout_s:g} s")


def timed_out(timeout_s: float) -> ApiError:
    return ApiError(
        504,
        "timeout",
        f"the request waited longer than {timeout_s} s for the engine and was dropped",
        reason="timeout",
    )
