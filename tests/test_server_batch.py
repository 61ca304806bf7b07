"""`POST /draft/batch` over HTTP: each row is answered as /draft would answer it (drafts equal the engine's,
sessions and v2 alike), the rows share one engine batch, a bad row is its own error and never the others',
refusals of the whole request are /draft's, and each row counts in /metrics as one draft request."""

from __future__ import annotations

import httpx
import pytest

from tests.server_process import MAIN_ARGS, MAIN_SIZES, main_oracle, metric_value, shared_server
from tests.test_server_backpressure import API_KEY, STRICT_ARGS

VOCAB = 1024  # the tiny preset's


@pytest.fixture(scope="module")
def client(request):
    with httpx.Client(base_url=shared_server(request.config, MAIN_ARGS).url, timeout=60) as client:
        yield client


def contexts(n: int) -> list[list[int]]:
    return [[(13 * row + 7 * i) % VOCAB for i in range(3 + 11 * row)] for row in range(n)]


def batch(client, rows: list, **kwargs) -> httpx.Response:
    return client.post("/draft/batch", json={"requests": rows}, **kwargs)


def test_batch_rows_equal_the_engine_and_share_one_engine_batch(client):
    oracle = main_oracle()
    before = client.get("/metrics").text
    rows = contexts(MAIN_SIZES["max_batch_size"])
    response = batch(client, [{"tokens": c, "num_draft_tokens": 5} for c in rows])
    assert response.status_code == 200 and "engine;dur=" in response.headers["server-timing"]
    results = response.json()["results"]
    assert [r["tokens"] for r in results] == [oracle.draft(c, 5) for c in rows]
    assert all(r["status"] == 200 and r["num_draft_tokens"] == 5 for r in results)
    after = client.get("/metrics").text
    assert (
        metric_value(after, "drafter_batch_size_count")
        == metric_value(before, "drafter_batch_size_count") + 1
    )
    ok = 'drafter_request_seconds_count{status="200"}'
    assert metric_value(after, ok) == metric_value(before, ok) + len(rows)
    # "auto" learns what a batch of this size cost our engine (drafter.sessions.draft_length)
    assert str(len(rows)) in client.get("/info").json()["draft_length_policy"]["by_batch_size"]


def test_batch_sessions_go_on_incrementally_row_by_row(client):
    oracle = main_oracle()
    rows = contexts(3)
    first = batch(
        client, [{"tokens": c, "session": f"batch-{i}", "num_draft_tokens": 4} for i, c in enumerate(rows)]
    )
    answers = first.json()["results"]
    grown = [
        c + a["tokens"][:2] + [9] for c, a in zip(rows, answers, strict=True)
    ]  # 2 kept, then the target's
    second = batch(
        client,
        [
            {"session": f"batch-{i}", "session_token": a["session_token"], "prefix_len": len(c) + 2,
             "tokens": [9], "num_draft_tokens": 4}
            for i, (c, a) in enumerate(zip(rows, answers, strict=True))
        ],
    )  # fmt: skip
    results = second.json()["results"]
    assert [r["tokens"] for r in results] == [oracle.draft(c, 4) for c in grown]
    assert [r["accepted"] for r in results] == [2, 2, 2]


def test_batch_a_bad_row_is_its_own_error(client):
    oracle = main_oracle()
    good = contexts(2)
    secret = 987654321
    rows = [
        {"tokens": good[0], "num_draft_tokens": 3},
        {"tokens": [1, secret]},
        "not an object",
        {"tokens": [1], "color": "red"},
        {"session": "never-made", "session_token": "x" * 22, "prefix_len": 1, "tokens": [2]},
        {"tokens": good[1], "num_draft_tokens": 3},
    ]
    response = batch(client, rows)
    assert response.status_code == 200 and str(secret) not in response.text
    results = response.json()["results"]
    assert [r["status"] for r in results] == [200, 400, 400, 400, 409, 200]
    assert [r["error"]["type"] for r in results[1:5]] == ["invalid_request"] * 3 + ["session_unknown"]
    assert results[1]["error"]["param"] == "tokens"
    assert [results[0]["tokens"], results[5]["tokens"]] == [oracle.draft(c, 3) for c in good]


def test_a_session_token_of_any_characters_is_a_wrong_token_for_every_route(client):
    oracle, good = main_oracle(), contexts(2)
    first = client.post(
        "/draft", json={"tokens": good[0], "num_draft_tokens": 3, "session": "any-characters"}
    )
    assert first.status_code == 200
    wrong = {"session": "any-characters", "session_token": "é", "prefix_len": 5, "tokens": [6]}
    response = client.post("/draft", json=wrong)
    assert response.status_code == 409 and response.json()["error"]["type"] == "session_unknown"
    rows = [{"tokens": good[1], "num_draft_tokens": 3}, wrong, {**wrong, "session_token": "\u2603" * 22}]
    results = batch(client, rows).json()["results"]
    assert [r["status"] for r in results] == [200, 409, 409]
    assert results[0]["tokens"] == oracle.draft(good[1], 3)
    for raw in (b"\xe9", b"\xff", b"\xc3\xa9" * 11):
        closed = client.delete("/sessions/any-characters", headers={"Drafter-Session-Token": raw})
        assert closed.status_code == 404 and closed.json()["error"]["type"] == "session_unknown"
    token = first.json()["session_token"]
    assert (
        client.delete("/sessions/any-characters", headers={"Drafter-Session-Token": token}).status_code == 204
    )


@pytest.mark.parametrize(
    "content, content_type, status",
    [
        (b'{"requests": [{"tokens": [1]}]', "application/json", 400),  # malformed JSON
        (b'{"requests": []}', "application/json", 400),
        (b'{"requests": {"tokens": [1]}}', "application/json", 400),
        (b'{"requests": [{"tokens": [1]}], "k": 1}', "application/json", 400),
        (b'{"requests": [{"tokens": [1]}]}', "text/plain", 415),
    ],
)
def test_batch_refusals_of_the_whole_request_are_drafts(client, content, content_type, status):
    response = client.post("/draft/batch", content=content, headers={"Content-Type": content_type})
    assert response.status_code == status and set(response.json()["error"]) == {"type", "message", "param"}


def test_batch_rows_are_capped_at_the_queue_and_info_says_so(client):
    max_rows = client.get("/info").json()["server"]["max_batch_rows"]
    response = batch(client, [{"tokens": [1]}] * (max_rows + 1))
    assert response.status_code == 400 and response.json()["error"]["param"] == "requests"
    assert str(max_rows) in response.json()["error"]["message"]


def test_batch_needs_the_api_key_like_draft(request):
    url = shared_server(request.config, STRICT_ARGS).url
    with httpx.Client(base_url=url, timeout=30) as client:
        assert batch(client, [{"tokens": [1]}]).status_code == 401
        authorized = batch(client, [{"tokens": [1, 2], "num_draft_tokens": 2}],
                           headers={"Authorization": f"Bearer {API_KEY}"})  # fmt: skip
        # (its 50 ms queue deadline may expire a row on a busy machine: that is the row's 504, not a 401)
        assert authorized.status_code == 200 and authorized.json()["results"][0]["status"] in (200, 504)
