"""Protocol v2 over HTTP: incremental calls draft exactly what full-context calls and transformers' greedy
generate draft, through rollbacks, evictions, shared and unknown sessions and restarts (409, then a full
resync), and `accepted` says what the target kept."""

from __future__ import annotations

import random

import httpx
import pytest

from tests.oracle import hf_greedy
from tests.server_process import ServerProcess, metric_value, shared_server
from tests.session_server import MAX_SEQ_LEN, ORACLE_MODEL, Conversation, session_server_args


@pytest.fixture(scope="module")
def served(request, hf_checkpoint):
    model, directory = hf_checkpoint(ORACLE_MODEL)
    return model, shared_server(request.config, session_server_args(directory)).url


@pytest.fixture(scope="module")
def client(served):
    with httpx.Client(base_url=served[1], timeout=60) as client:
        yield client


def random_tokens(rng: random.Random, vocab_size: int, length: int) -> list[int]:
    return [rng.randrange(vocab_size) for _ in range(length)]


def assert_session_unknown(response: httpx.Response):
    assert response.status_code == 409, response.text
    assert response.json()["error"]["type"] == "session_unknown"


def test_info_says_the_server_speaks_v2(client):
    info = client.get("/info").json()
    assert info["protocol_versions"] == [1, 2]
    assert info["draft_length_policy"]["zero_drafts_at_queue_depth"] == 3
    assert info["sessions"]["max_sessions"] == 1024


def test_v2_drafts_equal_v1_and_greedy_generate_through_rollbacks_and_evictions(served, client):
    model, _ = served
    vocab, rng = model.config.vocab_size, random.Random(0)
    evictions_before = metric_value(client.get("/metrics").text, "drafter_evictions_total")
    conversations = [
        Conversation(client, f"oracle-{i}", random_tokens(rng, vocab, rng.randrange(20, 80)), vocab, seed=i)
        for i in range(3)
    ]
    for conversation in conversations:
        response = conversation.sync(8)
        assert response.json()["tokens"] == hf_greedy(model, conversation.context, 8)
        assert "accepted" not in response.json()  # a session's first call
    for round_index in range(8):
        if round_index == 4:  # a context filling the whole KV cache: the engine evicts every conversation
            filler = random_tokens(rng, vocab, MAX_SEQ_LEN - 20)
            assert client.post("/draft", json={"tokens": filler, "num_draft_tokens": 4}).status_code == 200
        for conversation in conversations:
            k = rng.randrange(1, 9)
            if round_index % 3 == 2:  # the target rolls back into its own context and goes elsewhere
                cut = len(conversation.context) - rng.randrange(1, 6)
                new_tokens = random_tokens(rng, vocab, rng.randrange(1, 4))
                conversation.context = conversation.context[:cut] + new_tokens
                response = conversation.extend(cut, new_tokens, k)
                expected_accepted = None
            else:
                expected_accepted = rng.randrange(len(conversation.drafts) + 1)
                response = conversation.accept(expected_accepted, k)
            assert response.status_code == 200, response.text
            answer = response.json()
            expected = hf_greedy(model, conversation.context, k)
            assert answer["tokens"] == expected
            assert answer["num_draft_tokens"] == k
            assert answer.get("accepted") == expected_accepted
            full = client.post("/draft", json={"tokens": conversation.context, "num_draft_tokens": k})
            assert full.json()["tokens"] == expected
    evictions = metric_value(client.get("/metrics").text, "drafter_evictions_total") - evictions_before
    assert evictions > 0  # the engine lost caches; sessions never noticed


def test_v2_call_may_send_no_new_tokens_and_v1_call_reports_acceptance_too(served, client):
    model, _ = served
    conversation = Conversation(client, "empty-tail", list(range(30)), model.config.vocab_size)
    conversation.sync(6)
    drafts = conversation.drafts
    # The target keeps all six drafts and has nothing of its own yet: the context is the sequence.
    conversation.context += drafts
    response = conversation.extend(len(conversation.context), [], 4)
    assert response.json()["accepted"] == 6
    assert response.json()["tokens"] == hf_greedy(model, conversation.context, 4)
    conversation.context += response.json()["tokens"][:2] + [conversation.own_token(2)]
    response = conversation.sync(4)  # v1 form of the same session: acceptance is still inferred
    assert response.json()["accepted"] == 2
    assert response.json()["tokens"] == hf_greedy(model, conversation.context, 4)


def test_unknown_session_and_foreign_token_get_409_and_a_full_resync_recovers(served, client):
    model, _ = served
    vocab = model.config.vocab_size
    alice = Conversation(client, "shared-name", list(range(40)), vocab, seed=1)
    mallory = Conversation(client, "shared-name", list(range(100, 140)), vocab, seed=2)
    alice.sync(5)
    stolen = alice.token
    mallory.token = "guessed-token-0000"
    assert_session_unknown(mallory.extend(40, [1], 5))  # a name alone reads nothing
    assert_session_unknown(client.post("/draft", json={**v2_body("never-seen", stolen, 1), "tokens": [2]}))
    mallory.sync(5)  # a full-context call under the same name rebuilds the session, with a new token
    assert mallory.token != stolen
    assert_session_unknown(alice.accept(2, 5))  # alice's token no longer holds anything
    response = alice.sync(5)  # the resync: the whole context again, same name
    assert response.status_code == 200
    assert response.json()["tokens"] == hf_greedy(model, alice.context, 5)
    response = alice.accept(1, 5)
    assert response.status_code == 200 and response.json()["accepted"] == 1
    assert response.json()["tokens"] == hf_greedy(model, alice.context, 5)
    assert_session_unknown(mallory.accept(0, 5))


def v2_body(session: str, token: str, prefix_len: int) -> dict:
    return {"session": session, "session_token": token, "prefix_len": prefix_len, "tokens": []}


def test_close_by_delete_or_by_flag_ends_the_session(client):
    vocab = 512
    conversation = Conversation(client, "to-close", list(range(20)), vocab)
    conversation.sync(3)
    url = f"/sessions/{conversation.name}"
    assert client.delete(url, headers={"Drafter-Session-Token": "wrong"}).status_code == 404
    assert client.delete(url).json()["error"]["type"] == "session_unknown"
    assert client.delete(url, headers={"Drafter-Session-Token": conversation.token}).status_code == 204
    assert client.delete(url, headers={"Drafter-Session-Token": conversation.token}).status_code == 404
    assert_session_unknown(conversation.accept(1, 3))
    conversation.sync(3)
    response = conversation.accept(1, 3, close=True)
    assert response.status_code == 200 and len(response.json()["tokens"]) == 3
    assert_session_unknown(conversation.accept(1, 3))


def test_restart_forgets_sessions_409_then_resync(hf_checkpoint):
    model, directory = hf_checkpoint(ORACLE_MODEL)
    args = session_server_args(directory)
    context = list(range(50))
    server = ServerProcess(args)
    try:
        with httpx.Client(base_url=server.wait_ready(), timeout=60) as client:
            conversation = Conversation(client, "survivor", context, model.config.vocab_size)
            conversation.sync(4)
    finally:
        server.close()
    server = ServerProcess(args)
    try:
        with httpx.Client(base_url=server.wait_ready(), timeout=60) as client:
            conversation.client = client
            assert_session_unknown(conversation.accept(2, 4))
            assert conversation.sync(4).status_code == 200
            response = conversation.accept(2, 4)
            assert response.json()["accepted"] == 2
            assert response.json()["tokens"] == hf_greedy(model, conversation.context, 4)
    finally:
        server.close()
