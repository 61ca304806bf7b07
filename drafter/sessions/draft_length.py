"""The draft-length policy behind `"num_draft_tokens": "auto"`: an acceptance estimate per session, and the
k that maximizes the target's tokens per unit of time under the server's current load.

Why this objective: one speculative round costs the target one verify pass (`target_verify_ms`, a setting:
only the operator knows the target) plus the wait for our draft (`draft_base_ms + steps(k) * step_ms`, measured
at startup), and yields `1 + E[accepted | k]` tokens (the accepted drafts plus the target's own token). With a
per-token acceptance p, `E[accepted | k] = p + p^2 + ... + p^k`. Leviathan et al.'s speedup analysis
maximizes exactly this ratio; k = 0 costs only the verify pass and yields one token. `steps(k)` is the
engine's own count (engine/tiers.py): k eagerly, k + 1 on compiled paths, and under CUDA graphs the
smallest captured tier >= k plus one, so k = 5 costs what k = 8 does and the policy drafts 8 instead.

Why one p and not one per position: a draft stops at its first rejection, so a per-position estimate never
sees positions past it; after acceptance drops, the deep positions would keep their old optimism and hold k
long for dozens of rounds. One p (the censored-geometric estimate: accepted / (accepted + rejections), over
exponentially decayed counts) learns from every round at every length and follows a change in ~4-6 rounds.
Per-position acceptance is still counted, for /info and /metrics (drafter.sessions.speculation).

Why load shrinks k: on a busy engine a decode step of this request is a step every queued or batched
request waits through, so a draft token's marginal cost is its step time times (1 + load / max batch).
The steeper cost moves the optimum to shorter drafts; past `max_queue_depth` waiting requests the policy
answers 0 drafts at once, which is never slower for the target than waiting in the queue.

Acceptance-driven choices never go below 1 draft: a session answered 0 drafts would teach the estimate
nothing, and one draft step is cheap next to a verify pass. This module knows nothing of HTTP or sessions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

PRIOR_ACCEPTANCE = 0.7  # a fresh server's guess, before any feedback arrives
PRIOR_WEIGHT = 2.0  # worth two rounds of evidence: the first real rounds outweigh it at once
STEP_WEIGHT = 0.05  # of each batch's decode ms per step in the running step cost
DECAY = 0.5  # per round: evidence halves each round, so a change in acceptance shows within ~4-6 rounds


@dataclass(frozen=True, slots=True)
class Acceptance:
    """Decayed counts of accepted drafts and of rejections (a draft cut short by the target)."""

    accepted: float = PRIOR_ACCEPTANCE * PRIOR_WEIGHT
    rejected: float = (1 - PRIOR_ACCEPTANCE) * PRIOR_WEIGHT

    @property
    def p(self) -> float:
        return self.accepted / (self.accepted + self.rejected)

    def updated(self, num_drafted: int, num_accepted: int) -> Acceptance:
        if num_drafted == 0:  # nothing proposed, nothing learned
            return self
        rejected = 1.0 if num_accepted < num_drafted else 0.0
        return Acceptance(DECAY * self.accepted + num_accepted, DECAY * self.rejected + rejected)


class DraftLengthConfigError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class DraftCost:
    """What one call costs the target, in ms; the draft part measured on this server at startup."""

    target_verify_ms: float
    draft_base_ms: float  # a draft call's fixed cost (prefill of the new tokens, loop set-up, host work)
    step_ms: float  # one decode step

    def __post_init__(self):
        if not self.target_verify_ms > 0:
            raise DraftLengthConfigError(f"target_verify_ms must be positive, got {self.target_verify_ms}")
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
    ):
        if max_queue_depth < 0:
            raise DraftLengthConfigError(f"auto max queue depth must be >= 0, got {max_queue_depth}")
        self.cost, self.max_draft_tokens = cost, max_draft_tokens
        self.max_batch_size, self.max_queue_depth = max_batch_size, max_queue_depth
        self.step_ms = cost.step_ms  # refined by every batch: a startup measure on a busy host is noisy
        self.steps = np.array([decode_steps(k) for k in range(1, max_draft_tokens + 1)], dtype=np.float64)

    def observe(self, decode_ms: float, num_steps: int) -> None:
        """A batch's decode loop took decode_ms for num_steps steps."""
        if num_steps > 0:
            self.step_ms += STEP_WEIGHT * (decode_ms / num_steps - self.step_ms)

    def choose(self, acceptance: Acceptance, load: Load, room: int) -> int:
        """k in [0, min(max_draft_tokens, room)]: 0 only under load (or with no room left)."""
        limit = min(self.max_draft_tokens, room)
        if load.queue_depth >= self.max_queue_depth or limit < 1:
            return 0
        cost = self.cost
        step_ms = self.step_ms * (1.0 + (load.queue_depth + load.running) / self.max_batch_size)
        expected = np.cumsum(np.full(limit, acceptance.p).cumprod())  # E[accepted | k] for k = 1..limit
        ks = np.arange(1, limit + 1)
        rate = (1.0 + expected) / (cost.target_verify_ms + cost.draft_base_ms + self.steps[:limit] * step_ms)
        return int(ks[np.argmax(rate)])  # argmax takes the shortest k among equals

    def describe(self) -> dict:
        cost = self.cost
        return {
            "objective": "max (1 + E[accepted | k]) / (target_verify_ms + draft_base_ms + steps(k) * step_ms)",
            "steps_by_k": [int(s) for s in self.steps],
            "target_verify_ms": cost.target_verify_ms,
            "draft_base_ms": round(cost.draft_base_ms, 4),
            "step_ms": round(self.step_ms, 4),
            "step_ms_at_startup": round(cost.step_ms, 4),
            "load_step_factor": "1 + (queue_depth + running) / max_batch_size",
            "zero_drafts_at_queue_depth": self.max_queue_depth,
            "acceptance_estimate": "decayed accepted / (accepted + rejections), per session",
            "decay_per_round": DECAY,
            "prior_acceptance": PRIOR_ACCEPTANCE,
        }
