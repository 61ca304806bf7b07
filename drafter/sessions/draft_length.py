"""The draft-length policy behind `"num_draft_tokens": "auto"`: an acceptance estimate per session, and the
draft (k model drafts, after a suffix lead of L tokens where the call's source allows one) that maximizes
the target's tokens per unit of time under the server's current load.

Why this objective: one speculative round costs the target one verify pass of the L + k drafts and its own
token (`round_ms(L + k)`, drafter.sessions.target_cost: learned from the gaps between a session's calls,
told by `--target-verify-ms` and `--target-verify-ms-per-token` until then) plus the wait for our draft
(`draft_base_ms + steps(k) * step_ms`, measured at startup and refined by every batch; nothing when k = 0,
since the answer skips the engine), and yields `1 + E[accepted]` tokens. With a per-token acceptance p,
a model draft's `E[accepted | k] = p + p^2 + ... + p^k`; a suffix lead's tokens carry the index's own
chances, and the model's drafts after it count only if the whole lead is kept. Leviathan et al.'s speedup
analysis maximizes exactly this ratio. L = k = 0 is a plain decode step. A verified token's cost is ~0
where the target's verify is memory-bound (a GPU verifying a few tokens reads its weights once, however
many); on a CPU it is compute, a sizeable part of a step, and without it the policy drafts long where
short drafts or none are faster. `steps(k)` is the engine's own count (engine/tiers.py): k eagerly, k + 1 on
compiled paths, and under CUDA graphs the smallest captured tier >= k plus one, so k = 5 costs what k = 8
does and the policy drafts 8 instead.

Why one p and not one per position: a draft stops at its first rejection, so a per-position estimate never
sees positions past it; after acceptance drops, the deep positions would keep their old optimism and hold k
long for dozens of rounds. One p (the censored-geometric estimate: accepted / (accepted + rejections), over
exponentially decayed counts) learns from every round at every length and follows a change in ~4-6 rounds.
Per-position acceptance is still counted, for /info and /metrics (drafter.sessions.speculation).

Why load shrinks k: on a busy engine a decode step of this request is a step every queued or batched
request waits through, so a draft token's marginal cost is its step time times (1 + load / max batch).
The steeper cost moves the optimum to shorter drafts; past `max_queue_depth` waiting requests the policy
answers 0 drafts at once, which is never slower for the target than waiting in the queue.

Why rows share: a target that batches its requests verifies all their drafts in one pass, so each row of a
/draft/batch request plans against its share of the pass and of our batch (`rows`; what a batch of that
size costs lately: drafter.sessions.batch_cost); the rows then draft, or not, together
(drafter.sessions.batch_rows).

Why 0 drafts, and probes: where drafting costs more than the accepted tokens save (low acceptance, or a
draft step that is not cheap next to a verify pass, as on a CPU), the policy answers 0 drafts and the
target decodes as it would alone: speculation must never make it slower. A session answered 0 drafts
teaches the estimate nothing (nor does one whose suffix lead filled the draft), so after PROBE_EVERY such
calls in a row the next one drafts at the best k >= 1, shortening a suffix lead to make room (a probe):
if acceptance has risen, the session drafts again. A probe that changes nothing doubles the wait before
the next (up to MAX_PROBE_EVERY calls; a new session starts at the wait the server's last verified draft
left: drafter.sessions.speculation), so a session where speculation never pays pays for few probes: on the
real pair's CPU costs a probe costs ~0.85 of a plain step more, ~1.3% of the time spent at MAX_PROBE_EVERY. This module knows nothing of HTTP or sessions.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from drafter.sessions.batch_cost import BatchCosts
from drafter.sessions.target_cost import TargetCost

PRIOR_ACCEPTANCE = 0.7  # a fresh server's guess, before any feedback arrives
PRIOR_WEIGHT = 2.0  # worth two rounds of evidence: the first real rounds outweigh it at once
STEP_WEIGHT = 0.05  # of each batch's decode ms per step in the running step cost
DECAY = 0.5  # per round: evidence halves each round, so a change in acceptance shows within ~4-6 rounds
PROBE_EVERY = 8  # calls answered 0 drafts (by acceptance) before a session's next call drafts to learn
MAX_PROBE_EVERY = 64  # the wait doubles after each probe that did not bring drafting back, up to this


@dataclass(frozen=True, slots=True)
class Acceptance:
    """Decayed counts of accepted drafts and of rejections (a draft cut short by the target)."""

    accepted: float = PRIOR_ACCEPTANCE * PRIOR_WEIGHT
    rejected: float = (1 - PRIOR_ACCEPTANCE) * PRIOR_WEIGHT
    rounds_without_drafts: int = 0  # calls in a row answered 0 model drafts since the last verified one
    probe_every: int = PROBE_EVERY  # such calls before the next probe
    rounds_drafting: int = 0  # verified model drafts in a row, up to the last call

    @property
    def p(self) -> float:
        return self.accepted / (self.accepted + self.rejected)

    def fresh(self, probe_every: int) -> Acceptance:
        """Where a new session starts: this estimate, no rounds counted yet, the given wait for a probe."""
        return replace(self, rounds_without_drafts=0, probe_every=probe_every, rounds_drafting=0)

    def updated(self, num_drafted: int, num_accepted: int) -> Acceptance:
        if num_drafted == 0:  # nothing proposed, nothing learned: one more round towards a probe
            return replace(self, rounds_without_drafts=self.rounds_without_drafts + 1, rounds_drafting=0)
        rejected = 1.0 if num_accepted < num_drafted else 0.0
        # Drafts after a wait were a probe: the next wait is twice as long; drafting resumed resets it.
        probed = self.rounds_without_drafts >= self.probe_every
        wait = min(2 * self.probe_every, MAX_PROBE_EVERY) if probed else PROBE_EVERY
        return Acceptance(
            DECAY * self.accepted + num_accepted,
            DECAY * self.rejected + rejected,
            0,
            wait,
            self.rounds_drafting + 1,
        )


class DraftLengthConfigError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class DraftCost:
    """What one call costs the target, in ms; the draft part measured on this server at startup."""

    target_verify_ms: float  # one target step: a verify pass of one token (a plain decode step)
    draft_base_ms: float  # a draft call's fixed cost (prefill of the new tokens, loop set-up, host work)
    step_ms: float  # one decode step
    target_token_ms: float = 0.0  # what each more token verified adds to the target's pass
    prefill_token_ms: float = 0.0  # one more uncached context token, measured at startup (0: not known)

    def __post_init__(self):
        if not self.target_verify_ms > 0:
            raise DraftLengthConfigError(f"target_verify_ms must be positive, got {self.target_verify_ms}")
        if not self.target_token_ms >= 0:
            raise DraftLengthConfigError(f"target_token_ms must be >= 0, got {self.target_token_ms}")
        if self.draft_base_ms < 0 or self.step_ms < 0:
            raise DraftLengthConfigError("measured draft costs must not be negative")


@dataclass(frozen=True, slots=True)
class Load:
    queue_depth: int  # requests waiting for the engine
    running: int  # requests in the batch on the engine now


class DraftLengthPolicy:
    def __init__(
        self,
        cost: DraftCost,
        max_draft_tokens: int,
        max_batch_size: int,
        max_queue_depth: int,
        decode_steps: Callable[[int], int] = lambda k: k,  # steps the engine's loop runs for k drafts
        learn_target_cost: bool = True,  # from the gaps between a session's calls; else the told costs stand
    ):
        if max_queue_depth < 0:
            raise DraftLengthConfigError(f"auto max queue depth must be >= 0, got {max_queue_depth}")
        self.cost, self.max_draft_tokens = cost, max_draft_tokens
        self.max_batch_size, self.max_queue_depth = max_batch_size, max_queue_depth
        self.step_ms = cost.step_ms  # refined by every batch: a startup measure on a busy host is noisy
        self.batches = BatchCosts()  # what the rows of one /draft/batch request wait for, drafting together
        # The target's round, told by the flags until the gaps between a session's calls say otherwise.
        self.target = TargetCost(
            cost.target_verify_ms, cost.target_token_ms, max_draft_tokens, learn_target_cost
        )
        self.steps = np.array([decode_steps(k) for k in range(1, max_draft_tokens + 1)], dtype=np.float64)

    def observe(
        self,
        decode_ms: float,
        num_steps: int,
        rows: int = 1,
        engine_ms: float | None = None,
        prefill_ms: float = 0.0,
        prefilled: int = 0,
    ) -> None:
        """A batch of `rows` calls took engine_ms in all: its prefill of `prefilled` tokens prefill_ms, its
        decode loop decode_ms for num_steps steps."""
        if num_steps <= 0:
            return
        step_ms = decode_ms / num_steps
        self.step_ms += STEP_WEIGHT * (step_ms - self.step_ms)
        if engine_ms is not None:
            self.batches.observe(rows, engine_ms, decode_ms, step_ms, prefill_ms, prefilled)

    def choose(self, acceptance: Acceptance, load: Load, room: int) -> int:
        """k in [0, min(max_draft_tokens, room)]: 0 under load, with no room left, or where no k >= 1 beats
        a plain decode step (then a probe every PROBE_EVERY + 1 calls)."""
        return self.plan(acceptance, load, room)[1]

    def plan(
        self,
        acceptance: Acceptance,
        load: Load,
        room: int,
        head_probs: Sequence[float] = (),
        model: bool = True,
        rows: int = 1,
        probe: bool | None = None,
        backlog: float = 0.0,
    ) -> tuple[int, int]:
        """(L, k): lead with the first L tokens of a suffix draft (head_probs: the chance that each of its
        tokens is reached, as the session's track scales the index's counts), then k model drafts; the pair
        with the most target tokens per ms, L + k within the server's maximum and the room left. (0, 0) is a
        plain decode step. Without `model` (a suffix-only call) or past the queue limit, k is 0. `rows`: the
        calls of one /draft/batch request, rows of one pass of the target and one engine batch of ours; each
        weighs its tokens against its share of both (see "Why rows share" above). `probe`: whether the model
        drafts at least one; None: as the session's own wait for a probe says. `backlog`: in a batch, the
        tokens a draft would prefill beyond its round's, charged to this round (spread over the rounds
        drafting is expected to go on for: drafter.sessions.batch_rows)."""
        limit = min(self.max_draft_tokens, room)
        if limit < 1:
            return 0, 0
        probs = np.asarray(head_probs[:limit], dtype=np.float64)
        lead = np.arange(len(probs) + 1)[:, None]  # L
        ks = np.arange(limit + 1)[None, :]  # k
        usable = lead + ks <= limit
        if not model or load.queue_depth >= self.max_queue_depth:
            usable &= ks == 0
        else:  # A probe: after PROBE_EVERY calls without model drafts, the model drafts at least one, to learn.
            if probe is None:
                probe = acceptance.rounds_without_drafts >= acceptance.probe_every
            if probe and usable[:, 1:].any():
                usable &= ks > 0
        head_expected = np.concatenate(([0.0], np.cumsum(probs)))[:, None]  # E[accepted of the L lead]
        reach = np.concatenate(([1.0], probs))[:, None]  # P(all L accepted): the model's drafts count
        model_expected = np.concatenate(([0.0], np.cumsum(np.full(limit, acceptance.p).cumprod())))[None, :]
        round_ms = self.target.round_ms(lead + ks, rows) + self.draft_ms(ks, load, rows) / rows
        if backlog:
            round_ms = round_ms + np.where(ks > 0, backlog * self.prefill_token_ms(rows), 0.0)
        rate = (1.0 + head_expected + reach * model_expected) / round_ms
        rate = np.where(usable, rate, -np.inf)
        best_lead, best_k = np.unravel_index(int(np.argmax(rate)), rate.shape)  # the shortest among equals
        return int(best_lead), int(best_k)

    def draft_ms(self, num_drafts, load: Load, rows: int = 1):
        """Our answer's wait for `num_drafts` model drafts (an int or an array) when `rows` calls draft
        together; none without drafts, since the answer then skips the engine. A batch size not seen yet
        costs what the largest smaller one did: drafting once at that size measures it."""
        k = np.asarray(num_drafts)
        base_ms, step_ms = self.cost.draft_base_ms, self.step_ms
        batch = self.batches.at(rows) if rows > 1 else None
        if batch is not None:
            # Drafting every round, a row brings its drafts and the target's token to prefill.
            base_ms = batch.base_ms + batch.prefill_token_ms * rows * (1 + k)
            step_ms = batch.step_ms
        step_ms *= 1.0 + (load.queue_depth + load.running) / self.max_batch_size
        steps = np.concatenate(([0.0], self.steps))[np.minimum(k, self.max_draft_tokens)]
        return np.where(k > 0, base_ms + steps * step_ms, 0.0)

    def prefill_token_ms(self, rows: int) -> float:
        """What a prefilled token costs in a batch of `rows`: as batches of about that size prefilled lately,
        else as measured at startup."""
        batch = self.batches.at(rows) or self.batches.nearest(rows)
        return (
            batch.prefill_token_ms
            if batch is not None and batch.prefill_token_ms
            else self.cost.prefill_token_ms
        )

    def expected_tokens(
        self, acceptance: Acceptance, head_probs: Sequence[float], lead: int, k: int
    ) -> float:
        """1 + E[accepted] of a draft of a `lead`-token suffix lead, then k model drafts."""
        probs = np.asarray(head_probs[:lead], dtype=np.float64)
        model = float(np.full(k, acceptance.p).cumprod().sum())
        return 1.0 + float(probs.sum()) + float(probs.prod()) * model

    def describe(self) -> dict:
        cost = self.cost
        return {
            "objective": "max (1 + E[accepted | L suffix lead, k model drafts]) / (target round_ms(L + k) + "
            "draft_base_ms + steps(k) * step_ms); L = k = 0 is a plain decode step",
            "steps_by_k": [int(s) for s in self.steps],
            "target": self.target.describe(),
            "probe_after_zero_draft_calls": PROBE_EVERY,
            "draft_base_ms": round(cost.draft_base_ms, 4),
            "step_ms": round(self.step_ms, 4),
            "step_ms_at_startup": round(cost.step_ms, 4),
            "by_batch_size": self.batches.describe(),
            "load_step_factor": "1 + (queue_depth + running) / max_batch_size",
            "zero_drafts_at_queue_depth": self.max_queue_depth,
            "acceptance_estimate": "decayed accepted / (accepted + rejections), per session",
            "decay_per_round": DECAY,
            "prior_acceptance": PRIOR_ACCEPTANCE,
        }
