"""The server's side of drafting ahead (drafter/sessions/ahead.py): before a session's call is queued, answer
it from a branch if one matches; after it is answered, plan its next round and hand the drafting to the
batcher as background work (it runs only on an idle engine and stops for any real request).

Ahead work switches off under load: a round is planned only when no request is queued and clients have
not overlapped lately (the batcher's contention signal, the same one that stops inline drafts), since on a
busy engine the branches would only delay real requests and be preempted anyway.
"""

from __future__ import annotations

import asyncio
import functools
import logging

import numpy as np

from drafter.scheduling.batcher import Batcher
from drafter.sessions.ahead import DraftAhead, hit_result
from drafter.sessions.speculation import Call
from drafter.sessions.table import SessionTable
from engine.engine import Engine
from engine.requests import DraftResult

log = logging.getLogger(__name__)

HIT, MISS, NONE = "hit", "miss", "none"


class AheadWork:
    def __init__(self, ahead: DraftAhead, batcher: Batcher, engine: Engine, sessions: SessionTable):
        self.ahead, self.batcher, self.engine, self.sessions = ahead, batcher, engine, sessions
        self.calls: dict[str, int] = {}  # session -> its calls so far: a plan made before the last is stale

    def answer(self, call: Call) -> tuple[DraftResult | None, str]:
        """The call's drafts from a branch, or None; and hit, miss or none for Server-Timing."""
        name = call.params.session
        self.calls[name] = self.calls.get(name, 0) + 1
        self.batcher.cancel_background(name)  # a plan not yet started is for a round now over
        drafts = call.session.drafts if call.session is not None else None
        k = 0 if call.head.tokens else call.num_draft_tokens  # a suffix head: not the model's alone
        branch, had = self.ahead.match(name, drafts, np.asarray(call.context), call.accepted, k)
        if branch is None:
            self.engine.branch_ops.drop(name)
            return None, MISS if had else NONE
        self.engine.branch_ops.adopt(name, branch.sequence)
        return hit_result(branch, len(call.context), k), HIT

    def after(self, call: Call, result: DraftResult) -> None:
        """Plan the session's next round, once its answer is out (called soon after, on the loop)."""
        params, batcher = call.params, self.batcher
        if params.close or call.head.tokens or not result.choices or batcher.waiting:
            return
        if asyncio.get_running_loop().time() < batcher.inline_after:  # clients overlap: under load
            return
        session = self.sessions.sessions.get(params.session)
        if session is None:
            return
        fixed_k = params.num_draft_tokens if isinstance(params.num_draft_tokens, int) else None
        plan = self.ahead.plan(
            params.session, session.drafts, np.asarray(call.context), result, call.acceptance, fixed_k
        )
        if plan is None:
            return
        calls = self.calls.get(params.session)

        def done(branches, error: BaseException | None) -> None:
            if error is not None:
                log.error("drafting ahead failed: %s", error)
                branches = None
            current = (
                self.calls.get(plan.session) == calls and self.sessions.sessions.get(plan.session) is session
            )
            if not self.ahead.drafted(plan, branches, current) and branches is not None:
                self.engine.branch_ops.drop(plan.session)

        job = functools.partial(self.engine.draft_ahead, plan.session, plan.requests)
        batcher.run_in_background(plan.session, job, done)

    def forget(self, name: str) -> None:
        """The session left the table."""
        self.calls.pop(name, None)
        self.batcher.cancel_background(name)
        self.ahead.forget(name)
        self.engine.branch_ops.drop(name)
