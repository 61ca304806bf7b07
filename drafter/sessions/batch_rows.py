"""Rows of one /draft/batch request share one pass: a target that batches its requests (vLLM) verifies all
their drafts in one pass and waits for all of our drafts before it, so one row's drafts cost every row.

Its n rows yield n tokens a plain step; each `"auto"` row plans its draft against its share of the pass and
of our batch (DraftLengthPolicy.plan with `rows`), the right share when every row drafts. When only some
do, the pass still waits for a whole batch of ours, so the rows keep their drafts only if together they
beat the same rows without drafts (`pays_together`). Weighed as if alone, each row compared its drafts with
a whole plain step, and a batch of 4-8 rows drafted at 0.5-0.65x the speed of no speculation.

Rows answered none probe together (`BatchProbe`): one draft batch of ours, where each row's own probe, due
at its own time, made nearly every pass wait for one. And only where drafts all kept could pay, their rows'
whole backlog paid in that one pass: where even they would not (our batch too slow next to the target's
pass, as on a CPU), a probe could only cost.

A backlog (`backlog`) is paid once and repaid only while drafting goes on: a plan spreads it over the
rounds that rows of passes that size drafted for once started, lately (`DraftingRuns`); a probe, which may
bring no drafting back, pays it all. Spread over a fixed 16 rounds, under vLLM on the real pair, probes and
starts each prefilled their rows' prompts and all since (4.7 s and 1.9 s batches of ours in a 38 s run of
4 rows, one of 8.9 s in a 57 s run of 8), drafting stopped within two passes after each, and the target ran
at 0.73-0.82x of no speculation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from drafter.sessions.draft_length import MAX_PROBE_EVERY, PROBE_EVERY, DraftLengthPolicy, Load
from drafter.sessions.suffix_drafts import NO_DRAFT

LONE_RUN = 16.0  # rounds a lone row's start is expected to draft for, before any run of one row ended
RUN_WEIGHT = 0.25  # of each ended run in the estimate


class DraftingRuns:
    """How many rounds in a row batch rows drafted, once started, by the rows of the pass where the run ended:
    a decayed mean of ended runs (runs still going end later, or never: a lone row drafting to its end keeps
    its size's estimate). Before a run at a size ended, LONE_RUN / rows: rows draft together only while the
    plan pays for all of them, and each row that ends, arrives or changes its acceptance can stop it; on the
    real pair under vLLM a start at 7 rows (each row's prompt and 30 passes since: 11.8 s of our batch) drew
    5 passes of drafting and cost the run a third of its speed, before any run at that size had ended."""

    def __init__(self):
        self.by_rows: dict[int, float] = {}

    def ended(self, rows: int, rounds: int) -> None:
        mean = self.by_rows.get(rows, LONE_RUN / rows)
        self.by_rows[rows] = mean + RUN_WEIGHT * (min(rounds, LONE_RUN) - mean)

    def rounds(self, rows: int) -> float:
        return max(1.0, self.by_rows.get(rows, LONE_RUN / max(rows, 1)))

    def describe(self) -> dict:
        return {str(rows): round(mean, 2) for rows, mean in sorted(self.by_rows.items())}


@dataclass(frozen=True, slots=True)
class RowDraft:
    """One row's planned draft, as `pays_together` weighs it."""

    expected: float  # 1 + E[accepted]: the target's tokens from this row's round
    verified: int  # the drafts the target verifies (a suffix lead and model drafts)
    model: int  # of them, model drafts: the steps our batch runs
    backlog: float = 0.0  # tokens it would prefill beyond its round's, charged to this round (`backlog`)


@dataclass(frozen=True, slots=True)
class BatchProbe:
    """Passes of a batching target answered no drafts, and how many before all its rows draft at once."""

    passes: int = 0
    wait: int = PROBE_EVERY

    @property
    def due(self) -> bool:
        return self.passes >= self.wait

    def drafted(self) -> BatchProbe:
        return BatchProbe()

    def waited(self) -> BatchProbe:
        return replace(self, passes=self.passes + 1)

    def probed(self) -> BatchProbe:  # the next probe waits twice as long, unless drafting comes back
        return BatchProbe(0, min(2 * self.wait, MAX_PROBE_EVERY))


def backlog(context_len: int, engine_len: int, num_previous_drafts: int) -> int:
    """The tokens a row's draft would prefill beyond what a row drafting every round brings (its last drafts
    and the target's token): a row that answered none for a while, or a new request's prompt, makes our
    batch prefill everything since (on a CPU, 13-26 ms a token for the real pair's drafter: a whole prompt or
    a probe after 8 passes of 8 rows took seconds, and a loaded vLLM ran at 0.64-0.87x without drafting more
    than a few rows). Paid once, it is worth it only if drafting goes on."""
    return max(0, context_len - engine_len - 1 - num_previous_drafts)


def pays_together(policy: DraftLengthPolicy, rows: Sequence[RowDraft], load: Load) -> bool:
    """Whether the drafts planned for the rows of one pass make it faster than the same rows without drafts
    (False when none is planned)."""
    if not any(row.verified for row in rows):
        return False
    n = len(rows)
    longest, drafting = max(row.model for row in rows), sum(row.model > 0 for row in rows)
    pass_ms = sum(float(policy.target.round_ms(row.verified, n)) for row in rows)
    draft_ms = float(policy.draft_ms(longest, load, drafting))
    draft_ms += policy.prefill_token_ms(drafting) * sum(row.backlog for row in rows if row.model)
    drafted = sum(row.expected for row in rows) / (pass_ms + draft_ms)
    return drafted > 1.0 / float(policy.target.round_ms(0, n))


def plan_together(calls: list, policy: DraftLengthPolicy, probe: BatchProbe, load: Load) -> BatchProbe:
    """The `"auto"` calls of one pass (drafter.sessions.speculation.Call, each prepared with `rows`) keep the
    drafts each planned, answer none, or probe together; the batch's probe state after."""
    rows = [
        RowDraft(
            call.expected,
            len(call.head.tokens) + call.num_draft_tokens,
            call.num_draft_tokens,
            call.spread,
        )
        for call in calls
    ]
    if pays_together(policy, rows, load):
        return probe.drafted()
    k = policy.max_draft_tokens
    sure = [RowDraft(1.0 + k, k, k, call.backlog) for call in calls]
    probing = probe.due and pays_together(policy, sure, load)
    for call in calls:
        if probing and call.probe_plan is not None:
            call.head, call.num_draft_tokens = call.probe_plan
        else:
            call.head, call.num_draft_tokens = NO_DRAFT, 0
    return probe.probed() if probing else probe.waited()
