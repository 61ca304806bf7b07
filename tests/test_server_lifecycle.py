"""Readiness gating while the engine loads, a disconnected client's request never drafted, and SIGTERM:
readiness 503 at once, in-flight requests finish, then exit 0."""

from __future__ import annotations

import concurrent.futures
import random
import time

import httpx
import pytest

from tests.server_process import ServerProcess, metric_value

# One request per batch and long fresh contexts: each batch takes ~70 ms on CPU, and eight of them queue
# ~0.5 s of work: long enough to watch requests wait behind it without racing the first to finish.
SLOW_BATCH_ARGS = [
    "--max-seq-len=4096",
    "--max-batch-size=1",
    "--max-queue=16",
    "--request-timeout-s=60",
    "--device=cpu",
]
AHEAD = 8  # requests sent before the one under test


def long_context(seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1024) for _ in range(4000)]


def test_not_ready_while_loading_then_sigterm_exits_cleanly():
    # bench-cpu draws ~100M random weights and warms up for seconds: a real slow load, no test hook.
    server = ServerProcess(["--model=bench-cpu", "--max-seq-len=256", "--max-batch-size=1"])
    try:
        url = server.wait_for_port()
        ready = httpx.get(f"{url}/health/ready")
        assert ready.status_code == 503
        assert ready.json()["stage"] in ("loading", "compiling", "capturing")
        assert ready.json()["ready"] is False
        draft = httpx.post(f"{url}/draft", json={"tokens": [1, 2, 3]})
        assert draft.status_code == 503
        assert draft.json()["error"]["type"] == "not_ready"
        assert ready.json()["stage"] in draft.json()["error"]["message"]
        assert draft.headers["retry-after"].isdigit()
        assert httpx.get(f"{url}/health/live").status_code == 200
        assert httpx.get(f"{url}/info").json()["stage"] != "ready"
        started = time.monotonic()
        assert server.stop(timeout_s=20) == 0, server.log
        assert time.monotonic() - started < 20
    finally:
        server.close()


def test_readiness_never_contradicts_itself_while_starting():
    """Polled from the moment the port opens, /health/ready's stage is "ready" exactly when it answers 200,
    and /draft's 503 names the same stage: it once said {"ready": false, "stage": "ready"} for hundreds of
    polls while the server built its batcher after the engine was warm."""
    server = ServerProcess(["--max-seq-len=256", "--max-batch-size=1"])
    try:
        url = server.wait_for_port()
        stages = []
        with httpx.Client() as client:
            for _ in range(5000):
                ready = client.get(f"{url}/health/ready")
                body = ready.json()
                stages.append(body["stage"])
                assert (ready.status_code == 200) == body["ready"] == (body["stage"] == "ready"), body
                if body["ready"]:
                    break
            else:
                raise AssertionError(f"not ready after 5000 polls: {stages[-3:]}")
        assert stages[0] != "ready", "the first poll came too late to see the start"
    finally:
        server.close()


@pytest.fixture(scope="module")
def slow_server():
    server = ServerProcess(SLOW_BATCH_ARGS)
    server.wait_ready()
    yield server
    server.close()


def post_draft(url: str, tokens: list[int], timeout: float = 60) -> httpx.Response:
    return httpx.post(f"{url}/draft", json={"tokens": tokens, "num_draft_tokens": 8}, timeout=timeout)


def arrived(url: str, served_before: float) -> float:
    """Requests the server has received since `served_before` was read: in flight now, or answered 200."""
    metrics = httpx.get(f"{url}/metrics").text
    answered = metric_value(metrics, 'drafter_request_seconds_count{status="200"}') - served_before
    return metric_value(metrics, "drafter_requests_in_flight") + answered


def served(url: str) -> float:
    return metric_value(httpx.get(f"{url}/metrics").text, 'drafter_request_seconds_count{status="200"}')


def wait_for_arrivals(url: str, count: int, served_before: float, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if arrived(url, served_before) >= count:
            return
        time.sleep(0.005)
    raise TimeoutError(f"never saw {count} requests arrive")


def test_disconnected_client_is_removed_before_its_batch_runs(slow_server):
    url = slow_server.url
    before = httpx.get(f"{url}/metrics").text
    served_before = served(url)
    with concurrent.futures.ThreadPoolExecutor(AHEAD) as pool:
        ahead = [pool.submit(post_draft, url, long_context(seed)) for seed in range(AHEAD)]
        wait_for_arrivals(url, AHEAD, served_before)
        with pytest.raises(httpx.TimeoutException):  # gives up while long batches are ahead of it
            post_draft(url, long_context(99), timeout=0.05)
        assert [f.result().status_code for f in ahead] == [200] * AHEAD
    after = httpx.get(f"{url}/metrics").text
    assert metric_value(after, 'drafter_rejections_total{reason="disconnected"}') == 1
    batches = metric_value(after, "drafter_batch_size_count") - metric_value(
        before, "drafter_batch_size_count"
    )
    assert batches == AHEAD


def test_sigterm_drains_in_flight_requests_then_exits_0(slow_server):
    url = slow_server.url
    served_before = served(url)
    with concurrent.futures.ThreadPoolExecutor(AHEAD) as pool:
        in_flight = [pool.submit(post_draft, url, long_context(100 + seed)) for seed in range(AHEAD)]
        wait_for_arrivals(url, AHEAD, served_before)
        slow_server.signal()
        # Still listening while it drains: readiness has turned 503 and new drafts are refused.
        deadline = time.monotonic() + 5
        while (ready := httpx.get(f"{url}/health/ready")).status_code == 200 and time.monotonic() < deadline:
            time.sleep(0.005)
        assert ready.status_code == 503
        assert ready.json()["stage"] == "draining"
        refused = post_draft(url, [1, 2, 3])
        assert refused.status_code == 503
        assert "draining" in refused.json()["error"]["message"]
        responses = [f.result() for f in in_flight]
    assert [r.status_code for r in responses] == [200] * AHEAD
    assert all(len(r.json()["tokens"]) == 8 for r in responses)
    assert slow_server.process.wait(30) == 0, slow_server.log
