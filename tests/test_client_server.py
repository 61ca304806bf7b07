"""drafter.client against a real server: drafts equal the in-process engine's through `DraftClient`,
`DraftSession` and `AsyncDraftClient`; the results are typed (cached, Server-Timing, probs); a caller's bug
raises. The v2 tests (incremental calls, `accepted`, the 409 fallback, closing) run for real once the
server advertises protocol v2 in /info, and skip saying so until then."""

from __future__ import annotations

import asyncio
import random

import httpx
import orjson
import pytest

from drafter.client import AsyncDraftClient, DraftClient, DraftRequestError
from tests.server_process import MAIN_ARGS, MAIN_SIZES, main_oracle, shared_server

VOCAB = 1024  # the tiny preset's
TIMEOUT_S = 30  # generous: these tests check what is drafted, not how fast (the machine may be shared)


@pytest.fixture(scope="module")
def url(request):
    return shared_server(request.config, MAIN_ARGS).url


@pytest.fixture(scope="module")
def oracle():
    return main_oracle()


@pytest.fixture
def client(url):
    with DraftClient(url, timeout_s=TIMEOUT_S) as client:
        yield client


@pytest.fixture(scope="module")
def speaks_v2(url) -> bool:
    return 2 in httpx.get(f"{url}/info").json().get("protocol_versions", [1])


@pytest.fixture
def v2(speaks_v2):
    if not speaks_v2:
        pytest.skip("the server does not advertise protocol v2 in /info yet (sessions, issue 14)")


def sent_bodies(client: DraftClient) -> list[dict]:
    """Every /draft body the client sends from now on, read off the wire as the server receives it."""
    bodies = []

    def record(method: str, path: str, body: bytes | None) -> None:
        if path == "/draft":
            bodies.append(orjson.loads(body))

    client.http.on_request.append(record)
    return bodies


def random_context(seed: int, length: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(VOCAB) for _ in range(length)]


def test_client_draft_equals_engine_draft_with_typed_results(client, oracle):
    context = random_context(1, 40)
    drafts = client.draft(context, 7, return_probs=True)
    expected = oracle.draft(context, 7)
    assert drafts.tokens == expected and drafts.skipped is None
    assert len(drafts.probs) == 7 and all(0 < p <= 1 for p in drafts.probs)
    assert isinstance(drafts.cached, int) and 0 <= drafts.cached < len(context)
    assert set(drafts.server_timing_ms) >= {"queue", "prefill", "decode"}
    assert all(ms >= 0 for ms in drafts.server_timing_ms.values())


def test_session_follows_a_conversation_and_reuses_the_cache(client, oracle, speaks_v2):
    bodies = sent_bodies(client)
    context = random_context(2, 60)
    with client.session() as session:
        for step in range(4):
            drafts = session.draft(context, 6)
            assert drafts.tokens == oracle.draft(context, 6)
            if step:  # the server kept this conversation's prefix
                assert drafts.cached >= len(context) - 6
            context = (
                context + drafts.tokens[:3] + [(drafts.tokens[3] + 1) % VOCAB]
            )  # 3 accepted, 1 corrected
    names = {body["session"] for body in bodies}
    assert len(names) == 1 and len(names.pop()) == 32  # one uuid4 hex name for the whole conversation
    if not speaks_v2:
        assert all("prefix_len" not in body for body in bodies)  # v1: the whole context every call


def test_sessions_of_one_client_get_distinct_names(client):
    assert len({client.session().name for _ in range(10)}) == 10


@pytest.mark.parametrize(
    ("tokens", "options", "param"),
    [
        ([1, 2], {"num_draft_tokens": 0}, "num_draft_tokens"),
        ([1, VOCAB], {"num_draft_tokens": 4}, "tokens"),
        ([1, 2], {"num_draft_tokens": 4, "min_confidence": 1.5}, "min_confidence"),
    ],
)
def test_client_raises_on_requests_the_server_refuses_as_invalid(client, tokens, options, param):
    for draft in (client.draft, client.session().draft):
        with pytest.raises(DraftRequestError) as raised:
            draft(tokens, **options)
        assert raised.value.status == 400 and raised.value.type == "invalid_request"
        assert raised.value.param == param
    assert client.draft([1, 2, 3], 2).skipped is None  # not a server failure: no backoff


def test_async_client_concurrent_sessions_equal_engine_drafts(url, oracle):
    contexts = [random_context(10 + i, 20 + 7 * i) for i in range(8)]

    async def conversation(client: AsyncDraftClient, context: list[int]) -> list[list[int]]:
        session = client.session()
        drafts = []
        for _ in range(3):
            answer = await session.draft(context, 5)
            drafts.append(answer.tokens)
            context = context + answer.tokens[:2] + [7]
        await session.close()
        return drafts

    async def run():
        async with AsyncDraftClient(url, timeout_s=TIMEOUT_S) as client:
            return await asyncio.gather(*(conversation(client, c) for c in contexts))

    for context, drafts in zip(contexts, asyncio.run(run()), strict=True):
        for answer in drafts:
            assert answer == oracle.draft(context, 5)
            context = context + answer[:2] + [7]


def test_v2_calls_send_only_new_tokens_and_learn_what_was_accepted(client, oracle, v2):
    bodies = sent_bodies(client)
    context = random_context(3, 50)
    session = client.session()
    first = session.draft(context, 8)
    assert first.accepted is None and first.num_draft_tokens == 8
    context = context + first.tokens[:5] + [(first.tokens[5] + 1) % VOCAB]
    second = session.draft(context, 8)
    assert second.tokens == oracle.draft(context, 8) and second.accepted == 5
    assert bodies[1]["prefix_len"] == 55 and bodies[1]["tokens"] == context[55:]
    assert bodies[1]["session_token"] == session.state.token and "session_token" not in bodies[0]
    session.close()


def test_v2_unknown_session_falls_back_to_the_full_context(client, oracle, v2):
    bodies = sent_bodies(client)
    context = random_context(4, 30)
    session = client.session()
    first = session.draft(context, 4)
    session.state.token = "not-the-servers-token"  # as after a restart: the server answers 409
    context = context + first.tokens
    drafts = session.draft(context, 4)
    assert drafts.tokens == oracle.draft(context, 4) and drafts.skipped is None
    assert [("prefix_len" in b) for b in bodies] == [False, True, False]
    assert bodies[2]["tokens"] == context and bodies[2]["session"] == session.name
    assert session.state.token not in (None, "not-the-servers-token")


def test_v2_close_frees_the_session(client, url, v2):
    session = client.session()
    session.draft(random_context(5, 10), 2)
    token = session.state.token
    session.close()
    again = httpx.delete(f"{url}/sessions/{session.name}", headers={"Drafter-Session-Token": token})
    assert again.status_code == 404 and again.json()["error"]["type"] == "session_unknown"


def test_session_fits_k_to_the_servers_limits_and_skips_past_its_context(client, oracle):
    bodies = sent_bodies(client)
    max_context = MAIN_SIZES["max_seq_len"]
    session = client.session()
    near_the_end = random_context(6, max_context - 3)
    drafts = session.draft(near_the_end, 8)  # room for 3: k is clipped instead of refused
    assert drafts.tokens == oracle.draft(near_the_end, 3) and bodies[-1]["num_draft_tokens"] == 3
    full = near_the_end + drafts.tokens
    assert session.draft(full, 8).skipped == "context_too_long" and len(bodies) == 1  # nothing sent
    assert not client.server.backoff.active
    short = random_context(7, 10)
    assert len(client.session().draft(short, 40).tokens) == MAIN_SIZES["max_draft_tokens"]
