"""Suffix drafting through a real server: `"source": "suffix"` drafts equal the brute-force reference over
what the server indexed (the session's previous context, and every session's response), through v2 growth,
a rollback and two sessions sharing content; a hybrid draft is a suffix head followed by exactly
transformers' greedy continuation after it; model drafts stay transformers' own; acceptance is counted by
source; bad sources are refused by name; a closed session's index is freed."""

from __future__ import annotations

import random
import time

import httpx
import pytest

from drafter.client import DraftClient
from drafter.server.errors import ApiError
from drafter.server.validation import Limits, parse_draft_fields
from drafter.sessions.suffix_drafts import SuffixRules
from tests.oracle import hf_greedy
from tests.server_process import ServerProcess, metric_value
from tests.test_suffix_drafts import reference

RULES = SuffixRules()  # the server's


@pytest.fixture(scope="module")
def served(hf_checkpoint):
    model, directory = hf_checkpoint("gqa2-untied")
    args = [f"--model={directory}", "--dtype=float32", "--device=cpu", "--no-compile", "--port=0"]
    args += ["--max-seq-len=1024", "--request-timeout-s=30"]
    server = ServerProcess(args)
    try:
        yield model, server.wait_ready()
    finally:
        server.close()


def indexed(client: DraftClient) -> dict:
    """/info's suffix index, once the server has indexed everything it was sent."""
    deadline = time.monotonic() + 30
    while True:
        suffix = client.info()["speculation"]["suffix_index"]
        if suffix["pending_tokens"] == 0 or time.monotonic() > deadline:
            return suffix
        time.sleep(0.01)


def quoting(rng: random.Random, vocab: int, quoted: int = 6) -> tuple[list[int], list[int]]:
    """A prompt that ends quoting `quoted` tokens of an earlier part of itself, as an edit or a tool output
    would, and what the target goes on to say: the rest of the quote."""
    chunk = [rng.randrange(vocab) for _ in range(60)]
    lead_in, between = [rng.randrange(vocab) for _ in range(20)], [rng.randrange(vocab) for _ in range(10)]
    return lead_in + chunk + between + chunk[:quoted], chunk[quoted:]


def test_suffix_drafts_equal_the_reference_through_growth_rollback_and_sharing(served):
    model, url = served
    vocab, k = model.config.vocab_size, 8
    rng = random.Random(5)
    with DraftClient(url, timeout_s=30) as client:
        responses: dict[str, list[int]] = {}
        for name in ("first", "second"):
            session = client.session(f"suffix-{name}")
            context, rest = quoting(rng, vocab)
            if name == "second":  # its tail quotes the first session's response: only the global index has it
                context += responses["first"][:8]
            prompt_len, previous = len(context), []
            for call in range(6):
                indexed(client)
                answer = session.draft(context, k, source="suffix")
                others = [tokens for other, tokens in responses.items() if other != name]
                expected = reference(previous, [previous[prompt_len:], *others], context, RULES, k)
                assert answer.tokens == expected.tokens, (name, call)
                assert answer.source == "suffix" and answer.suffix_tokens == len(answer.tokens)
                if call == 0:
                    assert bool(answer.tokens) == (name == "second"), "only the global index holds a match"
                previous = list(context)
                if call == 3:  # a rollback: the target goes back three tokens and on another way
                    context = context[:-3] + [rng.randrange(vocab)]
                context = context + rest[3 * call : 3 * call + 3]
                responses[name] = previous[prompt_len:]
        info = indexed(client)
        assert info["local"]["sessions"] >= 2 and info["global"]["tokens"] > 0


def test_hybrid_drafts_are_a_suffix_head_then_the_models_greedy_continuation(served):
    model, url = served
    vocab, k = model.config.vocab_size, 8
    rng = random.Random(9)
    sources = []
    with DraftClient(url, timeout_s=30) as client:
        session = client.session("hybrid")
        context, rest = quoting(rng, vocab, quoted=2)  # short matches: short suffix drafts, then the model
        for call in range(4):
            indexed(client)
            answer = session.draft(context, k, source="hybrid")
            head, tail = answer.tokens[: answer.suffix_tokens], answer.tokens[answer.suffix_tokens :]
            if tail:
                assert tail == hf_greedy(model, context + head, len(tail))
            assert answer.source == ("hybrid" if head and tail else "suffix" if head else "model")
            sources.append(answer.source)
            model_answer = client.draft(context, k, source="model")
            assert model_answer.tokens == hf_greedy(model, context, k) and model_answer.source == "model"
            context = context + rest[2 * call : 2 * call + 2]
    assert sources[0] == "model" and "hybrid" in sources[1:], sources


