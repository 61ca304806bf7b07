"""What an adversarial HTTP/1.1 client does to a real server: a body that never finishes gets 408 at the
body deadline, a client hanging up mid-body is counted as disconnected (no 5xx, no traceback), a trailing
slash is a JSON 404 (no redirect built from the Host header), malformed framing is refused below the app
without harm, and SIGTERM is prompt and quiet while clients hold idle or half-sent connections."""

from __future__ import annotations

import socket
import time

import httpx
import orjson
import pytest

from tests.server_process import BODY_TIMEOUT_S, MAIN_ARGS, ServerProcess, metric_value, shared_server

PARTIAL_HEAD = (
    b"POST /draft HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    b"Content-Length: 100\r\n\r\n"
)
PARTIAL_BODY = b'{"tokens": [1, 2'  # far less than the 100 bytes announced


@pytest.fixture(scope="module")
def server(request):
    return shared_server(request.config, MAIN_ARGS)


def connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=30)


def read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 response with a Content-Length body: status, headers (lower-cased), body."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"connection closed after {data!r}")
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {name.strip().lower(): value.strip() for name, value in (ln.split(":", 1) for ln in lines)}
    while len(body) < int(headers.get("content-length", 0)):
        body += sock.recv(65536)
    return int(status_line.split()[1]), headers, body


def metrics(url: str) -> str:
    return httpx.get(f"{url}/metrics").text


def server_errors(text: str) -> float:
    return sum(metric_value(text, f'drafter_request_seconds_count{{status="{s}"}}') for s in (500, 502, 503))


def test_draft_body_that_never_finishes_gets_408_at_the_body_deadline(server):
    with connect(server.url) as sock:
        sock.sendall(PARTIAL_HEAD + PARTIAL_BODY)
        started = time.monotonic()
        status, headers, body = read_response(sock)
        waited = time.monotonic() - started
    assert status == 408
    error = orjson.loads(body)["error"]
    assert error["type"] == "body_timeout"
    assert f"{BODY_TIMEOUT_S:g} s" in error["message"]
    assert BODY_TIMEOUT_S * 0.9 < waited < BODY_TIMEOUT_S + 10
    assert metric_value(metrics(server.url), 'drafter_rejections_total{reason="body_timeout"}') >= 1


def test_draft_client_hanging_up_mid_body_is_counted_as_disconnected(server):
    before, log_before = metrics(server.url), len(server.log)
    with connect(server.url) as sock:
        sock.sendall(PARTIAL_HEAD + PARTIAL_BODY)
        time.sleep(0.2)  # the handler is now waiting for the rest of the body
    key = 'drafter_rejections_total{reason="disconnected"}'
    deadline = time.monotonic() + 10
    while metric_value(after := metrics(server.url), key) == metric_value(before, key):
        assert time.monotonic() < deadline, "the hang-up was never counted as a disconnect"
        time.sleep(0.02)
    assert metric_value(after, key) == metric_value(before, key) + 1
    assert server_errors(after) == server_errors(before)
    assert "Traceback" not in server.log[log_before:]


@pytest.mark.parametrize("path", ["/health/live/", "/draft/", "/info/"])
def test_trailing_slash_is_a_json_404_without_redirect(server, path):
    response = httpx.request(
        "POST" if path == "/draft/" else "GET",
        server.url + path,
        headers={"Host": "attacker.example"},
        json={"tokens": [1]},
    )
    assert response.status_code == 404
    assert "location" not in response.headers
    assert response.json()["error"]["type"] == "not_found"
    assert "attacker" not in response.text


FRAMING_ERRORS = {
    # Hypercorn answers these itself, before the app sees a request: empty bodies, no hook to shape them.
    "no request line": (b"GARBAGE\r\n\r\n", 400),
    "header without colon": (b"GET /health/live HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n", 400),
    "bad chunk size": (
        PARTIAL_HEAD.replace(b"Content-Length: 100", b"Transfer-Encoding: chunked") + b"ZZ\r\n",
        400,
    ),
    # past h11's 16 KiB limit on a head still incomplete (one that arrives whole in a single read passes)
    "oversized headers": (b"GET /health/live HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 20_000, 431),
}


@pytest.mark.parametrize("name", FRAMING_ERRORS)
def test_malformed_framing_is_refused_and_the_server_keeps_serving(server, name):
    raw, status = FRAMING_ERRORS[name]
    log_before = len(server.log)
    with connect(server.url) as sock:
        sock.sendall(raw)
        assert read_response(sock)[0] == status
        assert sock.recv(1) == b""  # and the connection is closed
    assert httpx.post(f"{server.url}/draft", json={"tokens": [1, 2, 3]}).status_code == 200
    assert "Traceback" not in server.log[log_before:]


def test_sigterm_is_prompt_and_quiet_with_idle_and_half_sent_connections():
    server = ServerProcess([*MAIN_ARGS, "--drain-timeout-s=20"])
    try:
        url = server.wait_ready()
        keep_alive = httpx.Client(base_url=url)
        assert keep_alive.get("/health/live").status_code == 200  # its connection now idles in the pool
        multiplexed = httpx.Client(base_url=url, http1=False, http2=True)
        assert multiplexed.get("/health/live").http_version == "HTTP/2"
        fresh, silent = connect(url), connect(url)  # one never sends a byte, one stops mid-body
        silent.sendall(PARTIAL_HEAD + PARTIAL_BODY)
        time.sleep(0.2)
        started = time.monotonic()
        server.signal()
        code = server.process.wait(20)
        took = time.monotonic() - started
        silent_status = read_response(silent)[0]
        assert code == 0, server.log
        assert took < 3, f"SIGTERM took {took:.1f} s:\n{server.log}"
        assert silent_status == 503  # told the server is going away, not left hanging
        assert "Traceback" not in server.log and "Exception" not in server.log, server.log
        for closable in (keep_alive, multiplexed, fresh, silent):
            closable.close()
    finally:
        server.close()
