"""Nothing drafted with one weights version is answered after a swap: a session's branches drafted ahead
before `Engine.swap_weights` are a miss afterwards (drafter/sessions/ahead.py), though their outcome is the
one the target chose, and the call is drafted anew by the new weights."""

from __future__ import annotations

import numpy as np
import torch

from drafter.server.metrics import Metrics
from drafter.sessions.ahead import DraftAhead
from drafter.sessions.draft_length import Acceptance, DraftCost, DraftLengthPolicy
from engine.config import EngineConfig
from engine.engine import Engine
from engine.model.presets import preset_state_dict
from engine.requests import DraftRequest
from export.versions import served_tensors

K = 4


def planned_round(engine: Engine, ahead: DraftAhead, context: np.ndarray):
    """A session's call answered with choices, its next round drafted ahead: (drafts, the likeliest
    outcome's context, that branch's drafts)."""
    result = engine.draft_batch([DraftRequest(context, K, "s", choices=True)])[0]
    drafts = np.asarray(result.tokens, dtype=np.int64)
    plan = ahead.plan("s", drafts, context, result, Acceptance(), fixed_k=K)
    branches = engine.draft_ahead("s", plan.requests)
    assert ahead.drafted(plan, branches, current=True)
    outcome, branch = next(iter(plan.branches.values()))
    next_context = np.concatenate((context, drafts[: outcome.accepted], [outcome.bonus]))
    return drafts, outcome.accepted, next_context, branch.result.tokens


def test_branches_drafted_before_a_swap_are_never_answered_after_it():
    engine = Engine.load(
        "tiny", EngineConfig(max_seq_len=256, max_batch_size=4, max_draft_tokens=8, top_choices=3)
    )
    metrics = Metrics(4)
    metrics.add_ahead(8)
    policy = DraftLengthPolicy(DraftCost(20.0, 1.0, 1.0), 8, max_batch_size=4, max_queue_depth=4)
    ahead = DraftAhead(4, policy, 256, 8, metrics)
    context = np.arange(3, 40, dtype=np.int64)

    drafts, accepted, next_context, branch_drafts = planned_round(engine, ahead, context)
    found, had = ahead.match("s", drafts, next_context, accepted, K, engine.weights_version)
    assert had and found is not None and found.result.tokens == branch_drafts  # no swap: a hit

    drafts, accepted, next_context, branch_drafts = planned_round(engine, ahead, context)
    generator = torch.Generator().manual_seed(3)
    state = {
        n: t.float() + torch.randn(t.shape, generator=generator) * 0.05
        for n, t in preset_state_dict("tiny").items()
    }
    engine.swap_weights(
        served_tensors(state, "none", torch.float32, engine.loaded.config.tie_word_embeddings)
    )
    found, had = ahead.match("s", drafts, next_context, accepted, K, engine.weights_version)
    assert had and found is None and ahead.stats.misses == 1
    assert engine.draft(next_context, K, session="s") != branch_drafts  # what the branch would have answered
