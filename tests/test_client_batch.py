"""`AsyncDraftClient.draft_many` against the real server: several conversations drafted in one
`POST /draft/batch` per step, each row's drafts equal to the engine's, v2 after a row's first call; a row
whose session the server lost resends its context in a second round; a row refused as the caller's bug is
its own DraftRequestError; a stopped server fails every row softly."""

from __future__ import annotations

import asyncio
import json

import pytest

from drafter.client import AsyncDraftClient, DraftRequestError
from drafter.client.protocol import close_request
from tests.server_process import MAIN_ARGS, ServerProcess, main_oracle, shared_server

TIMEOUT_S = 30


@pytest.fixture(scope="module")
def url(request):
    return shared_server(request.config, MAIN_ARGS).url


def recorded(client: AsyncDraftClient) -> list:
    sent, send = [], client.send

    async def recording(request):
        sent.append(request)
        return await send(request)

    client.send = recording
    return sent


def test_draft_many_one_request_per_step_equal_to_the_engine(url):
    oracle = main_oracle()

    async def run():
        async with AsyncDraftClient(url, timeout_s=TIMEOUT_S) as client:
            sent = recorded(client)
            sessions = [client.session() for _ in range(5)]
            contexts = [[(5 * row + 3 * i) % 1000 + 1 for i in range(4 + 7 * row)] for row in range(5)]
            for step in range(3):
                before = len(sent)
                answers = await client.draft_many(
                    [(s, c, 4) for s, c in zip(sessions, contexts, strict=True)]
                )
                assert [a.tokens for a in answers] == [oracle.draft(c, 4) for c in contexts]
                posts = [r for r in sent[before:] if r.method == "POST"]
                assert [r.path for r in posts] == ["/draft/batch"]
                rows = json.loads(posts[0].body)["requests"]
                assert all(("prefix_len" in row) == (step > 0) for row in rows)
                if step:
                    assert [a.accepted for a in answers] == [1] * 5
                contexts = [c + a.tokens[:1] + [7] for c, a in zip(contexts, answers, strict=True)]

    asyncio.run(run())


def test_draft_many_a_lost_session_resends_and_a_bad_row_is_its_own_error(url):
    oracle = main_oracle()

    async def run():
        async with AsyncDraftClient(url, timeout_s=TIMEOUT_S) as client:
            sessions = [client.session() for _ in range(3)]
            contexts = [[1, 2, 3], [4, 5, 6, 7], [8, 9]]
            await client.draft_many([(s, c, 3) for s, c in zip(sessions, contexts, strict=True)])
            # the server forgets one session behind the client's back (the client still holds its token)
            await client.send(close_request(sessions[1].state))
            grown = [c + [11] for c in contexts]
            bad = [12, 10**6]
            answers = await client.draft_many(
                [(s, c, 3) for s, c in zip(sessions, grown, strict=True)] + [(client.session(), bad, 3)]
            )
            assert [a.tokens for a in answers[:3]] == [oracle.draft(c, 3) for c in grown]
            assert answers[1].accepted is None  # rebuilt from its full context: no feedback to give
            assert isinstance(answers[3], DraftRequestError) and answers[3].status == 400

    asyncio.run(run())


def test_draft_many_with_the_server_stopped_fails_every_row_softly():
    async def run(url):
        async with AsyncDraftClient(url, timeout_s=2) as client:
            sessions = [client.session() for _ in range(3)]
            answers = await client.draft_many([(s, [1, 2, 3], 2) for s in sessions])
            assert all(a.skipped is None and len(a.tokens) == 2 for a in answers)
            server.stop()
            answers = await client.draft_many([(s, [1, 2, 3, 4], 2) for s in sessions])
            assert [a.skipped for a in answers] == ["unreachable"] * 3
            assert all(s.state.token is None for s in sessions)  # forgotten: the next call rebuilds them

    server = ServerProcess(MAIN_ARGS)
    try:
        asyncio.run(run(server.wait_ready()))
    finally:
        server.close()
