"""HTTP/2 (cleartext, prior knowledge), which Hypercorn speaks next to HTTP/1.1 on the same port: drafts
multiplexed on one connection equal the engine's, and a request answered before its body arrived (401, 415,
413 by Content-Length; 408 at the body deadline) is answered at once, even when its body is larger than the
flow-control windows, and ends only its own stream (once its body has ended, however late), never the
connection and the drafts multiplexed on it."""

from __future__ import annotations

import asyncio
import random
import time

import httpx
import orjson
import pytest

from drafter.server.request_body import AnswerEarlyThenDrain, BodyDeadlines
from tests.h2_client import RawH2
from tests.server_process import (
    BODY_TIMEOUT_S,
    MAIN_ARGS,
    MAX_BODY_BYTES,
    draft_body,
    main_oracle,
    shared_server,
)

API_KEY = "h2-test-key"
AUTH = {"authorization": f"Bearer {API_KEY}"}
WINDOW = 65_535  # HTTP/2's initial connection and stream flow-control windows, which Hypercorn keeps
BIG_BODY = b" " * (2 * WINDOW + 1000)  # arrives whole only if the server keeps handing the windows back
ANSWER_WITHIN_S = 1.0  # a refusal takes tens of milliseconds here, even beside 32 drafts


@pytest.fixture(scope="module")
def url(request):
    return shared_server(request.config, MAIN_ARGS).url


@pytest.fixture(scope="module")
def keyed_url(request):
    """The main server with an API key, so a request can be refused 401 too."""
    return shared_server(request.config, [*MAIN_ARGS, f"--api-key={API_KEY}"]).url


def test_http2_multiplexed_drafts_equal_engine_drafts(url):
    rng = random.Random(7)
    contexts = [[rng.randrange(1024) for _ in range(rng.randrange(1, 300))] for _ in range(16)]

    async def post_all() -> list[httpx.Response]:
        # One event loop, not threads: httpx's sync client shares a connection's HPACK state across threads
        # unsafely, and a few percent of threaded runs send header blocks the server cannot decode.
        async with httpx.AsyncClient(base_url=url, http1=False, http2=True, timeout=30) as client:
            return await asyncio.gather(*(client.post("/draft", json=draft_body(c, 8)) for c in contexts))

    responses = asyncio.run(post_all())  # 16 streams at once on one connection
    assert {r.http_version for r in responses} == {"HTTP/2"}
    assert [r.status_code for r in responses] == [200] * len(contexts)
    oracle = main_oracle()
    assert [r.json()["tokens"] for r in responses] == [oracle.draft(c, 8) for c in contexts]


EARLY_REFUSALS = {
    # name: (content type, body, status)
    "wrong content type": ("text/plain", orjson.dumps({"tokens": [1, 2, 3]}), 415),
    "too large by Content-Length": ("application/json", b" " * (MAX_BODY_BYTES + 1000), 413),
}


@pytest.mark.parametrize("name", EARLY_REFUSALS)
def test_http2_early_refusal_ends_only_its_own_stream(url, name):
    content_type, payload, status = EARLY_REFUSALS[name]
    good = orjson.dumps(draft_body([5, 6, 7, 8], 4))
    client = RawH2(url)
    try:
        refused = client.headers(content_type, len(payload))  # its body comes later
        client.receive(set(), timeout_s=5, status_of=refused)
        assert client.status.get(refused) == status, "the refusal waited for the body"
        before = client.post(good)
        client.receive({before})
        client.data(refused, payload)  # the body of a request the server may already have refused
        after = client.post(good)
        client.receive({refused, before, after})
        assert not client.closed, f"the connection was torn down; answered: {client.status}"
        assert client.status == {refused: status, before: 200, after: 200}
        assert orjson.loads(client.body[refused])["error"]["param"] is None
        expected = main_oracle().draft([5, 6, 7, 8], 4)
        assert orjson.loads(client.body[after])["tokens"] == expected
    finally:
        client.close()


