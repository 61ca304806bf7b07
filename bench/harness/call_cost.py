"""What one `/draft` call costs beyond the engine's own work, measured with a lean client on keep-alive
connections (the standard library's http.client, over TCP or a server's Unix socket): each call a
`GET /health/live` and a `POST /draft` on one connection, the engine's time read from Server-Timing, the
rows' medians taken after a warm-up fifth. bench/overhead.py defines the figures and prints them; the device
check measures its servers with it too.
"""

from __future__ import annotations

import http.client
import socket
import statistics
import threading
import time

import orjson

from bench.harness.refusals import ServerRefused
from drafter.client.protocol import parse_server_timing

HEADERS = {"content-type": "application/json"}


class UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str):
        super().__init__("localhost")
        self.path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(self.path)


def connect(target: str) -> http.client.HTTPConnection:
    if target.startswith("unix:"):
        connection = UnixConnection(target.removeprefix("unix:"))
        connection.connect()
        return connection
    host, port = target.removeprefix("http://").rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port))
    connection.connect()
    connection.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return connection


def request(connection, method: str, path: str, body: bytes | None = None):
    connection.request(method, path, body, HEADERS if body is not None else {})
    response = connection.getresponse()
    data = response.read()
    if response.status != 200:
        raise ServerRefused(response.status, data, f"{method} {path}")
    return response, data


class Caller:
    """One client: a connection and the body it sends (v2: after one full-context call for the session)."""

    def __init__(self, target: str, tokens: list[int], k: int, v2: bool, name: str):
        self.connection = connect(target)
        self.body = orjson.dumps({"tokens": tokens, "num_draft_tokens": k})
        if v2:
            first = {"tokens": tokens, "num_draft_tokens": k, "session": name}
            _, data = request(self.connection, "POST", "/draft", orjson.dumps(first))
            token = orjson.loads(data)["session_token"]
            self.body = orjson.dumps(
                {"tokens": [], "prefix_len": len(tokens), "session": name, "session_token": token,
                 "num_draft_tokens": k}
            )  # fmt: skip
        self.samples: list[tuple[float, ...]] = []  # health, wall, engine, queue, prefill + decode (s)

    def call(self) -> None:
        started = time.perf_counter()
        request(self.connection, "GET", "/health/live")
        health = time.perf_counter() - started
        started = time.perf_counter()
        response, _ = request(self.connection, "POST", "/draft", self.body)
        wall = time.perf_counter() - started
        timing = parse_server_timing(response.getheader("server-timing"))
        model = timing["prefill"] + timing["decode"]
        engine = timing.get("engine", model)
        self.samples.append((health, wall, engine / 1e3, timing["queue"] / 1e3, model / 1e3))

    def call_keeping(self, failures: list[BaseException]) -> None:
        """`call` in a client thread: its failure goes to `failures`, for the main thread to raise."""
        try:
            self.call()
        except Exception as error:  # noqa: BLE001 - re-raised by the thread that waits for this one
            failures.append(error)


def metric(target: str, name: str) -> float:
    _, data = request(connect(target), "GET", "/metrics")
    for line in data.decode().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return 0.0


def measure(targets: list[str], tokens: list[int], k: int, calls: int, clients: int, v2: bool) -> list[dict]:
    callers = {
        t: [Caller(t, tokens, k, v2, f"overhead-{len(tokens)}-{i}-{time.monotonic_ns()}") for i in range(clients)]
        for t in targets
    }  # fmt: skip
    before = {
        t: (metric(t, "drafter_batch_size_sum"), metric(t, "drafter_batch_size_count")) for t in targets
    }
    for _ in range(calls):
        for target in targets:  # alternate, so drift of a shared machine hits every target alike
            failures: list[BaseException] = []
            threads = [threading.Thread(target=c.call_keeping, args=(failures,)) for c in callers[target][1:]]
            for thread in threads:
                thread.start()
            callers[target][0].call()
            for thread in threads:
                thread.join()
            if failures:  # a refusal in a client thread is the run's, said once
                raise failures[0]
    rows = []
    for target in targets:
        drafted = metric(target, "drafter_batch_size_sum") - before[target][0]
        batches = metric(target, "drafter_batch_size_count") - before[target][1]
        samples = [s for c in callers[target] for s in c.samples[calls // 5 :]]

        def median_ms(values) -> float:
            return statistics.median(values) * 1e3

        health = median_ms(s[0] for s in samples)
        # A lone client's queue wait is the server's own (a batching window); with company it is the others'.
        queue = (lambda s: s[3]) if clients > 1 else (lambda s: 0.0)
        beyond = median_ms(s[1] - s[2] - queue(s) for s in samples)
        rows.append(
            {
                "target": target, "context_len": len(tokens), "num_draft_tokens": k, "clients": clients,
                "protocol": "v2" if v2 else "v1", "health_ms": health, "wall_ms": median_ms(s[1] for s in samples),
                "engine_ms": median_ms(s[2] for s in samples), "queue_ms": median_ms(s[3] for s in samples),
                "draft_minus_engine_ms": beyond, "excess_ms": beyond - health,
                "excess_model_ms": median_ms(s[1] - s[4] - queue(s) for s in samples) - health,
                "mean_batch": drafted / batches if batches else float("nan"),
            }
        )  # fmt: skip
    return rows


def context_tokens(length: int) -> list[int]:
    return [1 + i % 1000 for i in range(length)]  # within every preset's vocabulary
