"""Acceptance feedback over HTTP: the counters equal what a scripted target accepted, auto drafts long for
a target that accepts much and short for one that accepts little, follows a change, and answers no drafts
at once instead of queueing behind a saturated engine."""

from __future__ import annotations

import concurrent.futures
import random
import time

import httpx
import numpy as np
import pytest

from drafter.sessions.draft_length import PROBE_EVERY
from tests.server_process import metric_value, shared_server
from tests.session_server import AUTO_MAX_QUEUE, MAX_SEQ_LEN, ORACLE_MODEL, Conversation, session_server_args

SPEC = "drafter_spec_decode_"


@pytest.fixture(scope="module")
def url(request, hf_checkpoint):
    _, directory = hf_checkpoint(ORACLE_MODEL)
    return shared_server(request.config, session_server_args(directory)).url


@pytest.fixture(scope="module")
def client(url):
    with httpx.Client(base_url=url, timeout=60) as client:
        yield client


def spec_counters(client: httpx.Client) -> dict[str, float]:
    text = client.get("/metrics").text
    names = ["num_drafts_total", "num_draft_tokens_total", "num_accepted_tokens_total"]
    counters = {name: metric_value(text, SPEC + name) for name in names}
    for position in range(16):
        key = f'num_accepted_tokens_per_pos_total{{position="{position}"}}'
        counters[key] = metric_value(text, SPEC + key)
    return counters


def test_counters_equal_what_the_scripted_target_accepted(client):
    rng = random.Random(7)
    before, info_before = spec_counters(client), client.get("/info").json()["speculation"]
    conversation = Conversation(client, "counted", list(range(10, 60)), 512, seed=7)
    conversation.sync(5)
    drafted, accepted = [], []
    for k in [5, 8, 1, 16, 3, 8, 8, 2, 12, 4]:
        num_accepted = rng.randrange(len(conversation.drafts) + 1)
        drafted.append(len(conversation.drafts))
        accepted.append(num_accepted)
        assert conversation.accept(num_accepted, k).json()["accepted"] == num_accepted
    after, info_after = spec_counters(client), client.get("/info").json()["speculation"]
    grew = {name: after[name] - before[name] for name in after}
    assert grew["num_drafts_total"] == len(drafted)
    assert grew["num_draft_tokens_total"] == sum(drafted)
    assert grew["num_accepted_tokens_total"] == sum(accepted)
    for position in range(16):
        key = f'num_accepted_tokens_per_pos_total{{position="{position}"}}'
        assert grew[key] == sum(a > position for a in accepted), position
    assert info_after["num_drafts"] - info_before["num_drafts"] == len(drafted)
    assert info_after["num_accepted_tokens"] - info_before["num_accepted_tokens"] == sum(accepted)


def auto_lengths(client: httpx.Client, name: str, schedule: list[tuple[float, int]], seed: int) -> list[int]:
    """The k auto picked each round for a target accepting with probability p, phase by phase."""
    conversation = Conversation(client, name, list(range(40)), 512, seed=seed)
    assert conversation.sync("auto").status_code == 200
    lengths = []
    for p, rounds in schedule:
        for _ in range(rounds):
            _, response = conversation.accept_with_probability(p)
            assert response.status_code == 200, response.text
            lengths.append(response.json()["num_draft_tokens"])
            assert len(response.json()["tokens"]) == lengths[-1]
    return lengths


def test_auto_drafts_long_for_high_acceptance_and_short_for_low(client):
    high = auto_lengths(client, "auto-high", [(0.9, 25)], seed=1)
    low = auto_lengths(client, "auto-low", [(0.3, 25)], seed=2)
    assert np.mean(high[-10:]) >= 8, high
    assert np.mean(low[-10:]) <= 3, low


def test_auto_follows_a_change_of_acceptance_within_a_few_rounds(client):
    # A new session starts where the server's recent drafts left its estimate and its wait for a probe
    # (a test before may have left both low and long): first a conversation at a fixed k whose drafts are
    # mostly kept, as a server with such traffic would have had.
    warm = Conversation(client, "auto-change-warm", list(range(40)), 512, seed=5)
    assert warm.sync(8).status_code == 200
    for _ in range(4):
        assert warm.accept_with_probability(0.95, 8)[1].status_code == 200
    lengths = auto_lengths(client, "auto-change", [(0.95, 15), (0.1, 8)], seed=3)
    assert np.mean(lengths[10:15]) >= 8, lengths
    assert max(lengths[-2:]) <= 3, lengths


def test_auto_answers_no_drafts_at_once_behind_a_saturated_queue(client, url):
    rng = random.Random(3)
    contexts = [[rng.randrange(512) for _ in range(MAX_SEQ_LEN - 100)] for _ in range(12)]
    with concurrent.futures.ThreadPoolExecutor(len(contexts)) as pool:
        ahead = [
            pool.submit(httpx.post, f"{url}/draft", json={"tokens": c, "num_draft_tokens": 8}, timeout=60)
            for c in contexts
        ]
        deadline = time.monotonic() + 30
        while metric_value(client.get("/metrics").text, "drafter_queue_depth") < AUTO_MAX_QUEUE:
            assert time.monotonic() < deadline, "the queue never filled"
        response = client.post("/draft", json={"tokens": [1, 2, 3], "num_draft_tokens": "auto"})
        still_queued = metric_value(client.get("/metrics").text, "drafter_queue_depth")
        assert [f.result().status_code for f in ahead] == [200] * len(contexts)
    assert response.status_code == 200
    assert response.json()["tokens"] == [] and response.json()["num_draft_tokens"] == 0
    assert "queue;dur=0.000" in response.headers["server-timing"]
    assert still_queued > 0  # it was answered while the queue was still draining, not after
    # Idle again, auto drafts by acceptance alone: a conversation whose drafts are all kept drafts again
    # (at once, or after a probe where earlier tests left the server-wide estimate low), and so does
    # a sessionless call, which starts from that estimate.
    idle = auto_lengths(client, "auto-after-load", [(1.0, PROBE_EVERY + 4)], seed=4)
    assert idle[-1] >= 1, idle
    assert client.post("/draft", json={"tokens": [1, 2, 3], "num_draft_tokens": "auto"}).json()["tokens"]
    assert len(client.post("/draft", json={"tokens": [1, 2, 3]}).json()["tokens"]) >= 1  # default: auto
