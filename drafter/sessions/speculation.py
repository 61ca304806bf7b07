"""What a `/draft` call means beyond its tokens: the context a v2 call names through its session, how many of
the session's last drafts that context kept, where the draft comes from (drafter.sessions.draft_source: the
suffix index's lookup happens here, the one lookup a call makes), the k that `"auto"` picks, and, once
drafted, the session's new state and the feedback counted (drafter.sessions.tally: the figures `/info`
shows and their Prometheus counters).

`prepare` runs before the call is queued and changes nothing a reader sees; then exactly one of `finish`
(drafts in hand) or `abandon` (the call failed: the server stays as it was). The engine always receives the
whole context.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from drafter.draft_params import AUTO, DraftParams
from drafter.reporting import SpeculationMetrics
from drafter.sessions.batch_rows import BatchProbe, DraftingRuns, backlog, plan_together
from drafter.sessions.draft_length import PROBE_EVERY, Acceptance, DraftLengthPolicy, Load
from drafter.sessions.draft_source import (
    HYBRID,
    MODEL,
    SUFFIX,
    SuffixTrack,
    hindsight,
    scaled_probs,
    suffix_leads,
)
from drafter.sessions.suffix_drafts import NO_DRAFT, SuffixDrafts
from drafter.sessions.suffix_index import SuffixDraft
from drafter.sessions.table import Session, SessionTable, accepted_drafts
from drafter.sessions.tally import AcceptanceTally


@dataclass(slots=True)
class Call:
    params: DraftParams
    context: np.ndarray | list[int]  # the whole context; a list only for sessionless v1 calls
    session: Session | None  # the session as read before drafting; None if new or sessionless
    accepted: int | None  # of the session's last drafts; None if they were not verified by this call
    num_previous_drafts: int
    acceptance: Acceptance  # the estimate for model drafts after this call's feedback
    num_draft_tokens: int  # what the model drafts (after the head); 0 = no engine work, answer at once
    suffix_track: SuffixTrack = SuffixTrack()  # how the session's suffix drafts fared, after this feedback
    wanted: str = MODEL  # the source the call asked for (or the server's default)
    head: SuffixDraft = NO_DRAFT  # the suffix index's draft that leads this one (maybe all of it)
    lookup: SuffixDraft = NO_DRAFT  # what the suffix lookup found, sent or not
    hindsight: tuple[float, int] | None = None  # the session's last lookup judged (expected, matched)
    lookup_ms: float = 0.0  # the suffix lookup, for Server-Timing
    settled: bool = False  # finished or abandoned: a v2 call lets go of its session exactly once
    rows: int = 1  # the calls of its /draft/batch request: rows of one pass of the target
    expected: float = 1.0  # under "auto" in a batch: 1 + E[accepted] of the planned draft
    probe_plan: tuple[SuffixDraft, int] | None = None  # in a batch due for a probe: (head, k) with k >= 1
    backlog: int = 0  # in a batch: tokens a draft would prefill beyond its round's
    spread: float = 0.0  # of them, what a plan charges this round (over DraftingRuns' rounds)
    pass_drafts: int | None = None  # the drafts sent to all of them (None: this call's own)
    receive_ms: float = 0.0  # CPU time spent reading its body, for Server-Timing

    @property
    def engine_context(self) -> np.ndarray | list[int]:
        """What the model drafts after: the context, then the suffix head if there is one."""
        if not self.head.tokens:
            return self.context
        return np.concatenate((np.asarray(self.context, dtype=np.int64), self.head.tokens))

    @property
    def source(self) -> str:
        """Which source made this call's draft (as the answer says it)."""
        if not self.head.tokens:
            return SUFFIX if self.wanted == SUFFIX else MODEL
        return HYBRID if self.num_draft_tokens else SUFFIX

    @property
    def engine_len(self) -> int:
        """The context length the engine last drafted from for this session: 0 for a new or rebuilt one
        (a full-context call's cache is the engine's to find)."""
        if self.session is None or self.params.prefix_len is None:
            return 0
        return self.session.engine_len


