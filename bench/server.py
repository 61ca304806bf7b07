"""A drafter server in a subprocess for the HTTP variant: `python -m drafter --port 0`, its address read back
from Hypercorn's "Running on" line (no port race), ready once /health/ready answers 200."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

RUNNING_ON = re.compile(r"Running on http://([\d.]+):(\d+)")


class BenchServer:
    def __init__(self, args: list[str], timeout_s: float = 900):
        fd, self.log_path = tempfile.mkstemp(prefix="drafter-bench-", suffix=".log")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "drafter", "--host", "127.0.0.1", "--port", "0", *args],
            stdout=fd,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        os.close(fd)  # the child holds its own copy
        self.timeout_s = timeout_s  # compile and graph capture of a real model can take minutes
        self.url = ""

    def log_text(self) -> str:
        return Path(self.log_path).read_text(errors="replace")

    def wait_ready(self) -> str:
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"drafter server exited with {self.process.returncode}:\n{self.log_text()}"
                )
            if not self.url and (match := RUNNING_ON.search(self.log_text())):
                self.url = f"http://{match[1]}:{match[2]}"
            if self.url:
                try:
                    if httpx.get(f"{self.url}/health/ready", timeout=5).status_code == 200:
                        return self.url
                except httpx.TransportError:
                    pass
            time.sleep(0.2)
        raise TimeoutError(f"drafter server not ready within {self.timeout_s} s:\n{self.log_text()}")

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        os.unlink(self.log_path)

    def __enter__(self) -> BenchServer:
        try:
            self.wait_ready()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()
