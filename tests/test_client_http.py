"""The clients' HTTP/1.1 pools (drafter/client/aio_http.py, sync_http.py) against small asyncio servers that
misbehave on purpose: keep-alive reuse, a server that drops idle connections, refused connections, a Unix
socket, a call cancelled or timed out mid-answer, bad URLs. (The real server: tests/test_client_server.py.)"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import threading
import time
from pathlib import Path

import orjson
import pytest

from drafter.client import AsyncDraftClient, DraftClient, sync_http
from drafter.client.aio_http import ConnectionPool
from drafter.client.http11 import Origin, TransportError

ANSWER = orjson.dumps({"tokens": [7, 8], "cached": 0})


class StandIn:
    """Answers every request with ANSWER; `drop_after_answer` closes each connection silently after one
    answer (as a server's idle timeout would, later); `silent` never answers."""

    def __init__(self, drop_after_answer: bool = False, silent: bool = False):
        self.drop_after_answer, self.silent = drop_after_answer, silent
        self.connections = 0
        self.requests: list[bytes] = []
        self.writers: list[asyncio.StreamWriter] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.writers.append(writer)
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    (int(line.split(b":")[1]) for line in head.lower().split(b"\r\n")
                     if line.startswith(b"content-length:")), 0,
                )  # fmt: skip
                body = await reader.readexactly(length)
                self.requests.append(head + body)
                if self.silent:
                    await asyncio.sleep(3600)
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                    + f"content-length: {len(ANSWER)}\r\n\r\n".encode()
                    + ANSWER
                )
                await writer.drain()
                if self.drop_after_answer:
                    break
        writer.close()


@contextlib.asynccontextmanager
async def serving(stand_in: StandIn, unix_path: str | None = None):
    if unix_path:
        server = await asyncio.start_unix_server(stand_in.handle, unix_path)
        url = f"unix:{unix_path}"
    else:
        server = await asyncio.start_server(stand_in.handle, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    async with server:
        yield url
        # Python 3.12's Server.wait_closed waits for every connection: close the ones a test left open.
        for writer in stand_in.writers:
            writer.transport.abort()


def test_requests_reuse_one_keep_alive_connection():
    async def run():
        stand_in = StandIn()
        async with serving(stand_in) as url:
            pool = ConnectionPool(url, {"Authorization": "Bearer k"}, max_connections=4)
            for _ in range(5):
                status, headers, body = await pool.request("POST", "/draft", b'{"tokens":[1]}')
                assert (status, headers["content-type"], body) == (200, "application/json", ANSWER)
            await pool.aclose()
        assert stand_in.connections == 1 and len(stand_in.requests) == 5
        assert all(b"authorization: bearer k" in r.lower() for r in stand_in.requests)

    asyncio.run(run())


def test_a_connection_the_server_dropped_is_replaced_and_the_call_succeeds():
    async def run():
        stand_in = StandIn(drop_after_answer=True)
        async with serving(stand_in) as url:
            pool = ConnectionPool(url, {}, max_connections=1)
            for _ in range(3):
                assert (await pool.request("GET", "/health/live"))[0] == 200
            await pool.aclose()
        assert stand_in.connections == 3

    asyncio.run(run())


def test_a_dropped_connection_reused_before_the_close_is_seen_is_retried_once():
    async def run():
        stand_in = StandIn(drop_after_answer=True)
        async with serving(stand_in) as url:
            pool = ConnectionPool(url, {}, max_connections=1)
            await pool.request("GET", "/health/live")
            pool.idle[0].reader.at_eof = lambda: False  # as if the loop had not yet seen the server's close
            assert (await pool.request("GET", "/health/live"))[0] == 200
            await pool.aclose()
        assert stand_in.connections == 2

    asyncio.run(run())


def test_a_refused_connection_is_a_transport_error_and_no_drafts():
    async def run():
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        server.close()
        await server.wait_closed()
        with pytest.raises(TransportError):
            await ConnectionPool(f"http://127.0.0.1:{port}", {}, 1).request("GET", "/health/live")
        async with AsyncDraftClient(f"http://127.0.0.1:{port}", timeout_s=2) as client:
            drafts = await client.draft([1, 2, 3], 2)
        assert drafts.tokens == [] and drafts.skipped == "unreachable"

    asyncio.run(run())


def test_unix_socket_origin():
    async def run():
        with tempfile.TemporaryDirectory() as directory:
            stand_in = StandIn()
            async with (
                serving(stand_in, str(Path(directory) / "drafter.sock")) as url,
                AsyncDraftClient(url, timeout_s=2) as client,
            ):
                drafts = await client.draft([1, 2, 3], 2)
            assert drafts.tokens == [7, 8] and stand_in.connections == 1

    asyncio.run(run())


def test_a_call_cancelled_mid_answer_closes_its_connection():
    async def run():
        stand_in = StandIn(silent=True)
        async with serving(stand_in) as url:
            pool = ConnectionPool(url, {}, max_connections=1)
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.2):
                    await pool.request("POST", "/draft", b"{}")
            assert pool.idle == []  # never reused: its answer may still arrive
            await pool.aclose()

    asyncio.run(run())


