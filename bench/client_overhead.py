"""What drafter.client itself costs per call: encode, send, decode, against a raw-socket baseline.

    python -m bench.client_overhead [--contexts 128,1024,4096] [--calls 2000] [--json OUT]

Both clients talk to the same canned server (a subprocess answering every request at once with one fixed
draft answer over keep-alive HTTP/1.1), so the server's cost is the same small constant for both and the
difference is the client's. The baseline writes pre-encoded request bytes to a TCP socket and reads until
the announced Content-Length: no JSON, no HTTP library. `DraftClient.draft` and `AsyncDraftClient.draft`
build and orjson-encode the body, go through the client's keep-alive pool (h11), parse the JSON answer and the Server-Timing
header into `Drafts`. Encode and decode are also timed alone. Calls alternate between the clients in
blocks, so drift of a shared machine hits all of them alike. Figures are medians in microseconds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import random
import socket
import statistics
import sys
import time
from pathlib import Path

import orjson

from drafter.client import AsyncDraftClient, DraftClient
from drafter.client.protocol import draft_request, parse_server_timing

NUM_DRAFT_TOKENS = 8
VOCAB_SIZE = 151_936  # Qwen3's: ids as long in JSON as a real target's
ANSWER = orjson.dumps({"tokens": list(range(151_000, 151_000 + NUM_DRAFT_TOKENS)), "cached": 1000})
TIMING = "queue;dur=0.010, prefill;dur=0.500, decode;dur=2.000"
RESPONSE = (
    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
    + f"server-timing: {TIMING}\r\ncontent-length: {len(ANSWER)}\r\n\r\n".encode()
    + ANSWER
)
BLOCK = 50  # calls per client before switching to the next


class Canned(asyncio.Protocol):
    """Answers each complete request (headers + Content-Length body) with RESPONSE."""

    def connection_made(self, transport):
        self.transport, self.buffer = transport, b""

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while (end := self.buffer.find(b"\r\n\r\n")) >= 0:
            head = self.buffer[:end].lower()
            length = 0
            for line in head.split(b"\r\n"):
                if line.startswith(b"content-length:"):
                    length = int(line.split(b":", 1)[1])
            if len(self.buffer) < end + 4 + length:
                return
            self.buffer = self.buffer[end + 4 + length :]
            self.transport.write(RESPONSE)


def serve(port_queue) -> None:
    async def main():
        server = await asyncio.get_running_loop().create_server(Canned, "127.0.0.1", 0)
        port_queue.put(server.sockets[0].getsockname()[1])
        await server.serve_forever()

    asyncio.run(main())


class RawSocket:
    def __init__(self, port: int, body: bytes):
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        head = "POST /draft HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
        self.request = (head + f"content-length: {len(body)}\r\n\r\n").encode() + body

    def call(self) -> None:
        self.sock.sendall(self.request)
        data = b""
        while len(data) < len(RESPONSE):  # the canned answer's size is known; a real one reads the header
            data += self.sock.recv(65536)


def timed(call, num_calls: int) -> list[float]:
    samples = []
    for _ in range(num_calls):
        started = time.perf_counter_ns()
        call()
        samples.append((time.perf_counter_ns() - started) / 1e3)
    return samples


def measure(port: int, context: list[int], calls: int) -> dict:
    body = orjson.dumps({"tokens": context, "num_draft_tokens": NUM_DRAFT_TOKENS})
    raw = RawSocket(port, body)
    url = f"http://127.0.0.1:{port}"
    sync_client = DraftClient(url, timeout_s=5)
    loop = asyncio.new_event_loop()
    async_client = AsyncDraftClient(url, timeout_s=5)
    clients = {
        "raw_socket": raw.call,
        "draft_client": lambda: sync_client.draft(context, NUM_DRAFT_TOKENS),
        "async_draft_client": lambda: loop.run_until_complete(async_client.draft(context, NUM_DRAFT_TOKENS)),
    }
    samples: dict[str, list[float]] = {name: [] for name in clients}
    for call in clients.values():
        timed(call, BLOCK)  # warm-up: connections, pools, caches
    for _ in range(calls // BLOCK):
        for name, call in clients.items():
            samples[name] += timed(call, BLOCK)
    samples["encode"] = timed(lambda: draft_request({"tokens": context}, {"num_draft_tokens": 8}), calls)
    samples["decode"] = timed(lambda: (orjson.loads(ANSWER), parse_server_timing(TIMING)), calls)
    sync_client.close()
    loop.run_until_complete(async_client.close())
    loop.close()
    return {name: statistics.median(values) for name, values in samples.items()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--contexts", default="128,1024,4096", help="context lengths, comma-separated")
    parser.add_argument("--calls", type=int, default=2000, help="measured calls per client and context")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args(argv)
    contexts = [int(c) for c in args.contexts.split(",")]

    ports = multiprocessing.get_context("spawn").Queue()
    server = multiprocessing.get_context("spawn").Process(target=serve, args=(ports,), daemon=True)
    server.start()
    try:
        port = ports.get(timeout=30)
        rng = random.Random(0)
        results = []
        for n in contexts:
            row = measure(port, [rng.randrange(VOCAB_SIZE) for _ in range(n)], args.calls)
            results.append({"context": n, **row})
    finally:
        server.terminate()
    print("| context | raw socket | DraftClient | AsyncDraftClient | sync overhead | encode | decode |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        print(
            f"| {r['context']} | {r['raw_socket']:.0f} | {r['draft_client']:.0f} | {r['async_draft_client']:.0f} "
            f"| {r['draft_client'] - r['raw_socket']:.0f} | {r['encode']:.1f} | {r['decode']:.1f} |"
        )
    if args.json:
        args.json.write_text(
            json.dumps({"unit": "microseconds, median per call", "results": results}, indent=1)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
