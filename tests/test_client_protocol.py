"""drafter.client without a network: the session bookkeeping behind v2 calls (prefix_len from the previous
context + drafts), the 409 fallback as the request sequence `exchange` yields, the backoff arithmetic,
header parsing, and that importing the client leaves torch out of the process."""

from __future__ import annotations

import subprocess
import sys

import orjson
import pytest

from drafter.client import Backoff, DraftRequestError
from drafter.client.backoff import retry_after_seconds
from drafter.client.protocol import Response, ServerState, SessionState, exchange, parse_server_timing
from tests.server_process import REPO


def answered(state: SessionState, context: list[int], drafts: list[int], token: str = "t1") -> None:
    state.answered(context, {"tokens": drafts, "session_token": token})


def test_session_body_names_the_longest_shared_prefix():
    state = SessionState()
    context = [5, 6, 7, 8]
    assert state.body(context, incremental=True) == {"tokens": context, "session": state.name}  # no token yet
    answered(state, context, [9, 10, 11])
    # The target kept two drafts and added its own token: only that token travels.
    body = state.body([5, 6, 7, 8, 9, 10, 42], incremental=True)
    assert body == {"session": state.name, "session_token": "t1", "prefix_len": 6, "tokens": [42]}
    # A context that diverges inside the old context shares only what precedes the change.
    assert state.body([5, 6, 0, 8], incremental=True)["prefix_len"] == 2
    # A context that is a prefix of the sequence sends no new token.
    body = state.body([5, 6, 7, 8, 9], incremental=True)
    assert body["prefix_len"] == 5 and body["tokens"] == []
    # Nothing shared, or a v1 server: the whole context.
    assert state.body([1, 2], incremental=True) == {"tokens": [1, 2], "session": state.name}
    assert state.body([5, 6, 7, 8, 9], incremental=False) == {
        "tokens": [5, 6, 7, 8, 9],
        "session": state.name,
    }


def test_session_known_len_compares_only_past_the_callers_promise_once():
    state = SessionState()
    answered(state, [5, 6, 7, 8], [9, 10, 11])
    state.known_len = 4  # the caller checked the first 4 tokens itself (its own copy of the last context)
    body = state.body([5, 6, 0, 8, 9, 42], incremental=True)  # position 2 differs, but is promised equal
    assert body["prefix_len"] == 5 and body["tokens"] == [42]  # only the drafts' part was compared
    assert state.known_len == 0  # a promise covers one call
    assert state.body([5, 6, 0, 8, 9, 42], incremental=True)["prefix_len"] == 2


def test_session_names_are_unguessable_and_distinct_unless_given():
    names = {SessionState().name for _ in range(100)}
    assert len(names) == 100 and all(len(name) == 32 for name in names)
    assert SessionState("conv-42").name == "conv-42"


def reply(status: int, body: dict, **headers) -> Response:
    return Response(status, {k.replace("_", "-"): v for k, v in headers.items()}, orjson.dumps(body))


def test_exchange_falls_back_to_the_full_context_on_409_session_unknown():
    server, state = ServerState(Backoff()), SessionState("conv")
    server.protocol_versions = frozenset({1, 2})
    answered(state, [1, 2, 3], [4, 5], token="old")
    calls = exchange(server, state, [1, 2, 3, 4, 9], {"num_draft_tokens": 2})
    first = orjson.loads(next(calls).body)
    assert first == {
        "session": "conv",
        "session_token": "old",
        "prefix_len": 4,
        "tokens": [9],
        "num_draft_tokens": 2,
    }
    unknown = {"error": {"type": "session_unknown", "message": "no such session", "param": "session"}}
    second = orjson.loads(calls.send(reply(409, unknown)).body)
    assert second == {"tokens": [1, 2, 3, 4, 9], "session": "conv", "num_draft_tokens": 2}
    with pytest.raises(StopIteration) as done:
        calls.send(
            reply(
                200, {"tokens": [7, 8], "cached": 0, "session_token": "new"}, server_timing="decode;dur=1.5"
            )
        )
    assert done.value.value.tokens == [7, 8] and done.value.value.server_timing_ms == {"decode": 1.5}
    assert state.token == "new" and state.sequence == [1, 2, 3, 4, 9, 7, 8]