class Speculation:
    def __init__(
        self,
        sessions: SessionTable,
        policy: DraftLengthPolicy,
        metrics: SpeculationMetrics,  # the HTTP face implements it (drafter/reporting.py)
        max_draft_tokens: int,
        max_seq_len: int,
        suffix: SuffixDrafts | None = None,  # None: suffix drafting is off
        default_source: str = MODEL,
        suffix_min_score: float = 0.0,
        # (session, context, last context's length, drafts kept, drafts sent): a call that verified its
        # session's drafts, so what the target emitted is known (online adaptation's buffer, or None)
        on_verified: Callable[[str, np.ndarray, int, int, int], None] | None = None,
    ):
        self.sessions, self.policy, self.metrics = sessions, policy, metrics
        self.max_seq_len, self.max_draft_tokens = max_seq_len, max_draft_tokens
        self.suffix, self.default_source = suffix, default_source
        self.suffix_min_score = suffix_min_score
        self.on_verified = on_verified
        self.acceptance = Acceptance()  # server-wide: where new sessions start
        # The wait before a probe where the last verified model draft left it: a new session starts there,
        # so many short conversations where drafting does not pay do not each pay for the early probes.
        self.probe_every = PROBE_EVERY
        self.batch_probe = BatchProbe()  # the rows of /draft/batch requests probe together
        self.drafting_runs = DraftingRuns()  # how long drafting goes on once started, by rows of the pass
        self.suffix_track = SuffixTrack()
        self.tally = AcceptanceTally(metrics, max_draft_tokens)
        metrics.sessions_live.set_function(lambda: len(self.sessions))

    def prepare(self, params: DraftParams, load: Load, rows: int | None = None) -> Call:
        """The call's context, feedback and plan; `rows`: the calls of its /draft/batch request (the load is
        what else the engine has, not those rows), None for a /draft call. A batch of one row is still a
        batch: a batching target's last row after the others ended, whose backlog a probe must weigh."""
        session, known_equal = None, 0
        if params.prefix_len is not None:
            new_tokens = params.tokens  # O(new tokens)
            # Or SessionUnknown, which the HTTP face answers with its 409 session_unknown.
            session, context = self.sessions.extend(
                params.session, params.session_token, params.prefix_len, new_tokens
            )
            known_equal = params.prefix_len
        elif params.session is not None:
            context = self.sessions.full_context(params.tokens)
            session = self.sessions.get(params.session)
        else:
            context = params.tokens
        accepted = None if session is None else accepted_drafts(session, context, known_equal)
        num_previous = 0 if session is None else len(session.drafts)
        acceptance = self.acceptance.fresh(self.probe_every) if session is None else session.acceptance
        track = self.suffix_track if session is None else session.suffix_track
        judged = None
        if accepted is not None:
            if session.in_flight <= (params.prefix_len is not None):  # this call alone: a round of the target
                gap_ms = (time.perf_counter() - session.answered) * 1e3
                self.policy.target.observe(session.pass_drafts, gap_ms, session.pass_rows)
            acceptance = self.model_feedback(session, accepted, acceptance)
            if session.suffix_draft is not None and session.suffix_draft.tokens:
                # The tokens after the last context: what the last suffix draft is checked against.
                truth = context[session.context_len : session.context_len + len(session.suffix_draft.tokens)]
                judged = hindsight(session.suffix_draft, truth.tolist())
                track = track.updated(*judged)
        room = self.max_seq_len - len(context)
        k = params.num_draft_tokens
        source = params.source or self.default_source
        call = Call(params, context, session, accepted, num_previous, acceptance, 0, track, source)
        call.hindsight, call.rows = judged, rows or 1
        # A suffix draft costs no decode steps: under "auto" it may run to the server's maximum.
        max_suffix = min(self.max_draft_tokens, room) if k == AUTO else k
        if source != MODEL:
            call.lookup, call.lookup_ms = self.look_up(params, context, max_suffix)
        if k == AUTO:  # the policy plans the whole draft: how much suffix leads, how many model drafts
            lead = call.lookup
            if source == HYBRID and lead.score < self.suffix_min_score:
                lead = NO_DRAFT
            probs = scaled_probs(lead, track)
            # In a batch the rows probe together (Speculation.together), never each at its own time.
            probe, model = (None if rows is None else False), source != SUFFIX
            if rows is not None:
                call.backlog = backlog(len(context), call.engine_len, num_previous)
                call.spread = call.backlog / self.drafting_runs.rounds(rows)
            plan = self.policy.plan(acceptance, load, room, probs, model, call.rows, probe, call.spread)
            length, call.num_draft_tokens = plan
            call.head = lead.cut(length)
            if rows is not None:
                call.expected = self.policy.expected_tokens(acceptance, probs, length, call.num_draft_tokens)
                if self.batch_probe.due:
                    length, k = self.policy.plan(
                        acceptance, load, room, probs, model, call.rows, True, call.spread
                    )
                    call.probe_plan = lead.cut(length), k
        elif source == SUFFIX:
            call.head = call.lookup
        else:
            call.num_draft_tokens = k
            if source == HYBRID and suffix_leads(call.lookup, track, acceptance.p, k, self.suffix_min_score):
                call.head = call.lookup
                call.num_draft_tokens = min(max(0, k - len(call.head.tokens)), room - len(call.head.tokens))
        return call

    def together(self, calls: list[Call], load: Load) -> None:
        """The rows of one /draft/batch request (prepared with `rows`): its `"auto"` rows draft as planned,
        none, or probe together (drafter.sessions.batch_rows). Rows at a fixed k draft as asked."""
        autos = [call for call in calls if call.params.num_draft_tokens == AUTO]  # a fixed k is the client's
        if autos:
            self.batch_probe = plan_together(autos, self.policy, self.batch_probe, load)

    def look_up(self, params: DraftParams, context, max_tokens: int) -> tuple[SuffixDraft, float]:
        """The suffix index's draft for this call's context, and what the lookup took (ms)."""
        started = time.perf_counter()
        # Only a v2 call proves it holds its session (its token); the store checks full-context calls.
        trusted = params.prefix_len is not None
        head = self.suffix.lookup(params.session, np.asarray(context), max_tokens, trusted)
        return head, (time.perf_counter() - started) * 1e3

    def model_feedback(self, session: Session, accepted: int, acceptance: Acceptance) -> Acceptance:
        """The model's estimate after the target kept `accepted` of the session's last drafts: the model's
        part was verified only if the whole suffix head before it was kept."""
        head_len, num_model = session.head_len, len(session.drafts) - session.head_len
        if num_model == 0:  # answered no model drafts: a round towards auto's probe
            if acceptance.rounds_drafting:  # and that answer ended a run of drafting rounds
                self.drafting_runs.ended(session.pass_rows, acceptance.rounds_drafting)
            return acceptance.updated(0, 0)
        if accepted >= head_len:
            acceptance = acceptance.updated(num_model, accepted - head_len)
            if session.pass_rows == 1:  # a batch's rows probe together: their own waits are not a session's
                self.probe_every = acceptance.probe_every
        return acceptance

    def finish(self, call: Call, drafts: list[int]) -> dict:
        """Store the session, note its context for the suffix index and count the feedback; the answer's
        extra fields. `drafts` starts with the call's suffix head (min_confidence may have cut it)."""
        params = call.params
        call.settled = True
        head_len = min(len(call.head.tokens), len(drafts))
        fields: dict = {
            "num_draft_tokens": len(call.head.tokens) + call.num_draft_tokens,
            "source": call.source,
        }
        if call.head.tokens:
            fields["suffix_tokens"] = head_len
        self.tally.answered(call.source)
        if call.accepted is not None:
            fields["accepted"] = call.accepted
            self.record(call.num_previous_drafts, call.accepted, call.session.head_len, call.hindsight)
            if self.on_verified is not None:  # before `commit`: a session buffer's room is rewritten later
                self.on_verified(
                    params.session,
                    call.context,
                    call.session.context_len,
                    call.accepted,
                    call.num_previous_drafts,
                )
        if params.session is not None:
            token = self.sessions.commit(
                params.session,
                call.session,
                params.prefix_len is None,
                call.context,
                drafts,
                call.acceptance,
                call.suffix_track,
                head_len,
                call.lookup,
                (call.rows, len(drafts) if call.pass_drafts is None else call.pass_drafts),
                len(call.context) if call.num_draft_tokens else call.engine_len,
            )
            fields["session_token"] = token
            if params.close:
                self.sessions.close(params.session, token)
            elif self.suffix is not None:
                self.index(call)
        return fields

    def index(self, call: Call) -> None:
        """Give the session's new context to the suffix index (indexed later, off this call's path), only as
        the session table committed it: a v2 call whose session was rebuilt while it drafted wrote nothing,
        and its context must not reach the index the new session reads. A rebuild (a full-context call)
        starts the session's indexing anew, as a first call: what it sent is a prompt, never a response.
        Only sessions that draft from the index pay for it."""
        name, rebuild = call.params.session, call.params.prefix_len is None
        stored = self.sessions.sessions.get(name)
        if stored is None or not (rebuild or stored is call.session):
            return
        if call.wanted == MODEL:
            if rebuild:
                self.suffix.drop(name)  # whatever an earlier session of this name had indexed
            return
        self.suffix.update(name, call.context, first_call=rebuild)

    def abandon(self, call: Call) -> None:
        if not call.settled and call.params.prefix_len is not None:
            self.sessions.release(call.session)
        call.settled = True

    def record(
        self, num_drafted: int, num_accepted: int, head_len: int = 0, judged: tuple[float, int] | None = None
    ) -> None:
        """Count a verified draft of `num_drafted` tokens (the first `head_len` from the suffix index) of which
        the target kept `num_accepted`; `judged`: the session's last suffix lookup in hindsight."""
        if judged is not None:
            self.suffix_track = self.suffix_track.updated(*judged)
        if num_drafted == 0:  # nothing was proposed, so nothing was verified
            return
        self.tally.record(num_drafted, num_accepted, head_len)
        if num_drafted > head_len and num_accepted >= head_len:
            self.acceptance = self.acceptance.updated(num_drafted - head_len, num_accepted - head_len)

    def describe(self) -> dict:
        return {
            **self.tally.describe(),
            "server_acceptance_estimate": round(self.acceptance.p, 4),
            "batch_drafting_runs": self.drafting_runs.describe(),  # rounds drafting went on, by rows
            "default_source": self.default_source,
            "suffix_min_score": self.suffix_min_score,
            "suffix_index": self.suffix.describe() if self.suffix is not None else None,
        }
