"""Probes across sessions, through the real session table and Speculation: where drafting does not pay, a
session answered 0 drafts probes after 8 calls, then waits twice as long after each probe; a new session
starts at the wait the server's last probe left, so many short conversations do not each pay for the
early probes."""

from __future__ import annotations

import numpy as np

from drafter.draft_params import AUTO, DraftParams
from drafter.server.metrics import Metrics
from drafter.sessions.draft_length import PROBE_EVERY, DraftCost, DraftLengthPolicy, Load
from drafter.sessions.draft_source import MODEL
from drafter.sessions.speculation import Speculation
from drafter.sessions.table import SessionTable

K = 4
IDLE = Load(queue_depth=0, running=0)


def conversation(spec: Speculation, name: str, calls: int) -> list[int]:
    """`calls` rounds of a target that keeps every draft; the number of drafts each call was answered."""
    context = list(range(1, 40))
    params = DraftParams(np.asarray(context, dtype=np.int64), AUTO, session=name, source=MODEL)
    call = spec.prepare(params, IDLE)
    answered = [call.num_draft_tokens]
    token = spec.finish(call, [7] * call.num_draft_tokens)["session_token"]
    for _ in range(calls - 1):
        prefix_len = len(context) + answered[-1]
        context += [7] * answered[-1] + [8]
        new = np.asarray([8], dtype=np.int64)
        call = spec.prepare(
            DraftParams(new, AUTO, session=name, prefix_len=prefix_len, session_token=token), IDLE
        )
        answered.append(call.num_draft_tokens)
        spec.finish(call, [7] * call.num_draft_tokens)
    return answered


def test_a_new_session_starts_at_the_probe_wait_the_last_probe_left():
    # A draft step costs 100 target steps: no acceptance pays for a draft, only probes draft.
    policy = DraftLengthPolicy(DraftCost(1.0, 100.0, 100.0), K, 1, 1, learn_target_cost=False)
    spec = Speculation(SessionTable(16, 600, 4096), policy, Metrics(1), K, 4096)
    first = conversation(spec, "first", 3 * PROBE_EVERY + 4)
    probes = [i for i, k in enumerate(first) if k]
    assert probes == [PROBE_EVERY, 3 * PROBE_EVERY + 1], first  # after 8 calls, then after 16
    # The second probe doubled the wait again (to 32): a new conversation's first probe comes after 32 calls.
    second = conversation(spec, "second", 4 * PROBE_EVERY + 2)
    assert [i for i, k in enumerate(second) if k] == [4 * PROBE_EVERY], second
