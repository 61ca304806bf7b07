"""The vLLM proposer without vLLM: `propose` called as vLLM's model runner calls it (rows of a numpy token
array, per-row lengths, the tokens sampled this step), against the real server. Drafts equal the engine's
greedy drafts while rows grow, move and finish; calls after a row's first are incremental (v2); a step's rows
are all in flight at once; each row's k fits vLLM's max_model_len; a stopped server gives empty drafts within
the deadline and drafting resumes when it is back; importing the proposer loads no torch and no server code.
What vLLM itself does with the drafts is tests/test_vllm.py's (a real vLLM engine)."""

from __future__ import annotations

import http.server
import json
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest

from drafter.integrations.vllm_proposer import DrafterProposer
from tests.server_process import MAIN_ARGS, REPO, ServerProcess, main_oracle, metric_value, shared_server

K = 4
MAX_MODEL_LEN = 200
NUM_ROWS = 8


def vllm_config(url: str, k: int = K, max_model_len: int = MAX_MODEL_LEN, timeout_s: float = 30, **settings):
    return SimpleNamespace(
        speculative_config=SimpleNamespace(num_speculative_tokens=k),
        model_config=SimpleNamespace(max_model_len=max_model_len),
        additional_config={"drafter": {"url": url, "timeout_s": timeout_s, **settings}},
    )


class Batch:
    """vLLM's InputBatch as a proposer sees it: token ids per row, lengths, this step's sampled tokens."""

    def __init__(self, contexts: list[list[int]], max_model_len: int = MAX_MODEL_LEN):
        self.token_ids = np.zeros((16, max_model_len), dtype=np.int32)
        self.lengths = np.zeros(16, dtype=np.int32)
        self.contexts = []
        for row, context in enumerate(contexts):
            self.put(row, context)

    def put(self, row: int, context: list[int]) -> None:
        self.token_ids[row, : len(context)] = context
        self.lengths[row] = len(context)
        if row == len(self.contexts):
            self.contexts.append(context)
        self.contexts[row] = context

    def propose(self, proposer, sampled=None) -> list[list[int]]:
        sampled = sampled if sampled is not None else [[c[-1]] for c in self.contexts]
        return proposer.propose(sampled, self.lengths, self.token_ids)


@pytest.fixture(scope="module")
def url(request):
    return shared_server(request.config, MAIN_ARGS).url


@pytest.fixture
def proposer(url):
    proposer = DrafterProposer(vllm_config(url))
    yield proposer
    proposer.close()


def draft_rows(sent: list) -> list[dict]:
    """The draft calls among the requests sent, one per row, from /draft and /draft/batch bodies alike."""
    rows = []
    for request in sent:
        if request.path == "/draft":
            rows.append(json.loads(request.body))
        elif request.path == "/draft/batch":
            rows += json.loads(request.body)["requests"]
    return rows


def record_requests(proposer) -> list:
    sent = []
    send = proposer.client.send

    async def recording(request):
        sent.append(request)
        return await send(request)

    proposer.client.send = recording
    return sent


def test_proposer_drafts_equal_the_engine_while_rows_grow_move_and_finish(proposer, url):
    import httpx

    oracle = main_oracle()
    contexts = [[(7 * row + i) % 1000 + 1 for i in range(5 + 9 * row)] for row in range(NUM_ROWS)]
    batch = Batch(contexts)
    sent = record_requests(proposer)
    sessions_before = metric_value(httpx.get(f"{url}/metrics").text, "drafter_sessions_live")
    for step in range(4):
        before = len(sent)
        drafts = batch.propose(proposer)
        assert drafts == [oracle.draft(context, K) for context in batch.contexts]
        assert [request.path for request in sent[before:] if request.method == "POST"] == ["/draft/batch"]
        for row, context in enumerate(batch.contexts):  # the target keeps row % (K + 1) drafts, then its own
            kept = drafts[row][: row % (K + 1)]
            batch.put(row, context + kept + [(step * 31 + row) % 1000 + 1])
    assert (
        metric_value(httpx.get(f"{url}/metrics").text, "drafter_sessions_live") == sessions_before + NUM_ROWS
    )
    rows = draft_rows(sent)
    assert sum("prefix_len" not in row for row in rows) == NUM_ROWS  # one full context per request
    assert len(rows) == 4 * NUM_ROWS

    # rows 0 and 1 finish; vLLM moves the last two requests into their rows
    moved = Batch([batch.contexts[7], batch.contexts[6], *batch.contexts[2:6]])
    sent.clear()
    assert moved.propose(proposer) == [oracle.draft(context, K) for context in moved.contexts]
    assert all("prefix_len" in row for row in draft_rows(sent))


