"""Request bodies from clients that may be slow, silent, gone, or refused before they finished sending.

- Every body is read under a deadline (`--body-timeout-s`): a client that announces bytes it never sends is
  refused (408) instead of holding a handler, and on SIGTERM every deadline expires at once, so a drain
  never waits on a client that sends nothing.
- A client that hangs up mid-body raises `ClientGone`, which the route counts as a disconnect, not an error.
- `AnswerEarlyThenDrain` (ASGI middleware): an answer given before the body was read (401, 413 by
  Content-Length, 415, 503, 404) goes out at once; what is left of the body is read and dropped before the
  answer ends, so the connection (HTTP/1.1) or the other streams (HTTP/2) stay usable. An HTTP/1.1 body
  announced over the cap is never read: its connection is closed after the answer. An HTTP/2 stream (a
  408's too) ends only once its body has, however late, or at a server shutdown.

It knows nothing of drafts: bytes in, bytes out.
"""

from __future__ import annotations

import asyncio
import contextlib

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

BODY_TIMEOUT_STATUS = 408


class ClientGone(Exception):
    """The client disconnected before its request body was complete."""


class BodyTimeout(Exception):
    """The body did not arrive before its deadline, or the server began to drain while it was arriving."""


class BodyTooLarge(Exception):
    pass


class BodyDeadlines:
    """The deadlines of the bodies being read now, so a drain can expire them all at once."""

    def __init__(self, timeout_s: float):
        self.timeout_s = timeout_s
        self.active: set[asyncio.Timeout] = set()
        self.expired = False  # draining: new reads get no time either

    def within(self) -> BodyDeadline:
        """`async with deadlines.within():` raises BodyTimeout if the block outlasts the body deadline."""
        return BodyDeadline(self)

    def expire_all(self) -> None:
        self.expired = True
        now = asyncio.get_running_loop().time()
        for timeout in self.active:
            timeout.reschedule(now)


class BodyDeadline:
    """One body's deadline (a class, not a generator-based context manager: this is on every request)."""

    __slots__ = ("deadlines", "timeout")

    def __init__(self, deadlines: BodyDeadlines):
        self.deadlines = deadlines
        self.timeout = asyncio.timeout(0 if deadlines.expired else deadlines.timeout_s)

    async def __aenter__(self) -> None:
        await self.timeout.__aenter__()
        self.deadlines.active.add(self.timeout)

    async def __aexit__(self, kind, error, traceback) -> bool | None:
        self.deadlines.active.discard(self.timeout)
        try:
            return await self.timeout.__aexit__(kind, error, traceback)
        except TimeoutError:
            raise BodyTimeout from None


async def read_body(request: Request, max_body_bytes: int, deadlines: BodyDeadlines) -> bytes:
    """The whole body, refused as soon as the bytes read pass the cap (Content-Length may be absent or
    wrong). Raises BodyTooLarge, BodyTimeout or ClientGone. (ASGI messages read directly: Starlette's
    `stream()` would add an async generator per request.)"""
    chunks, size = [], 0
    async with deadlines.within():
        while True:
            message = await request.receive()
            if message["type"] != "http.request":  # http.disconnect
                raise ClientGone
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > max_body_bytes:
                raise BodyTooLarge
            chunks.append(chunk)
            if not message.get("more_body", False):
                return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def announced_length(scope: Scope) -> int:
    """The request's Content-Length, 0 when it has none (chunked: the drain's own limit bounds it)."""
    for name, value in scope["headers"]:
        if name == b"content-length":
            return int(value) if value.isdigit() else 0
    return 0


class AnswerEarlyThenDrain:
    """An answer the app gives before it read the whole request body (401, 413 by Content-Length, 415, 503,
    404, 408) goes out at once: its status, headers and body bytes are sent before any more of the request
    body is read. What is left of the body is then read and dropped, and only then is the answer ended,
    because Hypercorn closes an HTTP/1.1 connection, and tears down an HTTP/2 connection with every draft
    multiplexed on it, when a stream ends before its request body did:
    - HTTP/1.1: the client has the whole answer at once (its Content-Length says where it ends); the drain,
      within the body deadline, keeps the connection for the next request. A body announced over
      `max_discard_bytes` is never read: the answer says `Connection: close` and ends at once, so a refused
      client (an unauthenticated one with a huge Content-Length, say) holds a connection no longer than it
      takes to write the answer. A 408's body is not coming: its answer ends at once.
    - HTTP/2: the answer's frames go out at once and the stream ends when its body has, however long that
      takes: Hypercorn 0.18 answers a DATA frame for a stream whose answer has ended with a KeyError that
      tears the connection down, so a deadline here would turn one slow body into the loss of every stream
      on its connection. (An ASGI app cannot reset one stream, so an announced body over the cap is drained
      too, as fast as the client sends it; a stream whose client sends nothing more costs a parked task
      until the client resets it, hangs up, or the server shuts down.)
    """

    def __init__(self, app: ASGIApp, deadlines: BodyDeadlines, max_discard_bytes: int):
        self.app, self.deadlines, self.max_discard_bytes = app, deadlines, max_discard_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        body_done = drain = False
        http2 = scope.get("http_version") == "2"

        async def tracked_receive() -> Message:
            nonlocal body_done
            message = await receive()
            body_done = body_done or message["type"] != "http.request" or not message.get("more_body")
            return message

        async def send_early(message: Message) -> None:
            nonlocal body_done, drain
            if message["type"] == "http.response.start" and not body_done:
                body_done = True  # the app reads no more of it
                # A timed-out body is not coming; but an HTTP/2 stream must outlive it all the same.
                drain = http2 or message["status"] != BODY_TIMEOUT_STATUS
                if drain and not http2 and announced_length(scope) > self.max_discard_bytes:
                    drain = False  # never read: the answer ends at once and the connection closes
                    message = {**message, "headers": [*message.get("headers", []), (b"connection", b"close")]}
            elif drain and message["type"] == "http.response.body" and not message.get("more_body"):
                drain = False
                await send({**message, "more_body": True})  # the whole answer, now
                if http2:
                    await self.discard_stream(receive)
                else:
                    await self.discard(receive, limit=self.max_discard_bytes)
                message = {"type": "http.response.body", "body": b"", "more_body": False}
            await send(message)

        await self.app(scope, tracked_receive, send_early)

    async def discard(self, receive: Receive, limit: int) -> None:
        """HTTP/1.1: read and drop up to `limit` bytes, within the body deadline."""
        size = 0
        with contextlib.suppress(BodyTimeout):
            async with self.deadlines.within():
                while True:
                    message = await receive()
                    size += len(message.get("body", b""))
                    if message["type"] != "http.request" or not message.get("more_body"):
                        return
                    if size > limit:
                        return

    async def discard_stream(self, receive: Receive) -> None:
        """HTTP/2: read and drop until the body ends or the client goes. Hypercorn hands a DATA frame's
        flow-control window back once the frame is queued for the app (10 messages a stream), so reading on
        is what keeps the client's window open. The body deadline only wakes it to see whether the server
        is shutting down, the one time it gives up on a body."""
        while True:
            try:
                async with self.deadlines.within():
                    message = await receive()
            except BodyTimeout:
                if self.deadlines.expired:
                    return
                continue
            if message["type"] != "http.request" or not message.get("more_body"):
                return
