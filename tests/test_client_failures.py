"""The failure policy, end to end: a transformers target speculating through `DraftClient` keeps producing
exactly its own greedy output while the server is down, overloaded (429), not ready (503) or slow
(timeouts), the client answers "no drafts" within its deadline and backs off (Retry-After respected), and
drafting resumes when the server comes back.

Real servers wherever one can be put in the state: a stopped process and a new one on its port, a queue of
one flooded by concurrent long contexts, a deadline shorter than any round trip. A stand-in HTTP server
only for what a real drafter cannot be made to answer on demand: 503 (only for the moment it is loading
or draining), 504 (only when a queued request happens to outwait its deadline), 500/502 (a bug, a proxy)
and a response that takes seconds.
"""

from __future__ import annotations

import asyncio
import http.server
import random
import threading
import time

import httpx
import orjson
import pytest
import torch

from drafter.client import AsyncDraftClient, Backoff, DraftClient, DraftRequestError
from drafter.integrations.transformers_generate import SpeculationStats, speculative_decoding
from tests.conftest import TARGET_MODEL
from tests.oracle import HF_CONFIGS, hf_greedy
from tests.server_process import ServerProcess

pytestmark = pytest.mark.usefixtures("one_thread")
VOCAB_SIZE = HF_CONFIGS[TARGET_MODEL]["vocab_size"]
# One request drafted at a time and one waiting: a few concurrent long contexts fill the server (the KV
# cache keeps its CPU default: these tests do not depend on its size).
SMALL_SERVER_ARGS = [
    "--device=cpu",
    "--dtype=float32",
    "--no-compile",
    "--max-seq-len=2048",
    "--max-batch-size=1",
    "--max-queue=1",
    "--batch-window-ms=0",
    "--draft-source=model",
]
NUM_DRAFT_TOKENS = 4


def quick_backoff() -> Backoff:
    return Backoff(base_s=0.01, max_s=0.1)  # the policy's shape, on a test's time scale


@pytest.fixture(scope="module")
def target(hf_checkpoint):
    return hf_checkpoint(TARGET_MODEL)


@pytest.fixture(scope="module")
def server(target):
    _, directory = target
    server = ServerProcess(["--model", str(directory), *SMALL_SERVER_ARGS])
    try:
        server.wait_ready()
        yield server
    finally:
        server.close()


def speculate(
    model, client, prompt: list[int], max_new_tokens: int = 24
) -> tuple[list[int], SpeculationStats]:
    """The target's output through the client, checked against its own greedy generate."""
    stats = SpeculationStats(NUM_DRAFT_TOKENS)
    ids = torch.tensor([prompt])
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        custom_generate=speculative_decoding,
        draft_client=client,
        num_draft_tokens=NUM_DRAFT_TOKENS,
        speculation_stats=stats,
        max_new_tokens=max_new_tokens,
        do_sample=False,
    )[0, len(prompt) :].tolist()
    assert out == hf_greedy(model, prompt, max_new_tokens)
    return out, stats


def count_requests(client: DraftClient) -> list[str]:
    sent = []
    client.http.on_request.append(lambda method, path, body: sent.append(f"{method} {path}"))
    return sent


def wait_out(client: DraftClient) -> None:
    while client.server.backoff.active:
        time.sleep(0.01)


def test_server_down_then_back_target_stays_exact_and_drafting_resumes(target):
    model, directory = target
    prompt = list(range(300, 330))
    first = ServerProcess(["--model", str(directory), *SMALL_SERVER_ARGS])
    try:
        url = first.wait_ready()
        with DraftClient(url, timeout_s=30, backoff=quick_backoff()) as client:
            sent = count_requests(client)
            _, stats = speculate(model, client, prompt)
            assert stats.num_skipped == 0 and stats.accepted == stats.drafted  # its own weights
            first.stop()

            started = time.monotonic()
            _, stats = speculate(model, client, prompt)  # refused connections: the target decodes alone
            assert stats.num_skipped == len(stats.draft_call_ms) > 0 and sum(stats.accepted) == 0
            assert time.monotonic() - started < 10
            assert client.session().draft(prompt, 4).skipped in ("unreachable", "backing_off")

            port = url.rsplit(":", 1)[1]
            second = ServerProcess(["--model", str(directory), *SMALL_SERVER_ARGS, f"--port={port}"])
            try:
                assert second.wait_ready() == url
                wait_out(client)
                infos = sent.count("GET /info")
                _, stats = speculate(model, client, prompt)
                assert stats.num_skipped == 0 and stats.accepted == stats.drafted
                assert sent.count("GET /info") == infos + 1  # a reconnect asks the server's protocol again
            finally:
                second.close()
    finally:
        first.close()


class Flood:
    """Threads posting fresh long contexts back to back, so the server's one queue place is nearly always
    taken; a refused flooder waits 5 ms instead of spinning."""

    def __init__(self, url: str, num_threads: int = 6):
        self.url, self.stopped = url, threading.Event()
        self.threads = [threading.Thread(target=self.run, args=(seed,)) for seed in range(num_threads)]

    def run(self, seed: int) -> None:
        rng = random.Random(seed)
        with httpx.Client(base_url=self.url, timeout=30) as http:
            while not self.stopped.is_set():
                tokens = [rng.randrange(VOCAB_SIZE) for _ in range(2000)]
                if http.post("/draft", json={"tokens": tokens, "num_draft_tokens": 8}).status_code != 200:
                    time.sleep(0.005)

    def __enter__(self) -> Flood:
        for thread in self.threads:
            thread.start()
        time.sleep(0.2)
        return self

    def __exit__(self, *exc) -> None:
        self.stopped.set()
        for thread in self.threads:
            thread.join()


