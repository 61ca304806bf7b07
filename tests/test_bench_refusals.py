"""A bench command whose request the server refuses (a context over its --max-seq-len, a k over its
--max-draft-tokens) ends in one line naming the server's error and the flag to change, exit 2, not a
traceback (the fault: bench/overhead.py died in a RuntimeError traceback)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from bench.harness.refusals import ServerRefused
from tests.server_process import MAIN_ARGS, REPO, shared_server

COMMANDS = {
    "overhead": ["bench/overhead.py", "--contexts", "600", "--calls", "1"],
    "overhead k": ["bench/overhead.py", "--contexts", "100", "--k", "40", "--calls", "1"],
    "latency http": ["bench/latency.py", "--model", "tiny", "--variants", "http", "--patterns", "cold",
                     "--contexts", "600", "--draft-lengths", "4", "--concurrency", "1", "--calls", "1"],
}  # fmt: skip
FLAGS = {"overhead": "--max-seq-len", "overhead k": "--max-draft-tokens", "latency http": "--max-seq-len"}


@pytest.fixture(scope="module")
def url(request):
    return shared_server(request.config, MAIN_ARGS).url  # --max-seq-len=512, --max-draft-tokens=16


@pytest.mark.parametrize("name", COMMANDS)
def test_a_refused_bench_request_is_one_line_and_exit_2(url, name):
    target = ["--targets", url] if name.startswith("overhead") else ["--url", url]
    command = [sys.executable, *COMMANDS[name], *target]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    [line] = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert FLAGS[name] in line
    if name.startswith("overhead"):  # the server's own error, as it said it
        assert "the server refused POST /draft: 400 invalid_request: " in line
    else:  # drafter.client saw from /info that the context does not fit, and sent nothing
        assert "no drafts (context_too_long)" in line


def test_a_refusal_without_a_json_error_still_says_what_came_back():
    refusal = ServerRefused(502, b"<html>bad gateway</html>", "POST /draft")
    assert str(refusal) == "the server refused POST /draft: 502 error: <html>bad gateway</html>"
