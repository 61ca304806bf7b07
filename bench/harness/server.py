"""The one launcher for a drafter server process, used by the benchmarks and the tests alike.

`python -m drafter --host 127.0.0.1 --port 0 [args]` (or another command, such as `serve.sh`) runs with this
checkout first on PYTHONPATH, so it serves the same code as the caller; its address is read back from
Hypercorn's "Running on" log line (port 0: the kernel picks a free port, so there is no port race), and it
is ready once /health/ready answers 200. Its log goes to a file the caller can show when something fails.
It knows nothing of pytest; sharing one server between tests is tests/server_process.py's business.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]
RUNNING_ON = re.compile(r"Running on http://([\d.]+):(\d+)")
DEFAULT_COMMAND = [sys.executable, "-m", "drafter", "--host", "127.0.0.1", "--port", "0"]


def free_port() -> int:
    """A port free now, for a server that must come back on the same address (a restart, a target whose
    config names one URL); port 0 is better wherever the caller can read the port back."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class ServerProcess:
    def __init__(
        self,
        args: list[str],
        command: list[str] | None = None,
        env: dict | None = None,
        cwd=None,
        timeout_s: float = 90,
    ):
        fd, self.log_path = tempfile.mkstemp(prefix="drafter-", suffix=".log")
        pythonpath = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
        environ = {**os.environ, "PYTHONPATH": pythonpath, "PYTHONUNBUFFERED": "1", **(env or {})}
        self.process = subprocess.Popen(
            [*(command or DEFAULT_COMMAND), *args],
            stdout=fd,
            stderr=subprocess.STDOUT,
            env=environ,
            cwd=cwd or REPO,
        )
        os.close(fd)  # the child holds its own copy
        self.timeout_s = timeout_s  # compile and graph capture of a real model can take minutes
        self.url: str | None = None

    @property
    def log(self) -> str:
        return Path(self.log_path).read_text(errors="replace")

    def check_running(self) -> None:
        if self.process.poll() is not None:
            raise RuntimeError(f"drafter server exited with {self.process.returncode}:\n{self.log}")

    def wait_for_port(self, timeout_s: float | None = None) -> str:
        deadline = time.monotonic() + (timeout_s or self.timeout_s)
        while time.monotonic() < deadline:
            if match := RUNNING_ON.search(self.log):
                self.url = f"http://{match[1]}:{match[2]}"
                return self.url
            self.check_running()
            time.sleep(0.05)
        raise TimeoutError(f"drafter server did not bind within {timeout_s or self.timeout_s} s:\n{self.log}")

    def wait_ready(self, timeout_s: float | None = None) -> str:
        timeout_s = timeout_s or self.timeout_s
        url = self.url or self.wait_for_port(timeout_s)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{url}/health/ready", timeout=5).status_code == 200:
                    return url
            self.check_running()
            time.sleep(0.1)
        raise TimeoutError(f"drafter server not ready within {timeout_s} s:\n{self.log}")

    def signal(self, signum: int = signal.SIGTERM) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signum)

    def stop(self, timeout_s: float = 30) -> int:
        """SIGTERM, then wait for the exit status (kill, and raise, if it does not come in time)."""
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
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.log_path)

    def __enter__(self) -> ServerProcess:
        try:
            self.wait_ready()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()
