"""Overload and deadlines answer at once (429, 504) instead of hanging, expired requests never reach the
device, and the bearer token guards everything but the health probes."""

from __future__ import annotations

import asyncio
import random

import httpx
import pytest

from tests.server_process import metric_value, shared_server

API_KEY = "test-key-1234"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
# One request per batch, long fresh contexts (each prefill takes many milliseconds on CPU), a tiny queue
# and a deadline shorter than one batch: a burst must split into served, 504 (expired) and 429 (no room).
STRICT_ARGS = [
    "--max-seq-len=2048",
    "--max-batch-size=1",
    "--max-queue=4",
    "--batch-window-ms=0",
    "--request-timeout-s=0.05",
    f"--api-key={API_KEY}",
    "--device=cpu",
    "--draft-source=model",
]


@pytest.fixture(scope="module")
def url(request):
    return shared_server(request.config, STRICT_ARGS).url


@pytest.fixture(scope="module")
def client(url):
    with httpx.Client(base_url=url, timeout=30, headers=AUTH) as client:
        yield client


def test_draft_burst_beyond_queue_gets_429_and_stale_ones_504(client, url):
    rng = random.Random(0)
    contexts = [[rng.randrange(1024) for _ in range(2000)] for _ in range(16)]
    before = client.get("/metrics").text

    async def burst():
        limits = httpx.Limits(max_connections=16)
        async with httpx.AsyncClient(base_url=url, timeout=30, headers=AUTH, limits=limits) as clients:
            return await asyncio.gather(
                *(clients.post("/draft", json={"tokens": c, "num_draft_tokens": 8}) for c in contexts)
            )

    responses = asyncio.run(asyncio.wait_for(burst(), timeout=30))
    statuses = [r.status_code for r in responses]
    assert set(statuses) <= {200, 429, 504}, statuses
    assert 200 in statuses and 429 in statuses and 504 in statuses, statuses
    for response in responses:
        if response.status_code == 429:
            assert response.headers["retry-after"].isdigit()
            assert response.json()["error"]["type"] == "overloaded"
        if response.status_code == 504:
            assert response.json()["error"]["type"] == "timeout"
    after = client.get("/metrics").text

    def grew(name):
        return metric_value(after, name) - metric_value(before, name)

    # Only the served requests ever reached the engine.
    assert grew("drafter_batch_size_count") == statuses.count(200)
    assert grew('drafter_rejections_total{reason="overloaded"}') == statuses.count(429)
    assert grew('drafter_rejections_total{reason="timeout"}') == statuses.count(504)
    assert client.post("/draft", json={"tokens": [1, 2, 3], "num_draft_tokens": 4}).status_code == 200


@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer wrong"}, {"Authorization": API_KEY}, {"Authorization": "Basic abc"}],
    ids=["none", "wrong key", "no scheme", "basic"],
)
def test_auth_refuses_draft_without_the_key(url, headers):
    response = httpx.post(f"{url}/draft", json={"tokens": [1, 2]}, headers=headers)
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == "Bearer"
    assert response.json()["error"]["type"] == "unauthorized"
    assert API_KEY not in response.text


def test_auth_accepts_the_key(client):
    response = client.post("/draft", json={"tokens": [1, 2], "num_draft_tokens": 3})
    assert response.status_code == 200
    assert len(response.json()["tokens"]) == 3


def test_auth_guards_info_and_metrics_but_not_health(url):
    assert httpx.get(f"{url}/info").status_code == 401
    assert httpx.get(f"{url}/metrics").status_code == 401
    assert httpx.get(f"{url}/info", headers=AUTH).json()["server"]["auth"] is True
    assert httpx.get(f"{url}/metrics", headers=AUTH).status_code == 200
    assert httpx.get(f"{url}/health/live").status_code == 200
    assert httpx.get(f"{url}/health/ready").status_code == 200
