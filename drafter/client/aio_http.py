"""The async client's connections: keep-alive HTTP/1.1 (drafter/client/http11.py) on asyncio streams.

Up to `max_connections` connections to one origin, the most recently used reused first. A connection the
server has closed (its keep-alive timeout) is noticed before reuse and replaced; one that ends before a
byte of the answer as it is reused is retried once on a new connection. A call cancelled or timed out
mid-answer (asyncio.timeout around it, the caller's deadline) closes its connection: it is never reused.
"""

from __future__ import annotations

import asyncio
import ssl

from drafter.client.http11 import (
    READ_CHUNK,
    Answer,
    Http11,
    Origin,
    StaleConnection,
    TransportError,
    request_headers,
)


class Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader, self.writer, self.http = reader, writer, Http11()

    @classmethod
    async def open(cls, origin: Origin) -> Connection:
        try:
            if origin.unix_path is not None:
                return cls(*await asyncio.open_unix_connection(origin.unix_path))
            context = ssl.create_default_context() if origin.tls else None
            return cls(*await asyncio.open_connection(origin.host, origin.port, ssl=context))
        except OSError as error:
            raise TransportError(f"cannot connect: {error}") from error

    @property
    def usable(self) -> bool:
        """Idle and still open: the server has not closed it since the last answer."""
        return self.http.idle and not self.reader.at_eof() and not self.writer.is_closing()

    async def exchange(self, method: str, path: str, headers: list, body: bytes | None) -> Answer:
        try:
            self.writer.write(self.http.request(method, path, headers, body))
            await self.writer.drain()
            while (answer := self.http.feed(await self.reader.read(READ_CHUNK))) is None:
                pass
            return answer
        except OSError as error:
            raise self.http.failure(f"{type(error).__name__}: {error}") from error

    def close(self) -> None:
        self.writer.close()


class ConnectionPool:
    """Keep-alive connections to one origin; `headers` go with every request."""

    def __init__(self, url: str, headers: dict[str, str], max_connections: int):
        self.origin = Origin(url)
        self.headers = dict(headers)
        self.idle: list[Connection] = []
        self.slots = asyncio.Semaphore(max_connections)
        self.closed = False

    async def request(
        self, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None
    ) -> Answer:
        if self.closed:
            raise TransportError("the client is closed")
        header_list = request_headers(self.origin, self.headers, headers, body)
        async with self.slots:
            if (connection := self.reuse()) is not None:
                try:
                    return await self.exchange(connection, method, path, header_list, body)
                except StaleConnection:
                    pass  # closed by the server as we reused it: once more, on a new connection
            connection = await Connection.open(self.origin)
            try:
                return await self.exchange(connection, method, path, header_list, body)
            except StaleConnection as error:
                raise TransportError(str(error)) from error

    async def exchange(self, connection: Connection, method, path, headers, body) -> Answer:
        try:
            answer = await connection.exchange(method, path, headers, body)
        except BaseException:  # failed, cancelled or timed out: its state is unknown
            connection.close()
            raise
        if connection.http.idle and not self.closed:
            self.idle.append(connection)
        else:
            connection.close()  # the server asked to close, or the pool closed meanwhile
        return answer

    def reuse(self) -> Connection | None:
        while self.idle:
            connection = self.idle.pop()  # the most recent: the least likely to have timed out
            if connection.usable:
                return connection
            connection.close()
        return None

    async def aclose(self) -> None:
        self.closed = True
        for connection in self.idle:
            connection.close()
        self.idle.clear()
