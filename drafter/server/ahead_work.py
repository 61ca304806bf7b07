"""The server's side of drafting ahead (drafter/sessions/ahead.py): before a session's call is queued, answer
it from a branch if one matches; after it is answered, plan its next round and hand the drafting to the
batcher as background work (it runs only on an idle engine and stops for any real request).

Ahead work switches off under load: a round is planned only when no request is queued and clients have
not overlapped lately (the batcher's contention signal, the same one that stops inline drafts), since on a
busy engine the branches would only delay real requests and be preempted anyway. It also switches off for
a session whose next call comes sooner than an ahead loop would finish (its gap between an answer and the
next call, against the engine's measured time per ahead step): the branches would never be ready, and the
call would wait for the loop's current step. A target faster than the drafter's loop, as on a CPU with
both on one machine, thus loses nothing to drafting ahead; a target verifying on a GPU gets its branches.
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
GAP_EWMA = 0.3  # weight of a session's newest gap between an answer and its next call


class AheadWork:
    def __init__(self, ahead: DraftAhead, batcher: Batcher, engine: Engine, sessions: SessionTable):
        self.ahead, self.batcher, self.engine, self.sessions = ahead, batcher, engine, sessions
        self.calls: dict[str, int] = {}  # session -> its calls so far: a plan made before the last is stale
        self.answered_at: dict[str, float] = {}  # session -> event-loop time its last call was answered
        self.gap_ms: dict[str, float] = {}  # session -> moving average of answer-to-next-call gaps

    def answer(self, call: Call) -> tuple[DraftResult | None, str]:
        """The call's drafts from a branch, or None; and hit, miss or none for Server-Timing."""
        name = call.params.session
        # Only a session in the table is tracked: its `forget` comes when it leaves. A name whose first call
        # fails (429, 504, client gone) never enters it, and must leave nothing behind.
        if call.session is not None:
            self.calls[name] = self.calls.get(name, 0) + 1
            answered = self.answered_at.get(name)
            if answered is not None:
                gap = (asyncio.get_running_loop().time() - answered) * 1e3
                old = self.gap_ms.get(name)
                self.gap_ms[name] = gap if old is None else old + GAP_EWMA * (gap - old)
        self.batcher.cancel_background(name)  # a plan not yet started is for a round now over
        drafts = call.session.drafts if call.session is not None else None
        k = 0 if call.head.tokens else call.num_draft_tokens  # a suffix head: not the model's alone
        context, version = np.asarray(call.context), self.engine.weights_version
        branch, had = self.ahead.match(name, drafts, context, call.accepted, k, version)
        if branch is None:
            self.engine.branch_ops.drop(name)
            return None, MISS if had else NONE
        self.engine.branch_ops.adopt(name, branch.sequence)
        return hit_result(branch, len(call.context), k), HIT

    def may_plan(self, call: Call) -> bool:
        """Whether a round after this call may be drafted ahead: a session's model draft on an idle server."""
        params, batcher = call.params, self.batcher
        if params.session is None or params.close or call.head.tokens or batcher.waiting:
            return False
        return asyncio.get_running_loop().time() >= batcher.inline_after  # else clients overlap: under load

    def wants_choices(self, call: Call) -> bool:
        """Whether the call's own loop should rank top choices (which a plan needs): asked as it is queued,
        so that a call with no round to draft ahead after it pays nothing for them."""
        return self.may_plan(call) and self.ready_in_time(call.params.session, call.num_draft_tokens + 1)

    def after(self, call: Call, result: DraftResult) -> None:
        """Plan the session's next round, once its answer is out (called soon after, on the loop)."""
        params, batcher = call.params, self.batcher
        session = self.sessions.sessions.get(params.session)
        if session is None:  # closed with this call, or gone since: nothing to track
            return
        self.answered_at[params.session] = asyncio.get_running_loop().time()
        self.ahead.verdict(params.session, call.accepted)  # on the last drafts: here, off the call's path
        if not call.head.tokens:  # the model's own drafts, as sent: the next call's verdict calibrates
            self.ahead.answered(params.session, result.probs[: len(session.drafts)])
        if not self.may_plan(call):
            return
        if not result.choices:  # not ranked: the session's calls come sooner than a loop would finish
            if not self.ready_in_time(params.session, call.num_draft_tokens + 1):
                self.ahead.too_slow()
            return
        fixed_k = params.num_draft_tokens if isinstance(params.num_draft_tokens, int) else None
        plan = self.ahead.plan(
            params.session, session.drafts, np.asarray(call.context), result, call.acceptance, fixed_k
        )
        if plan is None:
            return
        if not self.ready_in_time(params.session, plan.num_steps_needed):
            self.ahead.too_slow()
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

        self.ahead.posted()
        job = functools.partial(self.engine.draft_ahead, plan.session, plan.requests)
        batcher.run_in_background(plan.session, job, done)

    def ready_in_time(self, name: str, num_steps: int) -> bool:
        """Whether a loop of `num_steps` should finish before the session's next call, by what both took
        lately: not before the session's pace is known (its first call plans nothing), yes while no loop has
        measured the engine's step time yet."""
        step_ms, gap_ms = self.engine.ahead_step_ms, self.gap_ms.get(name)
        if gap_ms is None:
            return False
        return step_ms is None or num_steps * step_ms <= gap_ms

    def forget(self, name: str) -> None:
        """The session left the table."""
        self.calls.pop(name, None)
        self.answered_at.pop(name, None)
        self.gap_ms.pop(name, None)
        self.batcher.cancel_background(name)
        self.ahead.forget(name)
        self.engine.branch_ops.drop(name)
