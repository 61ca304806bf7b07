"""Every bad request gets its status and a message naming the field, never the input, never a 5xx, and
the server keeps drafting correctly afterwards."""

from __future__ import annotations

import json

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.server_process import MAIN_ARGS, MAX_BODY_BYTES, main_oracle, shared_server

MARKER = "leaky-marker-7f3a"  # put into bad inputs; must never come back
NAME_MARKER = "leaky_marker_7f3a"  # the same, as a plausible field name


@pytest.fixture(scope="module")
def client(request):
    with httpx.Client(base_url=shared_server(request.config, MAIN_ARGS).url, timeout=30) as client:
        yield client


def assert_still_drafts(client):
    tokens = [3, 1, 4, 1, 5, 9, 2, 6]
    response = client.post("/draft", json={"tokens": tokens, "num_draft_tokens": 5})
    assert response.status_code == 200, response.text
    assert response.json()["tokens"] == main_oracle().draft(tokens, 5)


BAD_BODIES = {
    # name: (body, status, param, words the message must contain)
    "not json": (b"{tokens: [1, 2", 400, None, "valid JSON"),
    "not an object": (b"[1, 2, 3]", 400, None, "JSON object"),
    "empty body": (b"", 400, None, "valid JSON"),
    "no tokens": ({"num_draft_tokens": 4}, 400, "tokens", "required"),
    "tokens not a list": ({"tokens": MARKER}, 400, "tokens", "list"),
    "tokens empty": ({"tokens": []}, 400, "tokens", "empty"),
    "token is bool": ({"tokens": [1, True, 2]}, 400, "tokens", "integers"),
    "token is float": ({"tokens": [1, 2.0]}, 400, "tokens", "integers"),
    "token is string": ({"tokens": [1, MARKER]}, 400, "tokens", "integers"),
    "token is null": ({"tokens": [1, None]}, 400, "tokens", "integers"),
    "token negative": ({"tokens": [1, -1]}, 400, "tokens", "[0, 1024)"),
    "token past vocab": ({"tokens": [1024]}, 400, "tokens", "[0, 1024)"),
    "token past int64": ({"tokens": [1, 2**64 - 1]}, 400, "tokens", "[0, 1024)"),  # JSON allows it
    "token huge": (b'{"tokens": [100000000000000000000000]}', 400, "tokens", "integers"),
    # Past FEW_TOKENS the list is checked through numpy, not item by item: the same answers.
    "long: token is bool": ({"tokens": [1] * 40 + [True]}, 400, "tokens", "integers"),
    "long: token is float": ({"tokens": [1] * 40 + [2.0]}, 400, "tokens", "integers"),
    "long: token is string": ({"tokens": [1] * 40 + [MARKER]}, 400, "tokens", "integers"),
    "long: token negative": ({"tokens": [1] * 40 + [-1]}, 400, "tokens", "[0, 1024)"),
    "long: token past vocab": ({"tokens": [1] * 40 + [1024]}, 400, "tokens", "[0, 1024)"),
    "long: token past int64": ({"tokens": [1] * 40 + [2**64 - 1]}, 400, "tokens", "[0, 1024)"),
    "context too long": (
        {"tokens": [1] * 500, "num_draft_tokens": 16},
        400,
        "tokens",
        "len(tokens) + num_draft_tokens must be at most 512",
    ),
    "k zero": ({"tokens": [1], "num_draft_tokens": 0}, 400, "num_draft_tokens", "[1, 16]"),
    "k past max": ({"tokens": [1], "num_draft_tokens": 17}, 400, "num_draft_tokens", "[1, 16]"),
    "k is bool": ({"tokens": [1], "num_draft_tokens": True}, 400, "num_draft_tokens", "integer"),
    "k is float": ({"tokens": [1], "num_draft_tokens": 4.0}, 400, "num_draft_tokens", "integer"),
    "session not str": ({"tokens": [1], "session": 42}, 400, "session", "string"),
    "session too long": ({"tokens": [1], "session": MARKER * 20}, 400, "session", "128"),
    "confidence above 1": ({"tokens": [1], "min_confidence": 1.5}, 400, "min_confidence", "[0, 1]"),
    "confidence negative": ({"tokens": [1], "min_confidence": -0.1}, 400, "min_confidence", "[0, 1]"),
    "confidence is str": ({"tokens": [1], "min_confidence": MARKER}, 400, "min_confidence", "number"),
    "confidence is bool": ({"tokens": [1], "min_confidence": True}, 400, "min_confidence", "number"),
    "probs not bool": ({"tokens": [1], "return_probs": 1}, 400, "return_probs", "true or false"),
    "unknown field": ({"tokens": [1], NAME_MARKER: 0.7}, 400, None, "allowed fields: tokens,"),
    "unknown odd field": ({"tokens": [1], f"<{MARKER}>": 1}, 400, None, "unknown field"),
    "too large": ({"tokens": [1] * (MAX_BODY_BYTES // 2)}, 413, None, f"{MAX_BODY_BYTES} bytes"),
}


def test_v1_context_limit_names_only_the_fields_a_v1_call_sends(client):
    response = client.post("/draft", json={"tokens": [1] * 500, "num_draft_tokens": 16})
    assert response.status_code == 400
    message = response.json()["error"]["message"]
    assert (
        message.startswith("len(tokens) + num_draft_tokens must be at most 512")
        and "prefix_len" not in message
    )


@pytest.mark.parametrize("name", BAD_BODIES)
def test_draft_bad_body_is_refused_with_the_field_named(client, name):
    body, status, param, words = BAD_BODIES[name]
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    response = client.post("/draft", content=content, headers={"Content-Type": "application/json"})
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"type", "message", "param"}
    assert error["param"] == param
    assert words in error["message"]
    assert MARKER not in response.text and NAME_MARKER not in response.text
    assert_still_drafts(client)


def test_draft_oversized_chunked_body_is_refused_by_bytes_read(client):
    def chunks():  # no Content-Length: the server must count what it reads
        yield b'{"tokens": ['
        for _ in range(MAX_BODY_BYTES // 1000 + 2):
            yield b"1, " * 333 + b"1,"
        yield b"1]}"

    response = client.post("/draft", content=chunks(), headers={"Content-Type": "application/json"})
    assert response.status_code == 413
    assert response.json()["error"]["type"] == "payload_too_large"
    assert_still_drafts(client)


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded"])
def test_draft_wrong_content_type_is_415(client, content_type):
    headers = {"Content-Type": content_type} if content_type else {}
    response = client.post("/draft", content=b'{"tokens": [1]}', headers=headers)
    assert response.status_code == 415
    assert "application/json" in response.json()["error"]["message"]
    assert_still_drafts(client)


def test_draft_json_content_type_with_charset_is_accepted(client):
    response = client.post(
        "/draft", content=b'{"tokens": [1, 2]}', headers={"Content-Type": "Application/JSON; charset=utf-8"}
    )
    assert response.status_code == 200


def test_draft_nulls_mean_defaults(client):
    body = {"tokens": [1, 2], "num_draft_tokens": None, "session": None, "min_confidence": None}
    response = client.post("/draft", json=body)
    assert response.status_code == 200
    assert len(response.json()["tokens"]) == 16


def test_unknown_route_and_wrong_method_are_json_errors(client):
    assert client.get("/nope").json()["error"]["type"] == "not_found"
    response = client.get("/draft")
    assert response.status_code == 405
    assert response.json()["error"]["type"] == "method_not_allowed"


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=8) | st.dictionaries(st.text(max_size=10), children, max_size=5)
    ),
    max_leaves=30,
)
field_names = st.sampled_from(["tokens", "num_draft_tokens", "session", "min_confidence", "return_probs"])
token_lists = st.lists(st.integers(-5, 1100) | st.booleans() | st.floats(allow_nan=False), max_size=40)
draft_like = st.dictionaries(field_names | st.text(max_size=8), json_values | token_lists, max_size=6)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=draft_like | json_values, raw=st.binary(max_size=64) | st.none())
def test_draft_random_bodies_never_give_a_5xx(client, body, raw):
    content = raw if raw is not None else json.dumps(body).encode()
    response = client.post("/draft", content=content, headers={"Content-Type": "application/json"})
    assert response.status_code in (200, 400), response.text
    if response.status_code == 400:
        assert response.json()["error"]["type"] == "invalid_request"
