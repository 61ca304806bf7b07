"""`--uds PATH`: the same routes on a Unix domain socket beside TCP, for a target on the same host; a stale
socket left by a killed server is replaced, a live one or a plain file refused in one line."""

from __future__ import annotations

import socket
import subprocess
import sys

import httpx

from tests.server_process import MAIN_ARGS, REPO, ServerProcess, draft_body


def start_second_server(path) -> subprocess.CompletedProcess:
    """A server asked to listen on `path`, which must refuse it at once (it never gets to load a model)."""
    command = [sys.executable, "-m", "drafter", "--port", "0", "--uds", str(path)]
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=60)


def test_uds_serves_the_same_drafts_as_tcp_and_is_removed_at_exit(tmp_path):
    path = tmp_path / "drafter.sock"
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(path))  # a socket file nobody listens on, as a killed server leaves it
    stale.close()
    server = ServerProcess([*MAIN_ARGS, "--uds", str(path)])
    try:
        url = server.wait_ready()
        body = draft_body(list(range(40)), 6)
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(path)), base_url="http://drafter") as local:
            assert local.get("/health/ready").status_code == 200
            over_uds = local.post("/draft", json=body)
        over_tcp = httpx.post(f"{url}/draft", json=body)
        assert over_uds.status_code == over_tcp.status_code == 200
        assert over_uds.json()["tokens"] == over_tcp.json()["tokens"]
        second = start_second_server(path)
        assert second.returncode == 2 and "another server is listening" in second.stderr
        assert server.stop() == 0
    finally:
        server.close()
    assert not path.exists()


def test_uds_path_that_is_a_plain_file_is_refused(tmp_path):
    path = tmp_path / "not-a-socket"
    path.write_text("keep me")
    done = start_second_server(path)
    assert done.returncode == 2 and "is not a socket" in done.stderr
    assert path.read_text() == "keep me"