def test_proposer_skips_rows_that_sampled_nothing_and_fits_k_to_max_model_len(proposer):
    oracle = main_oracle()
    near_end = list(range(1, MAX_MODEL_LEN - 1))  # room for one draft: vLLM keeps one slot for its own token
    full = list(range(1, MAX_MODEL_LEN + 1))
    batch = Batch([[5, 6, 7], near_end, full, [9, 10]])
    sent = record_requests(proposer)
    drafts = batch.propose(proposer, sampled=[[7], [near_end[-1]], [full[-1]], []])  # row 3: still prefilling
    assert drafts == [oracle.draft([5, 6, 7], K), oracle.draft(near_end, 1), [], []]
    assert len(draft_rows(sent)) == 2


def test_proposer_asks_for_a_smaller_fixed_k_or_the_servers_auto_k_within_vllms(url, caplog):
    oracle = main_oracle()
    batch = Batch([[3, 4, 5, 6], list(range(20, 50))])
    fixed = DrafterProposer(vllm_config(url, num_draft_tokens=2))
    try:
        assert batch.propose(fixed) == [oracle.draft(c, 2) for c in batch.contexts]
    finally:
        fixed.close()
    auto = DrafterProposer(vllm_config(url, num_draft_tokens="auto"))
    try:
        sent = record_requests(auto)
        for _ in range(3):
            drafts = batch.propose(auto)
            assert all(
                len(d) <= K and d == oracle.draft(c, len(d))
                for d, c in zip(drafts, batch.contexts, strict=True)
            )
            for row, context in enumerate(batch.contexts):
                batch.put(row, context + drafts[row] + [row + 1])
        assert all(row["num_draft_tokens"] == "auto" for row in draft_rows(sent))
        assert "serve drafter with --max-draft-tokens 4" in caplog.text  # the main server drafts up to 16
    finally:
        auto.close()


class SlowStandIn:
    """Answers /info like a drafter and holds every /draft until all `expected` are in flight together (or
    5 s pass): `max_in_flight` then says whether a step's calls were concurrent."""

    def __init__(self, expected: int):
        self.expected, self.in_flight, self.max_in_flight = expected, 0, 0
        self.lock, self.all_in = threading.Lock(), threading.Event()
        stand_in = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def answer(self, fields: dict) -> None:
                body = json.dumps(fields).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                self.answer({"protocol_versions": [1, 2], "max_context": 4096, "max_draft_tokens": 16})

            def do_POST(self):
                self.rfile.read(int(self.headers["Content-Length"]))
                with stand_in.lock:
                    stand_in.in_flight += 1
                    stand_in.max_in_flight = max(stand_in.max_in_flight, stand_in.in_flight)
                    if stand_in.in_flight == stand_in.expected:
                        stand_in.all_in.set()
                stand_in.all_in.wait(5)
                with stand_in.lock:
                    stand_in.in_flight -= 1
                self.answer({"tokens": [1, 2], "session_token": "t"})

            def log_message(self, *args):
                pass

        self.http = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.http.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}"
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()


def test_proposer_sends_a_steps_rows_together_not_one_after_another():
    stand_in = SlowStandIn(NUM_ROWS)
    proposer = DrafterProposer(vllm_config(stand_in.url, timeout_s=10))
    try:
        drafts = Batch([[row + 1, row + 2] for row in range(NUM_ROWS)]).propose(proposer)
        assert drafts == [[1, 2]] * NUM_ROWS
        assert stand_in.max_in_flight == NUM_ROWS
    finally:
        proposer.close()
        stand_in.close()


def test_proposer_with_its_server_stopped_gives_empty_drafts_then_resumes():
    oracle = main_oracle()
    first = ServerProcess(MAIN_ARGS)
    try:
        url = first.wait_ready()
        proposer = DrafterProposer(vllm_config(url, timeout_s=0.5))
        batch = Batch([[3, 4, 5], list(range(10, 40))])
        assert batch.propose(proposer) == [oracle.draft(c, K) for c in batch.contexts]
        first.stop()
        started = time.monotonic()
        for _ in range(5):
            assert batch.propose(proposer) == [[], []]
        assert time.monotonic() - started < 2.5  # refused at once, then backing off: no waits
        assert set(proposer.stats.skipped) <= {"unreachable", "backing_off"}

        second = ServerProcess([*MAIN_ARGS, f"--port={url.rsplit(':', 1)[1]}"])
        try:
            second.wait_ready()
            deadline = time.monotonic() + 30
            while (drafts := batch.propose(proposer)) == [[], []] and time.monotonic() < deadline:
                time.sleep(0.05)  # the backoff's pause runs out
            assert drafts == [oracle.draft(c, K) for c in batch.contexts]
        finally:
            proposer.close()
            second.close()
    finally:
        first.close()


def test_proposer_import_loads_no_torch_and_no_server_code():  # numpy it may: vLLM has it
    code = (
        "import sys, drafter.integrations.vllm_proposer\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'engine', 'transformers')\n"
        "       or m.startswith(('drafter.server', 'drafter.scheduling', 'drafter.sessions'))]\n"
        "print(bad)"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert loaded.stdout.strip() == "[]"
