"""Many conversations' draft calls in one round trip, for a target that drafts a whole batch each step.
Each call runs the same `exchange` as a lone call (drafter/client/protocol.py: v2 incremental bodies, the
409 fallback, the failure policy); the requests they yield together go out together: one
`POST /draft/batch` where the server offers it (/info `server.max_batch_rows`, split into requests of at
most that many rows), else one request per call, all in flight at once. A row's 409 resends that row's full
context in a second round; the others are done by then.
"""

from __future__ import annotations

import asyncio
from collections.abc import Generator

import orjson

from drafter.client.http11 import TransportError
from drafter.client.protocol import (
    JSON_HEADERS,
    Request,
    Response,
    SessionState,
    exchange,
    transport_failed,
)
from drafter.client.results import DraftRequestError, Drafts

BATCH_PATH = "/draft/batch"
NOT_OUR_ANSWER = Response(502, {}, b"")  # a batch answer without the protocol's shape: a server failure


async def draft_together(
    client, jobs: list[tuple[SessionState, list[int], dict]], timeout_s: float
) -> list[Drafts | DraftRequestError]:
    """Drafts for each (session state, whole context, options), in order. A row the server refused as the
    caller's bug comes back as its DraftRequestError instead of raising, so it cannot sink the others."""
    server = client.server
    calls = [exchange(server, state, list(context), options) for state, context, options in jobs]
    results: list[Drafts | DraftRequestError | None] = [None] * len(calls)
    waiting: dict[int, Request] = {}

    def advance(index: int, response: Response | None = None) -> None:
        call: Generator[Request, Response, Drafts] = calls[index]
        try:
            waiting[index] = next(call) if response is None else call.send(response)
        except StopIteration as done:
            results[index] = done.value
        except DraftRequestError as error:
            results[index] = error

    for index in range(len(calls)):
        advance(index)
    try:
        async with asyncio.timeout(timeout_s):
            while waiting:
                requests = dict(waiting)
                waiting.clear()
                asks = {i: r for i, r in requests.items() if r.path != "/draft"}
                if asks:  # a client's first calls ask /info: once for all of them
                    response = await client.send(next(iter(asks.values())))
                    for index in asks:
                        advance(index, response)
                drafts = {i: r for i, r in requests.items() if r.path == "/draft"}
                for index, response in (await send_drafts(client, drafts)).items():
                    advance(index, response)
    except (TimeoutError, TransportError) as error:
        unanswered = [i for i, result in enumerate(results) if result is None]
        failed = transport_failed(server, None, timed_out=isinstance(error, TimeoutError))
        for index in unanswered:  # nobody knows whether the server advanced these sessions
            jobs[index][0].forget()
            results[index] = failed
    return results


async def send_drafts(client, requests: dict[int, Request]) -> dict[int, Response]:
    if not requests:
        return {}
    max_rows = client.server.max_batch_rows
    indexes = list(requests)
    if not max_rows or len(indexes) == 1:
        responses = await asyncio.gather(*(client.send(requests[i]) for i in indexes))
        return dict(zip(indexes, responses, strict=True))
    chunks = [indexes[start : start + max_rows] for start in range(0, len(indexes), max_rows)]
    bodies = [b'{"requests":[' + b",".join(requests[i].body for i in chunk) + b"]}" for chunk in chunks]
    answers = await asyncio.gather(
        *(client.send(Request("POST", BATCH_PATH, b, JSON_HEADERS)) for b in bodies)
    )
    rows = {}
    for chunk, answer in zip(chunks, answers, strict=True):
        rows.update(zip(chunk, split(answer, len(chunk)), strict=True))
    return rows


def split(answer: Response, num_rows: int) -> list[Response]:
    """A /draft/batch answer as one /draft answer per row. A refusal of the whole request (401, 429, 503,
    ...) is every row's answer."""
    if answer.status != 200:
        return [answer] * num_rows
    try:
        entries = orjson.loads(answer.content)["results"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return [NOT_OUR_ANSWER] * num_rows
    if not isinstance(entries, list) or len(entries) != num_rows:
        return [NOT_OUR_ANSWER] * num_rows
    timing = answer.headers.get("server-timing")
    return [row_response(entry, timing) for entry in entries]


def row_response(entry, timing: str | None) -> Response:
    if not isinstance(entry, dict) or not isinstance(entry.get("status"), int):
        return NOT_OUR_ANSWER
    fields = dict(entry)
    status = fields.pop("status")
    headers = {"server-timing": timing} if timing else {}
    retry_after = fields.pop("retry_after", None)
    if retry_after is not None:
        headers["retry-after"] = str(retry_after)
    return Response(status, headers, orjson.dumps(fields))