def test_acceptance_is_counted_by_source(served):
    """A target that says the rest of the quote: it keeps drafts as far as they match it, then says its
    next token; the server's tally by source equals the one worked out from the answers."""
    model, url = served
    rng = random.Random(13)
    expected = {"suffix": [0, 0], "model": [0, 0]}
    with DraftClient(url, timeout_s=30) as client:
        before = client.info()["speculation"]["by_source"]
        session = client.session("counted")
        context, rest = quoting(rng, model.config.vocab_size)
        position = 0
        for _ in range(5):
            indexed(client)
            answer = session.draft(context, 8, source="hybrid")
            truth = rest[position:]
            accepted = next(
                (i for i, (d, t) in enumerate(zip(answer.tokens, truth, strict=False)) if d != t),
                len(answer.tokens),
            )
            head, total = answer.suffix_tokens, len(answer.tokens)
            for source, drafted, kept in (
                ("suffix", head, min(accepted, head)),
                ("model", total - head, max(0, accepted - head)),
            ):
                expected[source][0] += drafted
                expected[source][1] += kept
            context = context + truth[: accepted + 1]
            position += accepted + 1
        session.draft(context, 8, source="hybrid")  # reports the last round's
        after = client.info()["speculation"]["by_source"]
        metrics = httpx.get(f"{url}/metrics").text
    for source, (drafted, kept) in expected.items():
        assert after[source]["num_draft_tokens"] - before[source]["num_draft_tokens"] == drafted, source
        assert after[source]["num_accepted_tokens"] - before[source]["num_accepted_tokens"] == kept, source
    assert expected["suffix"][1] > 0 and expected["model"][0] > 0
    suffix_metric = 'drafter_spec_decode_num_accepted_tokens_by_source_total{source="suffix"}'
    assert metric_value(metrics, suffix_metric) == after["suffix"]["num_accepted_tokens"]


def test_a_bad_source_is_refused_by_name(served):
    _, url = served
    response = httpx.post(f"{url}/draft", json={"tokens": [1, 2, 3], "source": "oracle"})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "source" and "oracle" not in error["message"]


def test_a_server_with_suffix_drafting_off_refuses_suffix_sources():
    limits = Limits(
        vocab_size=10, max_seq_len=64, max_draft_tokens=4, default_num_draft_tokens=4, max_body_bytes=999
    )
    for source in ("suffix", "hybrid"):
        with pytest.raises(ApiError) as refused:
            parse_draft_fields({"tokens": [1, 2], "source": source}, limits)
        assert refused.value.status == 400 and refused.value.param == "source"
        assert "--suffix-tokens 0" in refused.value.message
    assert parse_draft_fields({"tokens": [1, 2], "source": "model"}, limits).source == "model"


def test_closing_a_session_frees_its_index(served):
    model, url = served
    rng = random.Random(17)
    with DraftClient(url, timeout_s=30) as client:
        session = client.session("closed")
        session.draft(quoting(rng, model.config.vocab_size)[0], 4, source="suffix")
        held = indexed(client)["local"]
        session.close()
        after = indexed(client)["local"]
    assert after["sessions"] == held["sessions"] - 1 and after["tokens"] < held["tokens"]


def test_a_rebuilt_session_gives_its_prompt_to_no_other_call(served):
    """Another client that knows only a session's name rebuilds it with its own prompt: the global index does
    not take that prompt for a response, so no sessionless call drafts it back."""
    model, url = served
    rng = random.Random(11)
    first = [rng.randrange(model.config.vocab_size) for _ in range(30)]
    prompt = [rng.randrange(model.config.vocab_size) for _ in range(200)]
    with DraftClient(url, timeout_s=30) as client, httpx.Client(base_url=url, timeout=30) as http:
        before = indexed(client)["global"]["tokens"]
        for context in (first, prompt):
            body = {"tokens": context, "num_draft_tokens": 4, "session": "rebuilt", "source": "hybrid"}
            assert http.post("/draft", json=body).status_code == 200
        assert indexed(client)["global"]["tokens"] == before
        probe = {"tokens": prompt[90:100], "num_draft_tokens": 8, "source": "suffix"}
        drafted = http.post("/draft", json=probe).json()["tokens"]
    assert not drafted or drafted != prompt[100 : 100 + len(drafted)]
