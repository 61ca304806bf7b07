"""HTTP/1.1 for the client, without I/O: where to connect (`Origin`), and one request/answer on a keep-alive
connection (`Http11`) through h11, the sans-IO parser Hypercorn and httpx use too. The sync and async
pools (sync_http.py, aio_http.py) only move bytes.

Why not httpx, which the client used first: its per-request Python cost was ~0.3 ms (sync) and ~0.7 ms
(async) on a 2-core CPU, against a draft round trip of a few milliseconds on a GPU (bench/README.md). This
speaks just what a target needs of a drafter: `http://HOST:PORT`, `https://...` and `unix:/PATH` origins,
one request per connection at a time, no proxies, redirects or cookies.
"""

from __future__ import annotations

from urllib.parse import urlsplit

import h11

MAX_RESPONSE_BYTES = 16 * 2**20  # far above any answer of ours; a server sending more is broken
READ_CHUNK = 2**16

Answer = tuple[int, dict[str, str], bytes]  # status, headers (lower-case names), body


class TransportError(Exception):
    """No complete answer: refused, reset or closed connection, or an HTTP protocol error."""


class StaleConnection(TransportError):
    """The connection ended before a byte of the answer. On a reused keep-alive connection that means the
    server had closed it (its idle timeout): the pools send the request once more, on a new connection (a
    draft is safe to ask twice)."""


class Origin:
    """Where to connect, from `http://host[:port]`, `https://host[:port]` or `unix:/path`."""

    def __init__(self, url: str):
        self.unix_path: str | None = None
        if url.startswith("unix:"):
            self.unix_path, self.host, self.port, self.tls = url.removeprefix("unix:"), "localhost", 0, False
            self.host_header = "localhost"
            return
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(
                f"url must be http://HOST[:PORT], https://HOST[:PORT] or unix:/PATH, got {url!r}"
            )
        if parts.path not in ("", "/"):
            raise ValueError(f"url must not have a path (the client adds /draft and the rest), got {url!r}")
        self.tls = parts.scheme == "https"
        self.host, self.port = parts.hostname, parts.port or (443 if self.tls else 80)
        self.host_header = parts.netloc


class Http11:
    """One connection's HTTP/1.1 state: the bytes of a request, then the answer fed in as it arrives."""

    def __init__(self):
        self.h11 = h11.Connection(our_role=h11.CLIENT)
        self.answering = False  # a byte of the current answer has arrived
        self.status, self.headers, self.chunks, self.size = 0, {}, [], 0

    @property
    def idle(self) -> bool:
        return self.h11.our_state is h11.IDLE

    def request(self, method: str, target: str, headers: list[tuple[str, str]], body: bytes | None) -> bytes:
        self.answering, self.status, self.headers, self.chunks, self.size = False, 0, {}, [], 0
        data = self.h11.send(h11.Request(method=method, target=target, headers=headers))
        if body:
            data += self.h11.send(h11.Data(data=body))
        return data + self.h11.send(h11.EndOfMessage())

    def feed(self, chunk: bytes) -> Answer | None:
        """Bytes read (b"" at the end of the connection); the whole answer once it is complete."""
        self.answering = self.answering or bool(chunk)
        try:
            self.h11.receive_data(chunk)
            while (event := self.h11.next_event()) is not h11.NEED_DATA:
                if isinstance(event, h11.Response):
                    self.status = event.status_code
                    self.headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in event.headers}
                elif isinstance(event, h11.Data):
                    self.size += len(event.data)
                    if self.size > MAX_RESPONSE_BYTES:
                        raise TransportError(f"answer larger than {MAX_RESPONSE_BYTES} bytes")
                    self.chunks.append(event.data)
                elif isinstance(event, h11.EndOfMessage):
                    if self.h11.our_state is h11.DONE and self.h11.their_state is h11.DONE:
                        self.h11.start_next_cycle()  # keep-alive: the connection serves the next request
                    return self.status, self.headers, b"".join(self.chunks)
                elif isinstance(event, h11.ConnectionClosed):
                    raise self.failure("the server closed the connection before answering")
        except h11.ProtocolError as error:
            raise self.failure(f"HTTP protocol error: {error}") from error
        return None

    def failure(self, message: str) -> TransportError:
        """The error for a connection that ended: stale if not a byte of the answer came."""
        return TransportError(message) if self.answering else StaleConnection(message)


def request_headers(origin: Origin, defaults: dict, extra: dict | None, body: bytes | None) -> list:
    headers = [("Host", origin.host_header), *defaults.items(), *(extra or {}).items()]
    if body is not None:
        headers.append(("Content-Length", str(len(body))))
    return headers
