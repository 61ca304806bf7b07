"""Request bodies from clients that may be slow, silent, gone, or refused before they finished sending.

- Every body is read under a deadline (`--body-timeout-s`): a client that announces bytes it never sends is
  refused (408) instead of holding a handler, and on SIGTERM every deadline expires at once, so a drain
  never waits on a client that sends nothing.
- A client that hangs up mid-body raises `ClientGone`, which the route counts as a disconnect, not an error.
- `FinishBodyBeforeAnswer` (ASGI middleware) reads and drops what is left of a body before any answer that
  did not read it (401, 413 by Content-Length, 415, 503, 404). Over HTTP/2, Hypercorn tears down the whole
  connection, and every draft multiplexed on it, when data arrives for a stream it has already answered;
  over HTTP/1.1 the connection stays usable for the next request instead of being closed.

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


class FinishBodyBeforeAnswer:
    """Before an answer starts, read and drop the rest of a request body the app did not read (bounded by
    the body deadline; over HTTP/1.1 also by `max_discard_bytes`, past which Hypercorn closes the
    connection after the answer, which only costs that client its connection)."""

    def __init__(self, app: ASGIApp, deadlines: BodyDeadlines, max_discard_bytes: int):
        self.app, self.deadlines, self.max_discard_bytes = app, deadlines, max_discard_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        body_done = False

        async def tracked_receive() -> Message:
            nonlocal body_done
            message = await receive()
            body_done = body_done or message["type"] != "http.request" or not message.get("more_body")
            return message

        async def send_after_body(message: Message) -> None:
            nonlocal body_done
            if message["type"] == "http.response.start" and not body_done:
                body_done = True
                if message["status"] != BODY_TIMEOUT_STATUS:  # that body is not coming
                    await self.discard(scope, receive)
            await send(message)

        await self.app(scope, tracked_receive, send_after_body)

    async def discard(self, scope: Scope, receive: Receive) -> None:
        limit = None if scope.get("http_version") == "2" else self.max_discard_bytes
        size = 0
        with contextlib.suppress(BodyTimeout):
            async with self.deadlines.within():
                while True:
                    message = await receive()
                    size += len(message.get("body", b""))
                    if message["type"] != "http.request" or not message.get("more_body"):
                        return
                    if limit is not None and size > limit:
                        return
