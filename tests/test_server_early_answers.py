"""An answer the server gives before reading a body goes out at once (fault: an unauthenticated request
announcing a huge Content-Length was never answered, its connection held until the body deadline). Over
HTTP/1.1 a body announced over the cap is never read and its connection is closed after the answer; a small
one is drained after the answer and the connection kept. Against a real server with --api-key."""

from __future__ import annotations

import socket
import time

import pytest

from tests.server_process import shared_server
from tests.test_server_backpressure import API_KEY, STRICT_ARGS
from tests.test_server_hardening import connect, read_response

MAX_BODY_BYTES = 16 * 2048 + 4096  # STRICT_ARGS' --max-seq-len=2048: ServerConfig.max_body_bytes


@pytest.fixture(scope="module")
def url(request):
    return shared_server(request.config, STRICT_ARGS).url


def head(path: str, length: int, auth: bool = False, method: str = "POST") -> bytes:
    authorization = f"Authorization: Bearer {API_KEY}\r\n" if auth else ""
    return (
        f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n{authorization}"
        f"Content-Length: {length}\r\n\r\n"
    ).encode()


def closed_by_server(sock: socket.socket) -> bool:
    sock.settimeout(5)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


PROTECTED = [("POST", "/draft"), ("GET", "/info"), ("GET", "/metrics"), ("DELETE", "/sessions/some-name")]


@pytest.mark.parametrize("method, path", PROTECTED)
def test_unauthenticated_huge_body_is_refused_at_once_and_its_connection_closed(url, method, path):
    with connect(url) as sock:
        started = time.monotonic()
        sock.sendall(head(path, 99_999_999, method=method))  # and never a body byte
        sock.settimeout(5)
        status, headers, body = read_response(sock)
        assert time.monotonic() - started < 2, "answered only after waiting for the body"
        assert status == 401 and headers["connection"] == "close"
        assert b"99999999" not in body
        assert closed_by_server(sock)


def test_unauthenticated_small_body_is_refused_at_once_and_the_connection_kept(url):
    payload = b'{"tokens": [1, 2, 3]}'
    with connect(url) as sock:
        started = time.monotonic()
        sock.sendall(head("/draft", len(payload)))  # the body comes after the answer
        sock.settimeout(5)
        status, headers, _ = read_response(sock)
        assert status == 401 and time.monotonic() - started < 2
        assert headers.get("connection") != "close"
        sock.sendall(payload)  # drained after the answer
        sock.sendall(head("/draft", len(payload), auth=True) + payload)  # the same connection, next request
        status, _, body = read_response(sock)
        assert status == 200 and b'"tokens"' in body


def test_a_body_announced_over_the_cap_is_refused_unread_with_413_at_once(url):
    with connect(url) as sock:
        started = time.monotonic()
        sock.sendall(head("/draft", MAX_BODY_BYTES + 1, auth=True))
        sock.settimeout(5)
        status, headers, _ = read_response(sock)
        assert status == 413 and headers["connection"] == "close" and time.monotonic() - started < 2
        assert closed_by_server(sock)
