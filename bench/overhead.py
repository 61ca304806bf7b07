"""What one `/draft` call costs beyond the engine's own work, with a lean client on keep-alive connections.

    python bench/overhead.py [--targets URL[,URL...]] [--contexts 128,2048] [--k 1] [--calls 400]
                             [--clients 1,4,16] [--v2] [--json OUT]

Each call is a `GET /health/live` and a `POST /draft` on the same connection (the standard library's
http.client: no pool, ~30 us of client work). Per call, `excess` = (draft wall time - the engine's own
time) - the health round trip, where the engine's own time is Server-Timing `engine` (the whole engine call:
cache lookup, prefill, decode, readback) or, from a server that does not send it, `prefill + decode` (also
reported for every server: `excess vs prefill+decode` counts the engine's cache work as overhead); with
several clients the queue wait (Server-Timing `queue`: the others' batches) is taken out too, while a lone
client's (a batching window) counts. So `excess` is what our /draft
path adds to a plain HTTP round trip: parse and validation, the batcher, the hand-offs to and from the
engine thread (none where the event loop drafts a lone short request itself), the response. `draft wall` is
the whole call as the client waits for it: compare it too, since where the loop drafts, the engine's time
also holds what running right after the HTTP work costs it (caches), and leaves `excess` smaller for it.
The same context is sent on every call (fully cached: the engine only decodes); `--v2` sends it once, then
only `prefix_len` (a session), so the body no longer grows with it.

Targets are `http://HOST:PORT` or `unix:/PATH` (a server's --uds socket); calls alternate between targets in
one run, so an A/B of two servers (say, two checkouts) is fair on a shared machine. Without --targets, one
server of the tiny preset is started here and measured over TCP and over its Unix socket. With --clients N,
N threads each hold a connection and call concurrently; `mean batch` (from /metrics) shows batches form.
Figures are medians over the calls after a warm-up fifth.
"""

from __future__ import annotations

import argparse
import http.client
import json
import socket
import statistics
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from pathlib import Path

import orjson

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.refusals import ServerRefused, exits_2_on_refusal  # noqa: E402
from bench.server import ServerProcess  # noqa: E402
from drafter.client.protocol import parse_server_timing  # noqa: E402

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


def table(rows: list[dict]) -> str:
    lines = [
        "| target | proto | ctx | k | clients | health | draft - engine | excess | excess vs prefill+decode "
        "| engine | draft wall | queue | mean batch |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['target']} | {r['protocol']} | {r['context_len']} | {r['num_draft_tokens']} | {r['clients']} "
            f"| {r['health_ms']:.3f} | {r['draft_minus_engine_ms']:.3f} | {r['excess_ms']:+.3f} "
            f"| {r['excess_model_ms']:+.3f} "
            f"| {r['engine_ms']:.3f} | {r['wall_ms']:.3f} | {r['queue_ms']:.3f} | {r['mean_batch']:.2f} |"
        )
    return "\n".join(lines)


@exits_2_on_refusal
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--targets", help="comma-separated http://HOST:PORT or unix:/PATH (default: start one)"
    )
    parser.add_argument("--contexts", default="128,2048")
    parser.add_argument("--k", type=int, default=1, help="draft tokens per call")
    parser.add_argument("--calls", type=int, default=400, help="calls per client and target")
    parser.add_argument("--clients", default="1", help="comma-separated concurrent client counts")
    parser.add_argument("--v2", action="store_true", help="also measure v2 (session) calls")
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args(argv)
    contexts = [int(c) for c in args.contexts.split(",")]
    with ExitStack() as stack:
        if args.targets:
            targets = args.targets.split(",")
        else:
            uds = str(Path(stack.enter_context(tempfile.TemporaryDirectory())) / "drafter.sock")
            server_args = ["--model", "tiny", "--max-seq-len", str(max(contexts) + 64), f"--uds={uds}"]
            server = stack.enter_context(ServerProcess(server_args))
            targets = [server.url, f"unix:{uds}"]
        rows = []
        for clients in (int(c) for c in args.clients.split(",")):
            for v2 in (False, True) if args.v2 else (False,):
                for context_len in contexts:
                    rows += measure(targets, context_tokens(context_len), args.k, args.calls, clients, v2)
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
