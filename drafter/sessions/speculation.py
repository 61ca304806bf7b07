"""What a `/draft` call means beyond its tokens: the context a v2 call names through its session, how many of
the session's last drafts that context kept, the k that `"auto"` picks, and, once drafted, the session's
new state and the acceptance tally (Prometheus counters and the figures `/info` shows).

`prepare` runs before the call is queued and changes nothing a reader sees; then exactly one of `finish`
(drafts in hand) or `abandon` (the call failed: the server stays as it was). The engine always receives the
whole context.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from drafter.server.errors import ApiError
from drafter.server.metrics import Metrics
from drafter.server.validation import AUTO, DraftParams
from drafter.sessions.draft_length import Acceptance, DraftLengthPolicy, Load
from drafter.sessions.table import Session, SessionTable, SessionUnknown, accepted_drafts


def session_unknown() -> ApiError:
    return ApiError(
        409,
        "session_unknown",
        "the server does not hold this session (never seen, expired, closed or restarted), the "
        "session_token does not match, or prefix_len is past its sequence: resend the whole context "
        "without prefix_len, with the same session name, to get a new session_token",
        "session",
    )


@dataclass(slots=True)
class Call:
    params: DraftParams
    context: np.ndarray | list[int]  # the whole context; a list only for sessionless v1 calls
    session: Session | None  # the session as read before drafting; None if new or sessionless
    accepted: int | None  # of the session's last drafts; None if they were not verified by this call
    num_previous_drafts: int
    acceptance: Acceptance  # the estimate after this call's feedback
    num_draft_tokens: int  # what to draft; 0 = answer at once without queueing
    settled: bool = False  # finished or abandoned: a v2 call lets go of its session exactly once
    receive_ms: float = 0.0  # CPU time spent reading its body, for Server-Timing


class Speculation:
    def __init__(
        self,
        sessions: SessionTable,
        policy: DraftLengthPolicy,
        metrics: Metrics,
        max_draft_tokens: int,
        max_seq_len: int,
    ):
        self.sessions, self.policy, self.metrics = sessions, policy, metrics
        self.max_seq_len = max_seq_len
        self.acceptance = Acceptance()  # server-wide: where new sessions start
        self.num_drafts = self.num_draft_tokens = self.num_accepted_tokens = 0
        # Python lists: at most max_draft_tokens entries, updated on every call, where numpy's per-call
        # overhead would cost more than the loop.
        self.drafted_per_pos = [0] * max_draft_tokens
        self.accepted_per_pos = [0] * max_draft_tokens
        # Every position shows in /metrics from the start; children looked up once, not per call.
        self.accepted_at = [metrics.spec_accepted_per_pos.labels(str(i)) for i in range(max_draft_tokens)]
        metrics.sessions_live.set_function(lambda: len(self.sessions))

    def prepare(self, params: DraftParams, load: Load) -> Call:
        session, known_equal = None, 0
        if params.prefix_len is not None:
            new_tokens = params.tokens  # O(new tokens)
            try:
                session, context = self.sessions.extend(
                    params.session, params.session_token, params.prefix_len, new_tokens
                )
            except SessionUnknown:
                raise session_unknown() from None
            known_equal = params.prefix_len
        elif params.session is not None:
            context = self.sessions.full_context(params.tokens)
            session = self.sessions.get(params.session)
        else:
            context = params.tokens
        accepted = None if session is None else accepted_drafts(session, context, known_equal)
        num_previous = 0 if session is None else len(session.drafts)
        acceptance = self.acceptance if session is None else session.acceptance
        if accepted is not None:
            acceptance = acceptance.updated(num_previous, accepted)
        k = params.num_draft_tokens
        if k == AUTO:
            k = self.policy.choose(acceptance, load, room=self.max_seq_len - len(context))
        return Call(params, context, session, accepted, num_previous, acceptance, k)

    def finish(self, call: Call, drafts: list[int]) -> dict:
        """Store the session and count the feedback; the answer's extra fields."""
        params = call.params
        call.settled = True
        fields: dict = {"num_draft_tokens": call.num_draft_tokens}
        if call.accepted is not None:
            fields["accepted"] = call.accepted
            self.record(call.num_previous_drafts, call.accepted)
        if params.session is not None:
            token = self.sessions.commit(
                params.session,
                call.session,
                params.prefix_len is None,
                call.context,
                drafts,
                call.acceptance,
            )
            fields["session_token"] = token
            if params.close:
                self.sessions.close(params.session, token)
        return fields

    def abandon(self, call: Call) -> None:
        if not call.settled and call.params.prefix_len is not None:
            self.sessions.release(call.session)
        call.settled = True

    def record(self, num_drafted: int, num_accepted: int) -> None:
        if num_drafted == 0:  # nothing was proposed, so nothing was verified
            return
        metrics = self.metrics
        self.num_drafts += 1
        self.num_draft_tokens += num_drafted
        self.num_accepted_tokens += num_accepted
        for position in range(num_drafted):
            self.drafted_per_pos[position] += 1
        for position in range(num_accepted):
            self.accepted_per_pos[position] += 1
        metrics.spec_drafts.inc()
        metrics.spec_draft_tokens.inc(num_drafted)
        metrics.spec_accepted_tokens.inc(num_accepted)
        for counter in self.accepted_at[:num_accepted]:
            counter.inc()
        self.acceptance = self.acceptance.updated(num_drafted, num_accepted)

    def describe(self) -> dict:
        drafted = self.drafted_per_pos
        per_position = [
            round(accepted / num, 4) if num else None
            for accepted, num in zip(self.accepted_per_pos, drafted, strict=True)
        ]
        return {
            "num_drafts": self.num_drafts,
            "num_draft_tokens": self.num_draft_tokens,
            "num_accepted_tokens": self.num_accepted_tokens,
            "mean_accepted_length": self.num_accepted_tokens / self.num_drafts if self.num_drafts else None,
            "acceptance_rate": (
                self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else None
            ),
            # P(accepted | the draft had this position), over verified drafts; null where none had it
            "acceptance_per_position": per_position,
            "num_drafted_per_position": list(drafted),
            "server_acceptance_estimate": round(self.acceptance.p, 4),
        }
