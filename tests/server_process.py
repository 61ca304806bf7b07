"""The servers the tests share: the main server's arguments, `shared_server` (one process per distinct
argument list for the whole session), and helpers to read /metrics and build draft bodies. Starting a
process is bench/harness/server.py's `ServerProcess`, the one launcher tests and benchmarks share.
"""

from __future__ import annotations

import functools

from pytest import StashKey

from bench.harness.server import REPO, ServerProcess

__all__ = ["REPO", "ServerProcess", "shared_server", "metric_value", "draft_body", "main_oracle"]

SERVERS: StashKey[dict] = StashKey()

# The server most tests share: the tiny preset on CPU, small enough contexts to draft in milliseconds, a
# queue deep enough for the 64-client test, a window wide enough that concurrent clients batch, and a body
# deadline short enough for a test to wait it out.
MAIN_SIZES = dict(max_seq_len=512, max_batch_size=8, max_draft_tokens=16)
BODY_TIMEOUT_S = 2.0
MAIN_ARGS = [
    *(f"--{name.replace('_', '-')}={value}" for name, value in MAIN_SIZES.items()),
    "--max-queue=256",
    "--batch-window-ms=1",
    "--request-timeout-s=30",
    f"--body-timeout-s={BODY_TIMEOUT_S}",
    "--device=cpu",
    # These tests check drafts against the engine's own; suffix drafting has its own (test_server_suffix).
    "--draft-source=model",
]
MAX_BODY_BYTES = 16 * MAIN_SIZES["max_seq_len"] + 4096  # ServerConfig.max_body_bytes


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
