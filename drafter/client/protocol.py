"""The wire conversation of one draft call, with no I/O: which requests to send (v1 full context or v2
incremental), how to read each answer, and the failure policy. The sync and async clients run the same
`exchange` generator and differ only in how they send a request; that keeps one implementation of the rules.

A session's *sequence* is what the server holds for it: the context of its last call followed by the drafts
it returned. A v2 call names the longest prefix of that sequence the new context shares (`prefix_len`) and
sends only the rest. Any failed call forgets the session, so the next call rebuilds it with the full
context: after a timeout the client cannot know whether the server advanced the session.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Generator
from dataclasses import dataclass, field

import orjson

from drafter.client.backoff import Backoff, retry_after_seconds
from drafter.client.results import DraftRequestError, Drafts

# Statuses that mean "no drafts now" rather than "your request is wrong"; 5xx errors of a broken server or a
# proxy are not the caller's bug either, so they also turn speculation off instead of raising.
SKIP_STATUSES = {429: "overloaded", 503: "not_ready", 504: "timeout"}
JSON_HEADERS = {"Content-Type": "application/json"}


@dataclass(frozen=True, slots=True)
class Request:
    method: str
    path: str
    body: bytes | None = None
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    headers: dict[str, str]  # lower-case names
    content: bytes


class ServerState:
    """What one client knows of its server: the protocol versions (asked once, asked again after the
    connection was lost, since a restarted server may be a newer one) and the backoff."""

    def __init__(self, backoff: Backoff):
        self.backoff = backoff
        self.protocol_versions: frozenset[int] | None = None
        self.max_context: int | None = None  # context + drafts the server accepts (/info)
        self.max_draft_tokens: int | None = None
        self.max_batch_rows: int | None = None  # rows of one POST /draft/batch; None: no such route

    def learn(self, info: dict) -> None:
        versions = info.get("protocol_versions") or [1]
        self.protocol_versions = frozenset(v for v in versions if isinstance(v, int))
        self.max_context, self.max_draft_tokens = info.get("max_context"), info.get("max_draft_tokens")
        server = info.get("server")
        rows = server.get("max_batch_rows") if isinstance(server, dict) else None
        self.max_batch_rows = rows if isinstance(rows, int) and rows > 0 else None

    def fit(self, context_len: int, options: dict) -> dict | None:
        """The options with k clipped to what the server accepts, None if the context leaves no room: a
        conversation that outgrows the drafter goes on without drafts instead of failing with a 400."""
        k = options.get("num_draft_tokens")
        if not isinstance(k, int) or self.max_context is None or self.max_draft_tokens is None:
            return options
        room = min(self.max_draft_tokens, self.max_context - context_len)
        if room < 1:
            return None
        return {**options, "num_draft_tokens": room} if k > room else options

    @property
    def incremental(self) -> bool:
        return self.protocol_versions is not None and 2 in self.protocol_versions

    def connection_lost(self) -> None:
        self.protocol_versions = None


class SessionState:
    def __init__(self, name: str | None = None):
        # Unguessable by default: on a v1 server the name alone places a conversation in the cache.
        self.name = name if name is not None else uuid.uuid4().hex
        self.token: str | None = None
        self.sequence: list[int] = []
        # A caller's promise for the next call: its context's first `known_len` tokens are this session's
        # last context, so only the rest is compared (O(new tokens) for a caller that tracks its own rows).
        self.known_len = 0

    def body(self, context: list[int], incremental: bool) -> dict:
        prefix_len = self.shared_prefix_len(context) if incremental and self.token is not None else 0
        if prefix_len == 0:
            return {"tokens": context, "session": self.name}
        return {
            "session": self.name,
            "session_token": self.token,
            "prefix_len": prefix_len,
            "tokens": context[prefix_len:],
        }

    def shared_prefix_len(self, context: list[int]) -> int:
        sequence = self.sequence
        n = min(len(sequence), len(context))
        start, self.known_len = min(self.known_len, n), 0
        if context[start:n] == sequence[start:n]:  # the usual case, compared at C speed
            return n
        return next(i for i in range(start, n) if context[i] != sequence[i])

    def answered(self, context: list[int], answer: dict) -> None:
        self.sequence = context + answer["tokens"]
        self.token = answer.get("session_token", self.token)

    def forget(self) -> None:
        self.token, self.sequence = None, []


def exchange(
    server: ServerState, session: SessionState | None, context: list[int], options: dict
) -> Generator[Request, Response, Drafts]:
    """Yields the requests of one draft call and returns its `Drafts`; raises DraftRequestError on a
    caller's bug. Transport failures are the driver's (see `transport_failed`)."""
    if server.backoff.active:
        return Drafts.none("backing_off")
    if session is not None:
        if server.protocol_versions is None:
            info = yield Request("GET", "/info")
            fields = json_object(info) if info.status == 200 else None
            if fields is None:
                return refused(server, info)  # 401 wrong key or 404 not a drafter raise; 5xx and junk skip
            server.learn(fields)
        options = server.fit(len(context), options)
        if options is None:
            return Drafts.none("context_too_long")
    body = session.body(context, server.incremental) if session else {"tokens": context}
    response = yield draft_request(body, options)
    if response.status == 409 and "prefix_len" in body and error_of(response)[0] == "session_unknown":
        session.forget()  # the server lost it (restart, eviction) or it expired: rebuild from the full context
        body = session.body(context, incremental=False)
        response = yield draft_request(body, options)
    answer = read_answer(response) if response.status == 200 else None
    if answer is None:
        if session is not None:
            session.forget()
        return refused(server, response)
    server.backoff.succeeded()
    if session is not None:
        session.answered(context, answer)
    return Drafts(
        tokens=answer["tokens"],
        probs=answer.get("probs"),
        cached=answer.get("cached"),
        accepted=answer.get("accepted"),
        num_draft_tokens=answer.get("num_draft_tokens"),
        source=answer.get("source"),
        suffix_tokens=answer.get("suffix_tokens", 0),
        server_timing_ms=parse_server_timing(response.headers.get("server-timing")),
    )


def transport_failed(server: ServerState, session: SessionState | None, timed_out: bool) -> Drafts:
    """No answer came (refused connection, reset, timeout): no drafts, back off, forget the session."""
    server.backoff.failed()
    if session is not None:
        session.forget()
    if timed_out:
        return Drafts.none("timeout")
    server.connection_lost()
    return Drafts.none("unreachable")


def draft_request(body: dict, options: dict) -> Request:
    return Request("POST", "/draft", orjson.dumps({**body, **options}), JSON_HEADERS)


def close_request(session: SessionState) -> Request | None:
    if session.token is None:
        return None
    return Request("DELETE", f"/sessions/{session.name}", headers={"Drafter-Session-Token": session.token})


def json_object(response: Response) -> dict | None:
    try:
        fields = orjson.loads(response.content)
    except orjson.JSONDecodeError:
        return None
    return fields if isinstance(fields, dict) else None


def read_answer(response: Response) -> dict | None:
    """The JSON answer, or None unless it has the protocol's shape (a proxy's page, a truncated body)."""
    answer = json_object(response)
    tokens = answer.get("tokens") if answer is not None else None
    if not isinstance(tokens, list) or not all(type(t) is int for t in tokens):
        return None
    return answer


def refused(server: ServerState, response: Response) -> Drafts:
    """A non-answer: no drafts and a backoff when the server (or what stands in front of it) failed; an
    exception when the request was wrong. A 200 without the protocol's shape counts as a server failure."""
    status = 502 if response.status == 200 else response.status
    if status in SKIP_STATUSES or status >= 500:
        server.backoff.failed(retry_after_seconds(response.headers.get("retry-after")))
        return Drafts.none(SKIP_STATUSES.get(status, "server_error"))
    raise DraftRequestError(status, *error_of(response))


def error_of(response: Response) -> tuple[str, str, str | None]:
    """(type, message, param) of the protocol's error shape, or a description of what came instead."""
    try:
        error = orjson.loads(response.content)["error"]
        return str(error["type"]), str(error["message"]), error.get("param")
    except (orjson.JSONDecodeError, KeyError, TypeError):  # not our server (a proxy, a wrong URL)
        return "http_error", response.content[:200].decode(errors="replace"), None


def parse_server_timing(header: str | None) -> dict[str, float]:
    """`queue;dur=0.1, prefill;dur=2.5` -> {"queue": 0.1, "prefill": 2.5}; entries without dur are skipped."""
    timing = {}
    for entry in (header or "").split(","):
        name, *params = (part.strip() for part in entry.split(";"))
        for param in params:
            key, _, value = param.partition("=")
            if key == "dur" and name:
                with contextlib.suppress(ValueError):
                    timing[name] = float(value)
    return timing