@pytest.mark.parametrize("url", ["ftp://host:1", "http://", "http://host:1/prefix", "localhost:8000"])
def test_bad_urls_are_refused(url):
    with pytest.raises(ValueError):
        Origin(url)


@contextlib.contextmanager
def serving_in_a_thread(stand_in: StandIn, unix_path: str | None = None):
    """The stand-in on its own event loop in a thread, for the blocking client."""
    loop = asyncio.new_event_loop()
    started, address, stop = threading.Event(), [], []

    async def main():
        stop.append(asyncio.Event())
        async with serving(stand_in, unix_path) as url:
            address.append(url)
            started.set()
            await stop[0].wait()

    thread = threading.Thread(target=loop.run_until_complete, args=(main(),), daemon=True)
    thread.start()
    started.wait(10)
    try:
        yield address[0]
    finally:
        loop.call_soon_threadsafe(stop[0].set)
        thread.join(10)
        loop.close()


def soon(seconds: float = 5.0) -> float:
    return time.monotonic() + seconds


def test_sync_requests_reuse_one_connection_and_replace_a_dropped_one():
    stand_in = StandIn()
    with serving_in_a_thread(stand_in) as url:
        pool = sync_http.ConnectionPool(url, {}, max_connections=2)
        for _ in range(5):
            assert pool.request("POST", "/draft", b"{}", deadline=soon())[2] == ANSWER
        pool.close()
    assert stand_in.connections == 1
    dropping = StandIn(drop_after_answer=True)
    with serving_in_a_thread(dropping) as url:
        pool = sync_http.ConnectionPool(url, {}, max_connections=1)
        assert pool.request("GET", "/health/live", deadline=soon())[0] == 200
        time.sleep(0.05)  # the server's close has arrived: the idle connection reads as ended
        assert pool.request("GET", "/health/live", deadline=soon())[0] == 200
        pool.close()
    assert dropping.connections == 2


def test_sync_a_dropped_connection_reused_before_the_close_is_seen_is_retried_once(monkeypatch):
    stand_in = StandIn(drop_after_answer=True)
    with serving_in_a_thread(stand_in) as url:
        pool = sync_http.ConnectionPool(url, {}, max_connections=1)
        pool.request("GET", "/health/live", deadline=soon())
        monkeypatch.setattr(sync_http.Connection, "usable", property(lambda self: True))
        time.sleep(0.05)
        assert pool.request("GET", "/health/live", deadline=soon())[0] == 200
        pool.close()
    assert stand_in.connections == 2


def test_sync_a_silent_server_costs_the_deadline_and_not_more():
    with serving_in_a_thread(StandIn(silent=True)) as url:
        pool = sync_http.ConnectionPool(url, {}, max_connections=1)
        started = time.monotonic()
        with pytest.raises(sync_http.CallTimeout):
            pool.request("POST", "/draft", b"{}", deadline=soon(0.2))
        assert time.monotonic() - started < 1.0 and pool.idle == []
        pool.close()


def test_sync_client_over_a_unix_socket_then_refused_once_it_is_gone():
    with tempfile.TemporaryDirectory() as directory:
        stand_in = StandIn()
        path = str(Path(directory) / "drafter.sock")
        with serving_in_a_thread(stand_in, path) as url, DraftClient(url, timeout_s=2) as client:
            assert client.draft([1, 2, 3], 2).tokens == [7, 8]
        with DraftClient(f"unix:{path}", timeout_s=2) as client:
            drafts = client.draft([1, 2, 3], 2)
        assert drafts.tokens == [] and drafts.skipped == "unreachable"
