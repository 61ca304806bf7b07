"""The sync client's connections: keep-alive HTTP/1.1 (drafter/client/http11.py) on blocking sockets.

Every request has a deadline (the call's): each socket operation waits at most the time left, so a server
that trickles bytes cannot hold the caller past it (`socket.timeout` -> `CallTimeout`). Otherwise as the
async pool: the most recently used idle connection is reused if the server has not closed it, one that
ends before a byte of the answer as it is reused is retried once on a new connection, and a connection
whose request failed or timed out is closed. One pool may be shared by threads (a lock guards the idle
list; each request holds its connection alone).
"""

from __future__ import annotations

import select
import socket
import ssl
import threading
import time
from collections.abc import Callable

from drafter.client.http11 import (
    READ_CHUNK,
    Answer,
    Http11,
    Origin,
    StaleConnection,
    TransportError,
    request_headers,
)


class CallTimeout(TransportError):
    """The call's deadline passed before its answer was complete."""


class Connection:
    def __init__(self, sock: socket.socket):
        self.sock, self.http = sock, Http11()

    @classmethod
    def open(cls, origin: Origin, deadline: float) -> Connection:
        try:
            if origin.unix_path is not None:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.settimeout(remaining(deadline))
                sock.connect(origin.unix_path)
            else:
                sock = socket.create_connection((origin.host, origin.port), timeout=remaining(deadline))
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                if origin.tls:
                    sock = ssl.create_default_context().wrap_socket(sock, server_hostname=origin.host)
        except TimeoutError as error:
            raise CallTimeout("the deadline passed while connecting") from error
        except OSError as error:
            raise TransportError(f"cannot connect: {error}") from error
        return cls(sock)

    @property
    def usable(self) -> bool:
        """Idle, and nothing to read: a closed connection reads as readable (its end), so it is not reused."""
        if not self.http.idle:
            return False
        try:
            readable, _, _ = select.select([self.sock], [], [], 0)
        except (OSError, ValueError):
            return False
        return not readable

    def exchange(self, method: str, path: str, headers: list, body: bytes | None, deadline: float) -> Answer:
        try:
            self.sock.settimeout(remaining(deadline))
            self.sock.sendall(self.http.request(method, path, headers, body))
            while True:
                self.sock.settimeout(remaining(deadline))
                if (answer := self.http.feed(self.sock.recv(READ_CHUNK))) is not None:
                    return answer
        except TimeoutError as error:
            raise CallTimeout("the deadline passed before the answer was complete") from error
        except OSError as error:
            raise self.http.failure(f"{type(error).__name__}: {error}") from error

    def close(self) -> None:
        self.sock.close()


def remaining(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise CallTimeout("the call's deadline passed")
    return left


class ConnectionPool:
    """Keep-alive connections to one origin; `headers` go with every request. `on_request` hooks see each
    request as sent (method, path, body): for tests and tracing."""

    def __init__(self, url: str, headers: dict[str, str], max_connections: int):
        self.origin = Origin(url)
        self.headers = dict(headers)
        self.max_idle = max_connections
        self.idle: list[Connection] = []
        self.lock = threading.Lock()
        self.on_request: list[Callable[[str, str, bytes | None], None]] = []
        self.closed = False

    def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
        *,
        deadline: float,
    ) -> Answer:
        if self.closed:
            raise TransportError("the client is closed")
        header_list = request_headers(self.origin, self.headers, headers, body)
        for hook in self.on_request:
            hook(method, path, body)
        if (connection := self.reuse()) is not None:
            try:
                return self.exchange(connection, method, path, header_list, body, deadline)
            except StaleConnection:
                pass  # closed by the server as we reused it: once more, on a new connection
        connection = Connection.open(self.origin, deadline)
        try:
            return self.exchange(connection, method, path, header_list, body, deadline)
        except StaleConnection as error:
            raise TransportError(str(error)) from error

    def exchange(self, connection: Connection, method, path, headers, body, deadline: float) -> Answer:
        try:
            answer = connection.exchange(method, path, headers, body, deadline)
        except BaseException:  # failed or timed out: its state is unknown
            connection.close()
            raise
        with self.lock:
            if connection.http.idle and not self.closed and len(self.idle) < self.max_idle:
                self.idle.append(connection)
                return answer
        connection.close()  # the server asked to close, the pool closed meanwhile, or it is full
        return answer

    def reuse(self) -> Connection | None:
        while True:
            with self.lock:
                if not self.idle:
                    return None
                connection = self.idle.pop()  # the most recent: the least likely to have timed out
            if connection.usable:
                return connection
            connection.close()

    def close(self) -> None:
        with self.lock:
            self.closed = True
            idle, self.idle = self.idle, []
        for connection in idle:
            connection.close()
