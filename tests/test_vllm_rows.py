"""vLLM's batch rows to drafter sessions, by their tokens: a request keeps its session while it grows, when
it moves to another row and when identical prompts run side by side; a finished request's session is given
back to close after `max_idle_steps`; and the proposer's settings come from vLLM's config, else the
environment."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import numpy as np
import pytest

from drafter.integrations.vllm_proposer import ProposerSettings
from drafter.integrations.vllm_rows import RowSessions, Tracked


def rows_with_counter(max_idle_steps: int = 2) -> RowSessions[int]:
    counter = itertools.count()
    return RowSessions(lambda: next(counter), max_idle_steps)


def assign(rows: RowSessions, contexts: dict[int, list[int]]) -> tuple[dict[int, int], list[int]]:
    """row -> session, and the sessions given back, checking each row's list and known length on the way."""
    previous = {id(t): list(t.tokens) for t in rows.tracked}
    taken, gone = rows.assign({row: np.array(c, dtype=np.int32) for row, c in contexts.items()})
    for row, tracked in taken.items():
        assert tracked.tokens == contexts[row] and all(type(t) is int for t in tracked.tokens)
        before = previous.get(id(tracked), [])
        assert tracked.known_len == len(before) and contexts[row][: len(before)] == before
    return {row: tracked.session for row, tracked in taken.items()}, gone


def test_fits_only_true_prefixes():
    def fits(context, earlier):
        tracked = Tracked(0, 0)
        tracked.take(np.array(earlier), 0)
        return tracked.fits(np.array(context))

    assert fits([1, 2, 3], [1, 2])
    assert fits([1, 2], [1, 2])
    assert not fits([1, 2], [1, 2, 3])
    assert not fits([1, 9, 3], [1, 2, 3])
    assert not fits([1, 2, 3], [])


def test_rows_a_growing_request_keeps_its_session():
    rows = rows_with_counter()
    first, gone = assign(rows, {0: [1, 2, 3], 1: [7, 8]})
    second, _ = assign(rows, {0: [1, 2, 3, 4, 5], 1: [7, 8, 9]})
    assert first == second and gone == [] and len(rows) == 2


def test_rows_moved_requests_follow_their_tokens():
    rows = rows_with_counter()
    first, _ = assign(rows, {0: [1, 2], 1: [3, 4], 2: [5, 6]})
    # the request in row 0 finished; vLLM moved the last row into its place
    second, _ = assign(rows, {0: [5, 6, 7], 1: [3, 4, 9]})
    assert second == {0: first[2], 1: first[1]}


def test_rows_identical_prompts_get_distinct_sessions():
    rows = rows_with_counter()
    first, _ = assign(rows, {0: [1, 2], 1: [1, 2]})
    assert first[0] != first[1]
    second, _ = assign(rows, {0: [1, 2, 5], 1: [1, 2, 5]})
    assert second == first  # each keeps its own, though either would fit


def test_rows_a_new_request_gets_a_new_session_and_a_rollback_is_a_new_request():
    rows = rows_with_counter()
    first, _ = assign(rows, {0: [1, 2, 3]})
    second, _ = assign(rows, {0: [1, 2, 4]})  # not an extension: another request
    assert second[0] != first[0]


def test_rows_a_later_turn_continues_the_earlier_conversation():
    rows = rows_with_counter()
    first, _ = assign(rows, {0: [1, 2, 3, 4]})
    assign(rows, {})
    later, _ = assign(rows, {3: [1, 2, 3, 4, 5, 6, 7]})  # a new request whose prompt holds the old context
    assert later[3] == first[0]


def test_rows_finished_requests_are_given_back_after_max_idle_steps():
    rows = rows_with_counter(max_idle_steps=2)
    first, _ = assign(rows, {0: [1, 2], 1: [3, 4]})
    assert assign(rows, {0: [1, 2, 5]})[1] == []
    assert assign(rows, {0: [1, 2, 5, 6]})[1] == []
    _, gone = assign(rows, {0: [1, 2, 5, 6, 7]})
    assert gone == [first[1]] and len(rows) == 1
    assert rows.clear() == [first[0]] and len(rows) == 0


def test_rows_refuse_a_negative_idle_limit():
    with pytest.raises(ValueError, match="max_idle_steps"):
        RowSessions(lambda: 0, -1)


def vllm_config(additional_config=None):
    return SimpleNamespace(additional_config=additional_config if additional_config is not None else {})


def test_settings_vllm_config_wins_over_the_environment():
    environ = {"DRAFTER_URL": "http://env:1", "DRAFTER_API_KEY": "env-key", "DRAFTER_TIMEOUT_S": "0.25"}
    settings = ProposerSettings.from_vllm(vllm_config({"drafter": {"url": "unix:/tmp/d.sock"}}), environ)
    assert settings == ProposerSettings(url="unix:/tmp/d.sock", api_key="env-key", timeout_s=0.25)


def test_settings_num_draft_tokens_from_the_environment():
    assert (
        ProposerSettings.from_vllm(vllm_config(), {"DRAFTER_NUM_DRAFT_TOKENS": "auto"}).num_draft_tokens
        == "auto"
    )
    assert ProposerSettings.from_vllm(vllm_config(), {"DRAFTER_NUM_DRAFT_TOKENS": "3"}).num_draft_tokens == 3


def test_settings_default_without_config_or_environment():
    assert ProposerSettings.from_vllm(vllm_config(), {}) == ProposerSettings()
    assert ProposerSettings.from_vllm(SimpleNamespace(), {}).url == "http://127.0.0.1:8000"


@pytest.mark.parametrize(
    "drafter, message",
    [
        ({"urll": "http://x"}, "unknown additional_config"),
        ({"timeout_s": 0}, "timeout_s must be a positive number"),
        ({"timeout_s": "soon"}, "timeout_s must be a positive number"),
        ({"url": ""}, "url must be a non-empty string"),
        ({"timeout_s": True}, "timeout_s must be a positive number"),
        ({"num_draft_tokens": 0}, "num_draft_tokens must be a positive integer"),
        ({"num_draft_tokens": "many"}, "num_draft_tokens must be a positive integer"),
    ],
)
def test_settings_refuse_wrong_values_by_name(drafter, message):
    with pytest.raises(ValueError, match=message):
        ProposerSettings.from_vllm(vllm_config({"drafter": drafter}), {})
