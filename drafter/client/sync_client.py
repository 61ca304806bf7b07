"""`DraftClient`: the blocking client a target process imports (no torch, no engine), one keep-alive
connection pool, and `DraftSession`, one conversation's incremental state. The rules live in
drafter/client/protocol.py; this module only sends the requests it yields, each within the call's deadline,
through drafter/client/sync_http.py (lean keep-alive HTTP/1.1; `url` may also be `unix:/PATH`, a server's
--uds socket).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Generator

import orjson

from drafter.client.backoff import Backoff
from drafter.client.http11 import TransportError
from drafter.client.protocol import (
    Request,
    Response,
    ServerState,
    SessionState,
    close_request,
    exchange,
    transport_failed,
)
from drafter.client.results import Drafts
from drafter.client.sync_http import CallTimeout, ConnectionPool

DEFAULT_TIMEOUT_S = 0.5  # a draft that comes later than this rarely beats the target decoding alone


def draft_options(
    num_draft_tokens, return_probs: bool, min_confidence: float | None, source: str | None = None
) -> dict:
    """A call's fields beside its tokens; `source`: "model", "suffix" or "hybrid" (None: the server's default)."""
    options: dict = {}
    if source is not None:
        options["source"] = source
    if num_draft_tokens is not None:
        options["num_draft_tokens"] = num_draft_tokens
    if return_probs:
        options["return_probs"] = True
    if min_confidence is not None:
        options["min_confidence"] = min_confidence
    return options


def base_headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


class DraftClient:
    """Drafts from a drafter server; never makes the caller wait past `timeout_s` per call.

    On 429/503/504 (and other 5xx), a connection error or a timeout a call returns `Drafts` with no tokens
    and `skipped` set, and the client backs off (exponentially, at least the server's Retry-After), answering
    at once without a request until then. Other 4xx raise `DraftRequestError`: they are the caller's bug.
    """

    def __init__(
        self,
        url: str,
        api_key: str | None = None,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        backoff: Backoff | None = None,
        max_connections: int = 4,
    ):
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        self.url, self.timeout_s = url.rstrip("/"), timeout_s
        self.http = ConnectionPool(self.url, base_headers(api_key), max_connections)
        self.server = ServerState(backoff or Backoff())

    def draft(
        self,
        tokens: list[int],
        num_draft_tokens: int | str | None = None,
        *,
        return_probs: bool = False,
        min_confidence: float | None = None,
        source: str | None = None,
        timeout_s: float | None = None,
    ) -> Drafts:
        """One stateless v1 call with the whole context (no session)."""
        options = draft_options(num_draft_tokens, return_probs, min_confidence, source)
        return self.run(exchange(self.server, None, list(tokens), options), None, timeout_s)

    def session(self, name: str | None = None) -> DraftSession:
        """A conversation: incremental (v2) calls when the server speaks v2. Name it only to share it on
        purpose; the default is a fresh uuid4."""
        return DraftSession(self, SessionState(name))

    def get(self, path: str, timeout_s: float | None = None) -> Response:
        """GET `path` (a health probe, /info, /metrics); raises `TransportError` if no answer comes."""
        deadline = time.monotonic() + (timeout_s or max(self.timeout_s, 5.0))
        return Response(*self.http.request("GET", path, deadline=deadline))

    def info(self) -> dict:
        """GET /info, raising `TransportError` on any failure (for tools that need the server's limits)."""
        response = self.get("/info")
        if response.status != 200:
            raise TransportError(f"GET /info answered {response.status}")
        return orjson.loads(response.content)

    def run(self, calls: Generator[Request, Response, Drafts], session, timeout_s: float | None) -> Drafts:
        deadline = time.monotonic() + (timeout_s or self.timeout_s)
        try:
            request = next(calls)
            while True:
                request = calls.send(self.send(request, deadline))
        except StopIteration as done:
            return done.value
        except CallTimeout:
            return transport_failed(self.server, session, timed_out=True)
        except TransportError:
            return transport_failed(self.server, session, timed_out=False)

    def send(self, request: Request, deadline: float) -> Response:
        return Response(
            *self.http.request(request.method, request.path, request.body, request.headers, deadline=deadline)
        )

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> DraftClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class DraftSession:
    """One conversation. `draft(context)` takes the whole current context every time; the session works out
    what the server already holds and sends only the rest when it can."""

    def __init__(self, client: DraftClient, state: SessionState):
        self.client, self.state = client, state

    @property
    def name(self) -> str:
        return self.state.name

    def draft(
        self,
        context: list[int],
        num_draft_tokens: int | str | None = None,
        *,
        return_probs: bool = False,
        min_confidence: float | None = None,
        source: str | None = None,
        timeout_s: float | None = None,
    ) -> Drafts:
        options = draft_options(num_draft_tokens, return_probs, min_confidence, source)
        calls = exchange(self.client.server, self.state, list(context), options)
        return self.client.run(calls, self.state, timeout_s)

    def close(self) -> None:
        """Frees the session on the server (best effort: an unreachable server forgets it anyway)."""
        request = close_request(self.state)
        self.state.forget()
        if request is None:
            return
        with contextlib.suppress(TransportError):
            self.client.send(request, time.monotonic() + self.client.timeout_s)

    def __enter__(self) -> DraftSession:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
