"""A real drafter server in a subprocess for the server tests: Hypercorn on 127.0.0.1, port 0 (the kernel
picks a free one; we read it back from Hypercorn's "Running on" log line, so no port race), its log in a
file the test can show on failure.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from pytest import StashKey

REPO = Path(__file__).resolve().parents[1]
RUNNING_ON = re.compile(r"Running on http://([\d.]+):(\d+)")
SERVERS: StashKey[dict] = StashKey()

# The server most tests share: the tiny preset on CPU, small enough contexts to draft in milliseconds, a
# queue deep enough for the 64-client test, and a window wide enough that concurrent clients batch.
MAIN_SIZES = dict(max_seq_len=512, max_batch_size=8, max_draft_tokens=16)
MAIN_ARGS = [
    *(f"--{name.replace('_', '-')}={value}" for name, value in MAIN_SIZES.items()),
    "--max-queue=256",
    "--batch-window-ms=1",
    "--request-timeout-s=30",
    "--device=cpu",
]


class ServerProcess:
    def __init__(self, args: list[str], command: list[str] | None = None, env: dict | None = None, cwd=None):
        fd, self.log_path = tempfile.mkstemp(prefix="drafter-", suffix=".log")
        base = command or [sys.executable, "-m", "drafter", "--port", "0"]
        environ = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
        self.process = subprocess.Popen(
            [*base, *args], stdout=fd, stderr=subprocess.STDOUT, env=environ, cwd=cwd or REPO
        )
        os.close(fd)  # the child holds its own copy
        self.url: str | None = None

    @property
    def log(self) -> str:
        return Path(self.log_path).read_text(errors="replace")

    def wait_for_port(self, timeout_s: float = 60) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            match = RUNNING_ON.search(self.log)
            if match:
                self.url = f"http://{match[1]}:{match[2]}"
                return self.url
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited with {self.process.returncode}:\n{self.log}")
            time.sleep(0.05)
        raise TimeoutError(f"server did not bind within {timeout_s} s:\n{self.log}")

    def wait_ready(self, timeout_s: float = 90) -> str:
        url = self.url or self.wait_for_port(timeout_s)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if httpx.get(f"{url}/health/ready").status_code == 200:
                return url
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited with {self.process.returncode}:\n{self.log}")
            time.sleep(0.1)
        raise TimeoutError(f"server not ready within {timeout_s} s:\n{self.log}")

    def signal(self, signum: int = signal.SIGTERM) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signum)

    def stop(self, timeout_s: float = 30) -> int:
        self.signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise

    def close(self) -> None:
        if self.process.poll() is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.stop()
        os.unlink(self.log_path)


def shared_server(config, args: list[str]) -> ServerProcess:
    """One ready server per distinct argument list for the whole test session (pytest `config`-scoped),
    so test modules that want the same server share its startup cost."""
    servers = config.stash.setdefault(SERVERS, {})
    key = tuple(args)
    if key not in servers:
        server = ServerProcess(args)
        config.add_cleanup(server.close)
        server.wait_ready()
        servers[key] = server
    return servers[key]


def metric_value(text: str, name: str) -> float:
    """The value of one sample (`name` with its labels, as printed) in Prometheus text, 0 if absent."""
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def draft_body(tokens, num_draft_tokens=None, **fields) -> dict:
    body = {"tokens": list(tokens), **fields}
    if num_draft_tokens is not None:
        body["num_draft_tokens"] = num_draft_tokens
    return body


@functools.cache
def main_oracle():
    """The in-process engine with the main server's sizes: what every HTTP draft must equal."""
    from engine.config import EngineConfig
    from engine.engine import Engine

    engine = Engine.load("tiny", EngineConfig(device="cpu", dtype="float32", **MAIN_SIZES))
    engine.warmup()
    return engine
