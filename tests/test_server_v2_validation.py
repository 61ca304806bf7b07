"""Every bad v2 input gets a clear 4xx naming the field, never echoes the input, and changes nothing: the
session, its token, its sequence and the acceptance counters are as they were."""

from __future__ import annotations

import httpx
import pytest

from tests.oracle import hf_greedy
from tests.server_process import shared_server
from tests.session_server import MAX_SEQ_LEN, ORACLE_MODEL, Conversation, session_server_args

MARKER = "leaky-marker-9c1d"  # put into bad inputs; must never come back
NAME = "validated"

BAD_V2 = {
    # name: (fields over a valid v2 body, status, error type, param, words the message must contain)
    "prefix_len negative": ({"prefix_len": -1}, 400, "invalid_request", "prefix_len", "[0, 4096]"),
    "prefix_len huge": ({"prefix_len": 10**30}, 400, "invalid_request", "prefix_len", "integer"),
    "prefix_len past max": ({"prefix_len": MAX_SEQ_LEN + 1}, 400, "invalid_request", "prefix_len", "4096"),
    "prefix_len past sequence": ({"prefix_len": 999}, 409, "session_unknown", "session", "prefix_len"),
    "prefix_len float": ({"prefix_len": 3.0}, 400, "invalid_request", "prefix_len", "integer"),
    "prefix_len bool": ({"prefix_len": True}, 400, "invalid_request", "prefix_len", "integer"),
    "prefix_len string": ({"prefix_len": MARKER}, 400, "invalid_request", "prefix_len", "integer"),
    "no session": ({"session": None}, 400, "invalid_request", "session", "session_token"),
    "no token": ({"session_token": None}, 400, "invalid_request", "session", "session_token"),
    "token not a string": ({"session_token": 12345}, 400, "invalid_request", "session_token", "string"),
    "token empty": ({"session_token": ""}, 400, "invalid_request", "session_token", "string"),
    "token too long": ({"session_token": MARKER * 10}, 400, "invalid_request", "session_token", "64"),
    "wrong token": ({"session_token": MARKER}, 409, "session_unknown", "session", "session_token"),
    "unknown session": ({"session": MARKER}, 409, "session_unknown", "session", "resend"),
    "session not a string": ({"session": 7}, 400, "invalid_request", "session", "string"),
    "tokens not a list": ({"tokens": MARKER}, 400, "invalid_request", "tokens", "list"),
    "token out of vocab": ({"tokens": [512]}, 400, "invalid_request", "tokens", "[0, 512)"),
    "token negative": ({"tokens": [-3]}, 400, "invalid_request", "tokens", "[0, 512)"),
    "token is bool": ({"tokens": [True]}, 400, "invalid_request", "tokens", "integers"),
    "empty tokens at 0": ({"prefix_len": 0, "tokens": []}, 400, "invalid_request", "tokens", "empty"),
    "context too long": (
        {"prefix_len": 20, "tokens": [1] * (MAX_SEQ_LEN - 20)},
        400,
        "invalid_request",
        "tokens",
        "prefix_len + len(tokens) + num_draft_tokens must be at most 4096",
    ),
    "empty tokens past max": (
        {"prefix_len": MAX_SEQ_LEN - 3, "tokens": []},
        400,
        "invalid_request",
        "tokens",
        "4096",
    ),
    "auto capitalized": ({"num_draft_tokens": "Auto"}, 400, "invalid_request", "num_draft_tokens", '"auto"'),
    "auto misspelt": ({"num_draft_tokens": MARKER}, 400, "invalid_request", "num_draft_tokens", '"auto"'),
    "k zero": ({"num_draft_tokens": 0}, 400, "invalid_request", "num_draft_tokens", "[1, 16]"),
    "close not bool": ({"close": "yes"}, 400, "invalid_request", "close", "true or false"),
}


@pytest.fixture(scope="module")
def served(request, hf_checkpoint):
    model, directory = hf_checkpoint(ORACLE_MODEL)
    url = shared_server(request.config, session_server_args(directory)).url
    with httpx.Client(base_url=url, timeout=60) as client:
        conversation = Conversation(client, NAME, list(range(30)), model.config.vocab_size)
        assert conversation.sync(6).status_code == 200
        yield model, client, conversation


@pytest.mark.parametrize("name", BAD_V2)
def test_bad_v2_input_is_refused_and_changes_nothing(served, name):
    model, client, conversation = served
    fields, status, kind, param, words = BAD_V2[name]
    own = (conversation.drafts[2] + 1) % model.config.vocab_size  # the target rejects the third draft
    good = {
        "session": NAME,
        "session_token": conversation.token,
        "prefix_len": len(conversation.context) + 2,
        "tokens": [own],
        "num_draft_tokens": 4,
    }
    before = client.get("/info").json()
    response = client.post("/draft", json={**good, **fields})
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert (error["type"], error["param"]) == (kind, param)
    assert words in error["message"]
    assert MARKER not in response.text
    after = client.get("/info").json()
    assert after["speculation"] == before["speculation"]
    assert after["sessions"]["live"] == before["sessions"]["live"]
    # The session still answers its holder, from the same sequence, as if nothing had been sent.
    answer = client.post("/draft", json=good)
    assert answer.status_code == 200, answer.text
    assert answer.json()["accepted"] == 2
    assert answer.json()["session_token"] == conversation.token
    context = conversation.context + conversation.drafts[:2] + [own]
    assert answer.json()["tokens"] == hf_greedy(model, context, 4)
    assert conversation.sync(6).status_code == 200  # back to the state every case starts from
