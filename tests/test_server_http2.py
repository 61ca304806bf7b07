"""HTTP/2 (cleartext, prior knowledge), which Hypercorn speaks next to HTTP/1.1 on the same port: drafts
multiplexed on one connection equal the engine's, and a request refused before its body arrives (415, 413 by
Content-Length) ends only that stream, never the connection and the drafts multiplexed on it."""

from __future__ import annotations

import asyncio
import random

import httpx
import orjson
import pytest

from tests.h2_client import RawH2
from tests.server_process import MAIN_ARGS, MAX_BODY_BYTES, draft_body, main_oracle, shared_server


@pytest.fixture(scope="module")
def url(request):
    return shared_server(request.config, MAIN_ARGS).url


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
