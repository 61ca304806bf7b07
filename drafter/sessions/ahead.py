"""Drafting ahead: after answering a session's call, draft its likeliest next contexts while the target
verifies, and answer the next call from them with no engine work.

The target keeps `a` of the k drafts and adds one token `b` of its own, so the next context is the last one,
the first `a` drafts, then `b` (Speculative Speculative Decoding, Kumar et al. 2026; PEARL drafts only a = k).
With c_i the chance the target keeps draft i once it reaches it (the drafter's probability of that draft,
calibrated on the target's verdicts: drafter/sessions/calibration.py), P(a = j) = c_0 ... c_(j-1) (1 - c_j)
for j < k and c_0 ... c_(k-1) for a = k. Given a < k,
the target rejected draft j, so `b` is scored by the drafter's own probability of it renormalized without
the draft (its top choices at position j, which the decode loop keeps); given a = k, by its probability
after the last draft. The `budget` likeliest outcomes become branches (engine/ahead.py), each drafted to the
k the session's next call would ask: the same k for a fixed one, for `"auto"` the policy's choice after
that outcome's feedback on an idle server (a busier one asks fewer, which a branch still answers).

A call matches when it names the session, asks the model alone (no suffix head), its context is exactly a
planned outcome's and it asks no more drafts than its branch holds. Its drafts are then the branch's,
which the decode loop made from that very context: the same tokens a call drafted now would get. Any
other call of the session drops its branches. This module knows nothing of HTTP or of threads: the server
schedules the work (drafter/scheduling/batcher.py) and asks `match` before queueing a call.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from drafter.sessions.calibration import DraftCalibration
from drafter.sessions.draft_length import Acceptance, DraftLengthPolicy, Load
from engine.ahead import AheadBranch
from engine.requests import DraftRequest, DraftResult

IDLE = Load(queue_depth=0, running=0)


@dataclass(frozen=True, slots=True)
class Outcome:
    accepted: int  # a: drafts the target keeps
    bonus: int  # b: the token it adds
    likelihood: float
    depth: int  # drafts the branch makes


def outcomes(
    drafts: list[int],
    choices: list[list[tuple[int, float]]],  # per position 0..k: (id, probability), best first
    keeps: list[float],  # per draft: P(the target keeps it | it reaches it)
    budget: int,
    depth_for: Callable[[int, int], int],  # (a, context length) -> drafts the next call would ask
    context_len: int,
) -> list[Outcome]:
    """The `budget` likeliest (a, b) outcomes of a round that drafted `drafts`, likeliest first."""
    k = len(drafts)
    scored, reach = [], 1.0  # reach: P(the target gets to position a)
    for a in range(min(k, len(choices) - 1) + 1):
        if a < k:
            draft_prob = next((prob for token, prob in choices[a] if token == drafts[a]), 0.0)
            rest = max(1.0 - draft_prob, 1e-9)
            p_a = reach * (1.0 - keeps[a])
            scored += [(p_a * prob / rest, a, b) for b, prob in choices[a] if b != drafts[a]]
            reach *= keeps[a]
        else:
            scored += [(reach * prob, a, b) for b, prob in choices[a]]
    best = heapq.nlargest(budget, scored)
    planned = [Outcome(a, b, score, depth_for(a, context_len + a + 1)) for score, a, b in best]
    return [outcome for outcome in planned if outcome.depth > 0]


@dataclass(slots=True)
class Plan:
    """A session's branches, once drafted: valid while the session still holds the drafts it was made from."""

    session: str
    drafts: np.ndarray  # the session's drafts it was planned from (identity: the session's state then)
    context_len: int  # the last context's length
    outcomes: list[Outcome]
    requests: list[DraftRequest]
    branches: dict[tuple[int, int], tuple[Outcome, AheadBranch]] = field(default_factory=dict)
    num_steps: int = 0

    @property
    def num_steps_needed(self) -> int:
        """Decode steps of its loop: the deepest branch's drafts, and the step after them for its choices."""
        return max(r.num_draft_tokens for r in self.requests) + 1


@dataclass(slots=True)
class AheadStats:
    planned: int = 0  # plans posted to the engine
    drafted: int = 0  # plans whose branches wait for their session's next call
    preempted: int = 0  # plans a real request stopped, or that did not fit the cache
    stale: int = 0  # plans finished after their session moved on
    branches: int = 0  # branches drafted
    hits: int = 0
    misses: int = 0  # calls of a session with branches that matched none
    not_ready: int = 0  # session calls that found no branches (none planned, preempted, still running)
    # not planned: the session's calls come sooner than a loop would finish (or its pace is not known yet)
    too_slow: int = 0
    wasted_steps: int = 0  # decode steps of loops whose branches went unused
    hits_by_position: list[int] = field(default_factory=list)


