"""An engine that breaks turns readiness and liveness to 503 (so an orchestrator restarts the process); one
that cannot load ends the process with status 1."""

from __future__ import annotations

import json
import time

from starlette.testclient import TestClient

from drafter.server.app import create_app
from drafter.server.config import ServerConfig
from engine.model.presets import write_preset
from tests.server_process import ServerProcess


def wait_ready(client: TestClient, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while client.get("/health/ready").status_code != 200:
        assert time.monotonic() < deadline, client.get("/health/ready").json()
        time.sleep(0.05)


def test_device_error_while_drafting_fails_readiness_and_liveness():
    app = create_app(ServerConfig(device="cpu", max_seq_len=256, max_batch_size=2))
    with TestClient(app) as client:
        wait_ready(client)
        assert client.post("/draft", json={"tokens": [1, 2, 3]}).status_code == 200

        def device_error(requests):  # what a CUDA fault looks like from the engine thread
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

        app.state.runtime.batcher.draft_batch = device_error
        failed = client.post("/draft", json={"tokens": [1, 2, 3]})
        assert failed.status_code == 503
        assert failed.json()["error"]["type"] == "not_ready"
        assert "illegal memory access" not in failed.text  # internals stay in the log
        live, ready = client.get("/health/live"), client.get("/health/ready")
        assert live.status_code == 503 and live.json()["status"] == "failed"
        assert ready.status_code == 503 and ready.json()["stage"] == "failed"
        assert client.post("/draft", json={"tokens": [4, 5]}).status_code == 503


def test_checkpoint_that_fails_to_load_exits_1(tmp_path):
    # Passes the quick startup check (valid config.json, weights present) but the tensors do not fit it.
    directory = write_preset("tiny", tmp_path / "broken")
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps(config | {"intermediate_size": 96}))
    server = ServerProcess([f"--model={directory}", "--device=cpu", "--max-seq-len=256"])
    try:
        assert server.process.wait(60) == 1, server.log
        assert "could not start the engine" in server.log and "Traceback" not in server.log
    finally:
        server.close()