def test_http2_refusals_of_bodies_over_the_window_answer_at_once_beside_32_drafts(keyed_url):
    """Fault: with 32 drafts in flight on one connection, a refused stream whose body was larger than the
    connection's window got no answer while its client was still sending. Each round puts 32 drafts and a
    401, a 413 (by Content-Length) and a 415 on the same connection, the refused bodies sent while the
    answers are due: every refusal is answered in full (its stream ended) within a second."""
    rng = random.Random(41)
    distinct = [[rng.randrange(1024) for _ in range(rng.randrange(1, 200))] for _ in range(4)]
    contexts = distinct * 8  # 32 drafts in flight; the in-process oracle drafts only the 4 distinct ones
    oracle = main_oracle()
    expected = [oracle.draft(c, 4) for c in distinct] * 8
    client = RawH2(keyed_url, headers=AUTH)
    try:
        for round_ in range(4):
            drafts = [client.post(orjson.dumps(draft_body(c, 4))) for c in contexts]
            refused = {
                client.headers("application/json", len(BIG_BODY), auth=False): 401,
                client.headers("application/json", len(BIG_BODY)): 413,  # over the cap by Content-Length
                client.headers("text/plain", len(BIG_BODY)): 415,
            }
            sent = time.monotonic()
            for stream in refused:
                client.data(stream, BIG_BODY)  # as fast as the server hands the windows back
            client.receive({*drafts, *refused}, timeout_s=30)
            assert not client.closed, f"round {round_}: the connection was torn down"
            took = {s: round(client.ended_at[s] - sent, 3) if s in client.ended else None for s in refused}
            assert all(t is not None and t < ANSWER_WITHIN_S for t in took.values()), (
                f"round {round_}: {took}"
            )
            assert {s: client.status[s] for s in refused} == refused
            assert [client.status[s] for s in drafts] == [200] * len(drafts), f"round {round_}"
            assert [orjson.loads(client.body[s])["tokens"] for s in drafts] == expected
    finally:
        client.close()


def test_http2_a_body_still_arriving_after_its_deadline_never_tears_down_the_connection(keyed_url):
    """A stream answered before its body ended (415 at once, 408 at the body deadline) stays open until the
    body has ended, however late: Hypercorn tears the whole connection down, drafts and all, on a DATA frame
    for a stream whose answer has ended (the fault: a drain that gave up at the body deadline did that)."""
    good = orjson.dumps(draft_body([5, 6, 7, 8], 4))
    client = RawH2(keyed_url, headers=AUTH)
    try:
        refused = client.headers("text/plain", len(BIG_BODY))
        slow = client.headers("application/json", len(good))  # a valid draft whose body stalls
        client.data(refused, BIG_BODY[:1000], end=False)  # both bodies go on only after the deadlines
        client.data(slow, good[:5], end=False)
        client.receive(set(), timeout_s=5, status_of=refused)
        client.receive(set(), timeout_s=BODY_TIMEOUT_S + 5, status_of=slow)
        assert (client.status.get(refused), client.status.get(slow)) == (415, 408)
        client.pump(0.3)  # whatever the server sends at the deadlines is read before the bodies go on
        client.data(refused, BIG_BODY[1000:])
        client.data(slow, good[5:])
        drafts = [client.post(good) for _ in range(8)]
        client.receive({refused, slow, *drafts})
        assert not client.closed, f"the connection was torn down; answered: {client.status}"
        assert [client.status[s] for s in drafts] == [200] * len(drafts)
        assert {refused, slow} <= client.ended
    finally:
        client.close()


def test_http2_a_drain_outlives_body_deadlines_and_ends_at_shutdown():
    """In process: a refused HTTP/2 stream whose client sends nothing more stays open past many body
    deadlines, and a server shutdown (every deadline expired) ends it at once."""
    deadlines = BodyDeadlines(timeout_s=0.02)
    body: asyncio.Queue = asyncio.Queue()
    sent: list[dict] = []

    async def refuse(scope, receive, send) -> None:  # answers without reading the body
        await send({"type": "http.response.start", "status": 415, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    async def send(message) -> None:
        sent.append(message)

    async def run() -> None:
        middleware = AnswerEarlyThenDrain(refuse, deadlines, max_discard_bytes=100)
        scope = {"type": "http", "http_version": "2", "headers": []}
        stream = asyncio.create_task(middleware(scope, body.get, send))
        await asyncio.sleep(0.2)  # ten body deadlines
        await body.put({"type": "http.request", "body": b"late", "more_body": True})
        await asyncio.sleep(0.05)
        assert not stream.done(), "the stream ended before its body did"
        answer = {"type": "http.response.body", "body": b"{}", "more_body": True}  # all of it, stream open
        assert sent[-1] == answer
        deadlines.expire_all()
        await asyncio.wait_for(stream, 1)

    asyncio.run(run())
    assert sent[-1] == {"type": "http.response.body", "body": b"", "more_body": False}
