"""Whose text a session's name can reach, through the real session table, suffix store and Speculation (the
parts a `/draft` call goes through, without HTTP): a client that knows only a session's name never reads
another conversation's context back from the suffix index, however its calls interleave with the owner's;
a rebuild's prompt never reaches the global index; a token of any characters is just a wrong token."""

from __future__ import annotations

import random

import numpy as np
import pytest

from drafter.draft_params import DraftParams
from drafter.server.metrics import Metrics
from drafter.sessions.draft_length import DraftCost, DraftLengthPolicy, Load
from drafter.sessions.draft_source import HYBRID, MODEL, SUFFIX
from drafter.sessions.speculation import Speculation
from drafter.sessions.suffix_drafts import SuffixDrafts, SuffixRules
from drafter.sessions.table import SessionTable, SessionUnknown

VOCAB = 100_000  # random contexts over a large vocabulary: no accidental matches between two of them
K = 8
IDLE = Load(queue_depth=0, running=0)


def speculation() -> Speculation:
    suffix = SuffixDrafts(SuffixRules(), local_tokens=100_000, global_tokens=100_000)
    table = SessionTable(
        max_sessions=16, ttl_s=600, max_len=4096, on_drop=suffix.drop
    )  # as the runtime wires it
    policy = DraftLengthPolicy(DraftCost(20.0, 1.0, 1.0), K, max_batch_size=1, max_queue_depth=1)
    return Speculation(table, policy, Metrics(1), K, 4096, suffix, default_source=HYBRID)


def tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(VOCAB) for _ in range(n)]


def full(name: str, context: list[int], source: str = HYBRID) -> DraftParams:
    return DraftParams(np.asarray(context, dtype=np.int64), K, session=name, source=source)


def v2(name: str, token: str, prefix_len: int, new: list[int], source: str = HYBRID) -> DraftParams:
    new_tokens = np.asarray(new, dtype=np.int64)
    return DraftParams(new_tokens, K, session=name, prefix_len=prefix_len, session_token=token, source=source)


def call(spec: Speculation, params: DraftParams, drafts: list[int]) -> str:
    """A call from prepare to finish (the engine's drafts stood in by `drafts`); its session token."""
    return spec.finish(spec.prepare(params, IDLE), drafts)["session_token"]


def indexed(spec: Speculation) -> SuffixDrafts:
    while spec.suffix.work(budget_s=1.0):
        pass
    return spec.suffix


def readable(spec: Speculation, session: str | None, text: list[int]) -> bool:
    """Whether a lookup (trusted, as a v2 call's) drafts any of `text`'s continuation from its middle."""
    middle = len(text) // 2
    probe = np.asarray(text[middle - 10 : middle], dtype=np.int64)
    found = indexed(spec).lookup(session, probe, K, trusted=True)
    return bool(found.tokens) and found.tokens == text[middle : middle + len(found.tokens)]


def drafts_back(spec: Speculation, token: str, prefix_len: int, text: list[int]) -> bool:
    """Whether session "A"'s next v2 suffix call, sending 10 tokens from the middle of `text`, is answered
    with any of what follows them in `text`."""
    middle = len(text) // 2
    indexed(spec)
    probe = spec.prepare(v2("A", token, prefix_len, text[middle - 10 : middle], source=SUFFIX), IDLE)
    spec.abandon(probe)
    found = probe.head.tokens
    return bool(found) and found == text[middle : middle + len(found)]


def test_a_stale_v2_call_finishing_after_a_rebuild_leaves_its_context_out_of_the_new_session_index():
    rng, spec = random.Random(1), speculation()
    prompt_x, drafts = tokens(rng, 300), tokens(rng, K)
    token_x = call(spec, full("A", prompt_x), drafts)
    assert drafts_back(spec, token_x, len(prompt_x) + K, prompt_x), "the owner's own calls read its prompt"
    in_flight = spec.prepare(v2("A", token_x, len(prompt_x) + K, tokens(rng, 1)), IDLE)  # X's v2 call drafts
    prompt_y = tokens(rng, 30)
    token_y = call(spec, full("A", prompt_y), tokens(rng, K))  # Y, knowing only the name, rebuilds "A"
    spec.finish(in_flight, tokens(rng, K))  # X's call ends: the table keeps nothing of it
    assert not readable(spec, "A", prompt_x)
    assert spec.suffix.conversations["A"].target.tolist() == prompt_y
    assert not drafts_back(spec, token_y, len(prompt_y) + K, prompt_x)  # Y's own v2 call (trusted)
    assert not readable(spec, None, prompt_x)


@pytest.mark.parametrize("rebuild_source", [HYBRID, MODEL])
def test_a_rebuild_with_another_prompt_reads_nothing_of_the_old_context(rebuild_source):
    rng, spec = random.Random(2), speculation()
    prompt_x = tokens(rng, 300)
    call(spec, full("A", prompt_x), tokens(rng, K))
    prompt_y = tokens(rng, 30)
    token_y = call(spec, full("A", prompt_y, rebuild_source), tokens(rng, K))
    assert not drafts_back(spec, token_y, len(prompt_y) + K, prompt_x)


def test_a_rebuild_prompt_never_reaches_the_global_index_but_v2_growth_does():
    rng, spec = random.Random(3), speculation()
    token = call(spec, full("B", tokens(rng, 30)), tokens(rng, K))
    assert indexed(spec).describe()["global"]["tokens"] == 0
    prompt_y = tokens(rng, 200)  # another client rebuilds "B" with its own, longer prompt
    token = call(spec, full("B", prompt_y), drafts := tokens(rng, K))
    assert indexed(spec).describe()["global"]["tokens"] == 0
    assert not readable(spec, None, prompt_y), "a sessionless lookup drafts nothing of the prompt"
    # Growth proven by the session token is the conversation's response: the global index takes it.
    response = drafts + tokens(rng, 40)
    call(spec, v2("B", token, len(prompt_y), response), tokens(rng, K))
    assert indexed(spec).describe()["global"]["tokens"] == len(response)
    assert readable(spec, None, response)


@pytest.mark.parametrize("token", ["é", "\u2603" * 22, "\x00", "\ud800"])
def test_session_tokens_of_any_characters_are_just_wrong_tokens(token):
    rng, spec = random.Random(4), speculation()
    call(spec, full("A", tokens(rng, 20)), tokens(rng, K))
    with pytest.raises(SessionUnknown):
        spec.sessions.extend("A", token, 5, np.asarray([6], dtype=np.int64))
    assert not spec.sessions.close("A", token)
    assert spec.sessions.get("A") is not None
