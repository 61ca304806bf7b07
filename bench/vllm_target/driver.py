"""Starts a vLLM target (bench/vllm_target/target.py) under the vLLM venv's Python and drives it: the tests
and bench/vllm_target/peers.py share this. The venv is `.venv-vllm` at the repository root
(bench/vllm_target/install.sh makes it) or the Python named by DRAFTER_VLLM_PYTHON. No vLLM import here: this
runs in the project's venv.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import tempfile
import threading
from pathlib import Path

from bench.harness.server import REPO

MARK = "VLLM_TARGET "  # bench/vllm_target/target.py's answer lines
STARTUP_TIMEOUT_S = 600  # 35-55 s on a quiet 2-core machine; a busy one triples it


def vllm_python() -> Path:
    return Path(os.environ.get("DRAFTER_VLLM_PYTHON") or REPO / ".venv-vllm" / "bin" / "python")


def vllm_available() -> bool:
    return vllm_python().exists()


class VllmTarget:
    """One vLLM engine process. `generate` sends a command and waits for its answer; `send` and `receive`
    split that, so a caller can act while vLLM generates (stop the drafter mid-run)."""

    def __init__(self, model: Path, speculation: str = "none", *, env: dict | None = None, **options):
        fd, self.log_path = tempfile.mkstemp(prefix="vllm-target-", suffix=".log")
        args = [str(vllm_python()), str(REPO / "bench" / "vllm_target" / "target.py"), "--model", str(model)]
        args += ["--speculation", speculation]
        for name, value in options.items():
            flag = f"--{name.replace('_', '-')}"
            if isinstance(value, bool):  # a switch: named when on
                args += [flag] if value else []
            else:
                args += [flag, str(value)]
        pythonpath = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
        self.process = subprocess.Popen(
            args,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=fd,
            text=True,
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": pythonpath, "PYTHONUNBUFFERED": "1", **(env or {})},
        )
        os.close(fd)
        try:
            self.ready = self.receive(STARTUP_TIMEOUT_S)
        except BaseException:  # never leave an engine running behind a failed start
            self.process.kill()
            self.process.wait()
            raise

    @property
    def log(self) -> str:
        return Path(self.log_path).read_text(errors="replace")

    def send(
        self, prompts: list[list[int]], max_tokens: list[int] | int, stop_token_ids: list[int] | None = None
    ) -> None:
        """Starts a `generate`: every row runs to max_tokens, or to the first of `stop_token_ids` if given."""
        if isinstance(max_tokens, int):
            max_tokens = [max_tokens] * len(prompts)
        command = {"prompts": prompts, "max_tokens": max_tokens}
        if stop_token_ids:
            command["stop_token_ids"] = stop_token_ids
        self.process.stdin.write(json.dumps(command) + "\n")
        self.process.stdin.flush()

    def receive(self, timeout_s: float = STARTUP_TIMEOUT_S) -> dict:
        """The next answer line; raises with vLLM's log if the process dies or says nothing in time."""
        answer: list[dict] = []

        def read() -> None:
            for line in self.process.stdout:
                if line.startswith(MARK):
                    answer.append(json.loads(line[len(MARK) :]))
                    return

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        reader.join(timeout_s)
        if not answer:
            state = "exited" if self.process.poll() is not None else f"said nothing in {timeout_s:.0f} s"
            raise RuntimeError(f"vLLM target {state}; its log ends:\n{self.log[-6000:]}")
        return answer[0]

    def generate(
        self,
        prompts: list[list[int]],
        max_tokens: list[int] | int,
        stop_token_ids: list[int] | None = None,
        timeout_s: float = 600,
    ) -> dict:
        self.send(prompts, max_tokens, stop_token_ids)
        return self.receive(timeout_s)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.process.stdin.close()  # the runner's loop ends, and vLLM shuts its engine down
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.log_path)

    def __enter__(self) -> VllmTarget:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
