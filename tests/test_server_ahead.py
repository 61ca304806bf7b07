"""Drafting ahead through a real server (--draft-ahead): a target that keeps some drafts and adds the
drafter's own likeliest token gets answers from branches — `Server-Timing` says hit, /info and /metrics
count them — and every answer, hit or miss, equals transformers' greedy drafts for its context."""

from __future__ import annotations

import time

import httpx
import pytest
import torch

from tests.oracle import hf_greedy
from tests.server_process import metric_value, shared_server
from tests.session_server import ORACLE_MODEL, session_server_args

K = 6


@pytest.fixture(scope="module")
def served(hf_checkpoint, request):
    model, directory = hf_checkpoint(ORACLE_MODEL)
    args = [*session_server_args(directory), "--max-batch-size=8", "--draft-ahead=8"]
    server = shared_server(request.config, args)
    with httpx.Client(base_url=server.url, timeout=30) as client:
        yield model, client


def ranked_after(model, tokens: list[int]) -> list[int]:
    """The drafter's choices for the token after `tokens`, best first (what a target may put there)."""
    with torch.no_grad():
        logits = model(torch.tensor([tokens])).logits[0, -1]
    return logits.topk(3).indices.tolist()


def ahead_info(client) -> dict:
    return client.get("/info").json()["draft_ahead"]


VERIFY_S = 0.3  # the target's verify pass between two calls, as this test's target takes it


def post(client, body: dict) -> httpx.Response:
    """A call, then the target's verify pass: it lasts until the round's branches are drafted, or VERIFY_S
    if none are planned (a session's first call: its pace is not known yet)."""
    before = ahead_info(client)
    response = client.post("/draft", json=body)
    started = time.monotonic()
    while time.monotonic() < started + 20:
        info = ahead_info(client)
        if info["plans"] == before["plans"] and time.monotonic() > started + VERIFY_S:
            return response
        if (
            info["plans"] > before["plans"]
            and info["drafted"] + info["preempted"] + info["stale"] == info["plans"]
        ):
            return response
        time.sleep(0.02)
    raise AssertionError(f"branches planned but never drafted: {info}")


def test_calls_matching_a_branch_are_answered_from_it_with_the_same_drafts(served):
    model, client = served
    context = list(range(3, 60))
    answer = post(client, {"tokens": context, "session": "ahead", "num_draft_tokens": K}).json()
    assert answer["tokens"] == hf_greedy(model, context, K)
    outcomes, before = [], ahead_info(client)
    # Rounds fully accepted (the likeliest outcome once acceptance is high), then rejections at 2 and 0
    # with the drafter's runner-up, then a token no branch predicts.
    for accepted in (K, K, K, K, 2, K, 0, K, "off", K):
        drafts = answer["tokens"]
        kept = len(drafts) if accepted in (K, "off") else accepted
        ranked = ranked_after(model, context + drafts[:kept])
        bonus = ranked[0] if kept == len(drafts) else next(t for t in ranked if t != drafts[kept])
        if accepted == "off":
            bonus = (ranked[0] + 1) % 512 if (ranked[0] + 1) % 512 not in ranked else (ranked[0] + 7) % 512
        prefix_len = len(context) + kept
        context = context + drafts[:kept] + [bonus]
        body = {
            "tokens": [bonus],
            "prefix_len": prefix_len,
            "session": "ahead",
            "session_token": answer["session_token"],
            "num_draft_tokens": K,
        }
        response = post(client, body)
        assert response.status_code == 200, response.text
        answer = response.json()
        assert answer["tokens"] == hf_greedy(model, context, K), accepted
        assert answer["accepted"] == kept
        outcomes.append(response.headers["server-timing"].split("ahead;desc=")[1].split(",")[0])
    assert set(outcomes) <= {"hit", "miss", "none"}
    assert outcomes[-2] == "miss"  # the unpredicted token
    assert outcomes.count("hit") >= 4, outcomes
    info = ahead_info(client)
    assert info["hits"] - before["hits"] == outcomes.count("hit")
    assert info["misses"] - before["misses"] == outcomes.count("miss")
    assert sum(info["hits_by_accepted"]) == info["hits"] and info["hits_by_accepted"][K] >= 3
    assert info["top_choices"] > 0 and info["branches_drafted"] > 0
    metrics = client.get("/metrics").text
    assert metric_value(metrics, 'drafter_ahead_calls_total{outcome="hit"}') == info["hits"]
    assert metric_value(metrics, "drafter_ahead_wasted_steps_total") == info["wasted_steps"]


def test_a_full_context_call_and_auto_k_stay_exact_with_branches_around(served):
    model, client = served
    context = list(range(100, 170))
    answer = post(client, {"tokens": context, "session": "ahead-2"}).json()  # auto
    assert answer["tokens"] == hf_greedy(model, context, len(answer["tokens"]))
    for _ in range(3):
        context = context + answer["tokens"] + [ranked_after(model, context + answer["tokens"])[0]]
        answer = post(client, {"tokens": context, "session": "ahead-2"}).json()  # v1: the whole context
        assert answer["tokens"] == hf_greedy(model, context, len(answer["tokens"]))


def test_a_session_calling_sooner_than_a_loop_finishes_is_not_drafted_ahead_and_stays_exact(served):
    """Back to back, no verify pass between calls: each ahead loop would be preempted by the next call, so
    after the first one measures the engine's step time the server stops planning for this session."""
    model, client = served
    context, sent = list(range(200, 300)), []
    before = ahead_info(client)
    for _ in range(8):  # each call the moment the last is answered (the oracle runs after)
        answer = client.post("/draft", json={"tokens": context, "session": "hasty", "num_draft_tokens": K})
        sent.append((context, answer.json()["tokens"]))
        context = context + sent[-1][1][:2] + [(context[-1] * 7 + 3) % 512]
    info = ahead_info(client)
    assert info["step_ms"] > 0
    assert info["too_slow"] - before["too_slow"] >= 5, info  # of 7 calls after the first
    assert info["plans"] - before["plans"] <= 2, info
    for context, drafts in sent:
        assert drafts == hf_greedy(model, context, K)