class DraftAhead:
    def __init__(
        self,
        budget: int,
        policy: DraftLengthPolicy,
        max_seq_len: int,
        max_draft_tokens: int,
        metrics,
    ):
        self.budget, self.policy, self.metrics = budget, policy, metrics
        self.max_seq_len, self.max_draft_tokens = max_seq_len, max_draft_tokens
        self.plans: dict[str, Plan] = {}  # drafted, waiting for the session's next call
        self.stats = AheadStats(hits_by_position=[0] * (max_draft_tokens + 1))
        self.calibration = DraftCalibration()
        self.sent: dict[str, list[float]] = {}  # session -> the drafter's probabilities of its last drafts

    def answered(self, session: str, probs: list[float]) -> None:
        """A session's model drafts went out with these probabilities: its next call's verdict calibrates."""
        self.sent[session] = probs

    def verdict(self, session: str, accepted: int | None) -> None:
        """The session's next call: the target kept `accepted` of those drafts (None: not a verdict)."""
        probs = self.sent.pop(session, None)
        if probs and accepted is not None and accepted <= len(probs):
            self.calibration.record(probs, accepted)

    def plan(
        self,
        session: str,
        drafts_array: np.ndarray,
        context: np.ndarray,
        result: DraftResult,
        acceptance: Acceptance,
        fixed_k: int | None,
    ) -> Plan | None:
        """What to draft ahead after answering `drafts_array` (the session's stored drafts) to `context`;
        None if nothing is worth it."""
        drafts = drafts_array.tolist()
        if not drafts or not result.choices:
            return None

        def depth_for(accepted: int, new_len: int) -> int:
            room = self.max_seq_len - new_len
            if fixed_k is not None:
                return min(fixed_k, room)
            return self.policy.choose(acceptance.updated(len(drafts), accepted), IDLE, room)

        keeps = self.calibration.accept_probs(result.probs[: len(drafts)])
        planned = outcomes(drafts, result.choices, keeps, self.budget, depth_for, len(context))
        if not planned:
            return None
        requests = [
            DraftRequest(
                np.concatenate((context, drafts_array[: o.accepted], [o.bonus])), o.depth, choices=True
            )
            for o in planned
        ]
        return Plan(session, drafts_array, len(context), planned, requests)

    def posted(self) -> None:
        """A plan went to the engine."""
        self.stats.planned += 1

    def too_slow(self) -> None:
        self.stats.too_slow += 1
        self.metrics.ahead_plans.labels("too_slow").inc()

    def drafted(self, plan: Plan, branches: list[AheadBranch] | None, current: bool) -> bool:
        """The engine drafted `plan` (None: preempted or no room); keep it if `current` (its session has
        not moved on since). False: the engine's branches should be dropped."""
        if branches is None:
            self.stats.preempted += 1
            self.metrics.ahead_plans.labels("preempted").inc()
            return False
        plan.num_steps = branches[0].result.num_steps if branches else 0
        self.stats.branches += len(branches)
        self.metrics.ahead_branches.inc(len(branches))
        if not current:
            self.stats.stale += 1
            self.waste(plan)
            self.metrics.ahead_plans.labels("stale").inc()
            return False
        self.stats.drafted += 1
        self.metrics.ahead_plans.labels("drafted").inc()
        plan.branches = {
            (o.accepted, o.bonus): (o, branch) for o, branch in zip(plan.outcomes, branches, strict=True)
        }
        self.plans[plan.session] = plan
        return True

    def match(
        self,
        session: str,
        drafts,
        context: np.ndarray,
        accepted: int | None,
        num_draft_tokens: int,
        weights_version: int = 0,
    ) -> tuple[AheadBranch | None, bool]:
        """A session call's branch, or None; and whether the session had branches (to drop on a miss).
        A branch drafted by other weights than the engine's now (`weights_version`: a swap came between,
        docs/adaptation.md) is a miss: nothing drafted with one version is answered after a swap."""
        plan = self.plans.pop(session, None)
        if accepted is None:  # a new session or a rollback: nothing was verified, no outcome to meet
            if plan is not None:
                self.waste(plan)
            return None, plan is not None
        if plan is None:
            self.stats.not_ready += 1
            self.metrics.ahead_calls.labels("not_ready").inc()
            return None, False
        found = None
        if plan.drafts is drafts and len(context) == plan.context_len + accepted + 1 and num_draft_tokens > 0:
            found = plan.branches.get((accepted, int(context[-1])))
        stale = found is not None and found[1].result.weights_version != weights_version
        if found is None or stale or found[0].depth < num_draft_tokens:
            self.stats.misses += 1
            self.metrics.ahead_calls.labels("miss").inc()
            self.waste(plan)
            return None, True
        self.stats.hits += 1
        self.stats.hits_by_position[accepted] += 1
        self.metrics.ahead_calls.labels("hit").inc()
        self.metrics.ahead_hits_at[accepted].inc()
        return found[1], True

    def waste(self, plan: Plan) -> None:
        self.stats.wasted_steps += plan.num_steps
        self.metrics.ahead_wasted_steps.inc(plan.num_steps)

    def forget(self, session: str) -> None:
        """The session left the table."""
        self.plans.pop(session, None)
        self.sent.pop(session, None)

    def describe(self) -> dict:
        s = self.stats
        calls = s.hits + s.misses + s.not_ready
        return {
            "branches_per_session": self.budget,
            "hit_rate": round(s.hits / calls, 4) if calls else None,
            "hits": s.hits,
            "misses": s.misses,
            "not_ready": s.not_ready,
            "hits_by_accepted": list(s.hits_by_position),
            "plans": s.planned,
            "drafted": s.drafted,
            "preempted": s.preempted,
            "too_slow": s.too_slow,
            "stale": s.stale,
            "branches_drafted": s.branches,
            "wasted_steps": s.wasted_steps,
            "sessions_with_branches": len(self.plans),
            "calibration": self.calibration.describe(),
        }


def hit_result(branch: AheadBranch, context_len: int, num_draft_tokens: int) -> DraftResult:
    """A call answered from `branch`: its first `num_draft_tokens` drafts, no engine time spent now."""
    drafted = branch.result
    return DraftResult(
        tokens=drafted.tokens[:num_draft_tokens],
        probs=drafted.probs[:num_draft_tokens],
        cached=context_len,
        prefilled=0,
        evicted=False,
        prefill_ms=0.0,
        decode_ms=0.0,
        num_steps=0,
        choices=drafted.choices[: num_draft_tokens + 1],
        weights_version=drafted.weights_version,
    )