def test_exchange_raises_on_the_callers_bugs_and_forgets_the_session():
    server, state = ServerState(Backoff()), SessionState()
    server.protocol_versions = frozenset({1})
    answered(state, [1], [2])
    calls = exchange(server, state, [1, 2], {})
    next(calls)
    bad = {
        "error": {
            "type": "invalid_request",
            "message": "num_draft_tokens must be ...",
            "param": "num_draft_tokens",
        }
    }
    with pytest.raises(DraftRequestError) as raised:
        calls.send(reply(400, bad))
    assert (raised.value.status, raised.value.type, raised.value.param) == (
        400,
        "invalid_request",
        "num_draft_tokens",
    )
    assert state.token is None and state.sequence == [] and not server.backoff.active


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_backoff_doubles_to_its_cap_respects_retry_after_and_resets():
    clock = Clock()
    backoff = Backoff(base_s=0.1, max_s=0.5, clock=clock)
    pauses = []
    for _ in range(5):
        backoff.failed()
        pauses.append(round(backoff.until - clock.now, 6))
    assert pauses == [0.1, 0.2, 0.4, 0.5, 0.5]
    backoff.failed(retry_after_s=5)  # the server knows best when it will be back
    assert backoff.until - clock.now == 5 and backoff.active
    clock.now += 5
    assert not backoff.active
    backoff.succeeded()
    backoff.failed()
    assert backoff.until - clock.now == pytest.approx(0.1)
    with pytest.raises(ValueError):
        Backoff(base_s=0)


def test_retry_after_and_server_timing_parse():
    assert retry_after_seconds("5") == 5 and retry_after_seconds(None) is None
    assert retry_after_seconds("soon") is None
    assert retry_after_seconds("Wed, 21 Oct 2015 07:28:00 GMT") == 0  # a date in the past: retry now
    assert parse_server_timing("queue;dur=0.5, prefill;dur=2, decode;desc=x;dur=1.25, junk") == {
        "queue": 0.5,
        "prefill": 2.0,
        "decode": 1.25,
    }


def test_client_import_leaves_torch_and_httpx_out():
    code = (
        "import sys\nfrom drafter.client import DraftClient, AsyncDraftClient\n"
        "heavy = [m for m in ('torch', 'numpy', 'engine', 'transformers', 'httpx') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize(
    "content", [b"<html>gateway</html>", b'{"tokens": [1, "2"]}', b"[1, 2]", b'{"cached": 0}']
)
def test_exchange_treats_a_malformed_200_as_a_server_failure(content):
    server, state = ServerState(Backoff()), SessionState()
    server.protocol_versions = frozenset({1})
    answered(state, [1], [2])
    calls = exchange(server, state, [1, 2], {})
    next(calls)
    with pytest.raises(StopIteration) as done:
        calls.send(Response(200, {}, content))
    assert done.value.value.skipped == "server_error" and done.value.value.tokens == []
    assert server.backoff.active and state.token is None


@pytest.mark.parametrize(
    "module", ["drafter.client", "drafter.integrations.transformers_generate", "drafter.speculative"]
)
def test_what_a_target_imports_loads_no_server_code(module):
    """A target process imports the client or an integration: no Hypercorn, Starlette, engine or server
    room comes with it (an integration brings the torch its target already has, nothing more)."""
    code = (
        f"import sys\nimport {module}\n"
        "server = [m for m in sys.modules if m.split('.')[0] in ('hypercorn', 'starlette', 'engine', 'prometheus_client')\n"
        "          or m.startswith(('drafter.server', 'drafter.scheduling', 'drafter.sessions'))]\n"
        "assert not server, server\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