def test_overloaded_server_429_backs_off_for_retry_after_and_target_stays_exact(target, server):
    model, _ = target
    prompt = list(range(400, 430))
    with DraftClient(server.url, timeout_s=30, backoff=quick_backoff()) as client:
        sent = count_requests(client)
        with Flood(server.url):
            for _ in range(50):
                wait_out(client)
                drafts = client.draft(prompt, 4)
                if drafts.skipped == "overloaded":
                    break
            assert drafts.skipped == "overloaded" and drafts.tokens == []
            # The server said Retry-After: 1; until then no request leaves the client.
            assert client.server.backoff.until - time.monotonic() > 0.8
            before = len(sent)
            assert client.draft(prompt, 4).skipped == "backing_off" and len(sent) == before
            speculate(model, client, prompt)
        wait_out(client)
        drafts = client.draft(prompt, 4)
        assert drafts.skipped is None and len(drafts.tokens) == 4


def test_timeouts_return_no_drafts_within_the_deadline_then_recover(target, server):
    model, _ = target
    prompt = [random.Random(7).randrange(VOCAB_SIZE) for _ in range(1500)]
    with DraftClient(server.url, timeout_s=0.001, backoff=quick_backoff()) as client:
        started = time.monotonic()
        drafts = client.session().draft(prompt, 8)
        assert drafts.skipped == "timeout" and time.monotonic() - started < 0.5
        _, stats = speculate(model, client, prompt[:100])
        assert stats.num_skipped == len(stats.draft_call_ms) > 0
        wait_out(client)
        drafts = client.session().draft(prompt, 8, timeout_s=30)  # the same client, a deadline it can meet
        assert drafts.skipped is None and len(drafts.tokens) == 8


class StandIn:
    """A minimal HTTP server answering every request with one status (and our error shape), after an
    optional stall; it counts what it was asked."""

    def __init__(self, status: int, headers: dict | None = None, stall_s: float = 0.0):
        stand_in = self
        self.requests: list[str] = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def answer(self):
                stand_in.requests.append(f"{self.command} {self.path}")
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                time.sleep(stall_s)
                body = orjson.dumps({"error": {"type": "stand_in", "message": "stand-in", "param": None}})
                self.send_response(status)
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_DELETE = answer

            def log_message(self, *args):
                pass

        self.http = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.http.daemon_threads, self.http.block_on_close = True, False
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}"
        self.thread = threading.Thread(target=self.http.serve_forever, daemon=True)

    def __enter__(self) -> StandIn:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.http.shutdown()
        self.http.server_close()


@pytest.mark.parametrize(
    ("status", "reason"), [(503, "not_ready"), (504, "timeout"), (500, "server_error"), (502, "server_error")]
)
def test_unavailable_statuses_return_no_drafts(status, reason):
    with StandIn(status) as stand_in, DraftClient(stand_in.url, backoff=quick_backoff()) as client:
        assert client.draft([1, 2, 3], 4).skipped == reason
        assert client.draft([1, 2, 3], 4).skipped == "backing_off"


def test_not_ready_server_keeps_the_target_exact(target):
    model, _ = target
    with StandIn(503) as stand_in, DraftClient(stand_in.url, backoff=quick_backoff()) as client:
        _, stats = speculate(model, client, list(range(30)))
        assert stats.num_skipped == len(stats.draft_call_ms) > 0 and len(stand_in.requests) > 1


def test_503_retry_after_is_respected(target):
    with (
        StandIn(503, {"Retry-After": "1"}) as stand_in,
        DraftClient(stand_in.url, backoff=quick_backoff()) as client,
    ):
        assert client.session().draft([1, 2, 3], 4).skipped == "not_ready"
        assert stand_in.requests == ["GET /info"]  # a session first asks which protocol the server speaks
        started = time.monotonic()
        while time.monotonic() - started < 0.9:
            assert client.draft([1, 2, 3], 4).skipped == "backing_off"
            time.sleep(0.05)
        assert stand_in.requests == ["GET /info"]
        wait_out(client)
        assert time.monotonic() - started >= 0.95
        assert client.draft([1, 2, 3], 4).skipped == "not_ready" and len(stand_in.requests) == 2


def test_a_stalled_server_never_holds_the_caller_past_its_deadline():
    with StandIn(200, stall_s=3) as stand_in:
        with DraftClient(stand_in.url, timeout_s=0.2) as client:
            started = time.monotonic()
            assert client.session().draft([1, 2, 3], 4).skipped == "timeout"
            assert time.monotonic() - started < 0.7

        async def async_call():
            async with AsyncDraftClient(stand_in.url, timeout_s=0.2) as client:
                return await client.session().draft([1, 2, 3], 4)

        started = time.monotonic()
        assert asyncio.run(async_call()).skipped == "timeout"
        assert time.monotonic() - started < 0.7


@pytest.mark.parametrize("status", [400, 401, 404, 413, 415])
def test_other_4xx_raise(status):
    with StandIn(status) as stand_in, DraftClient(stand_in.url) as client:
        with pytest.raises(DraftRequestError) as raised:
            client.draft([1, 2, 3], 4)
        assert raised.value.status == status and raised.value.type == "stand_in"
        assert not client.server.backoff.active
