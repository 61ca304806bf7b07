"""The engine's side of drafting ahead: branches, the top choices that name them, the adoptions and drops
other threads ask for, and `draft_ahead` itself (`DraftingAhead`, a base of `Engine`).

While the target verifies a session's drafts, the server drafts the session's likely next contexts (the
drafts it will keep, then the target's own token: drafter/sessions/ahead.py) as *branches*: sequences of the
cache table that share the session's full pages and copy its partly filled one (nothing to prefill: the
session's sequence already holds the kept drafts' keys), drafted in one batched decode loop that stops
between steps when a real request comes in, so a real request waits at most one decode step. They
are ordinary sequences to the decode loop, so a branch's drafts are exactly those a call with its context
would get. The session's next call either matches one — the branch becomes the session's sequence — or
drops them all.

Those decisions are made on the event loop, but the cache table belongs to whichever thread drafts, so they
are queued here and applied at the start of the next engine job.
"""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass

from engine.cache.sequences import CacheFull, Sequence, SequenceTable
from engine.requests import DraftRequest, DraftResult, as_token_array

AHEAD_STEP_EWMA = 0.2  # weight of the newest ahead loop in `ahead_step_ms`


@dataclass(frozen=True, slots=True)
class AheadBranch:
    result: DraftResult  # the branch's drafts, as a call with its context gets them
    sequence: Sequence  # an opaque handle for `BranchOps.adopt`


def top_choices(row: list[float], count: int) -> list[list[tuple[int, float]]]:
    """A read-back row of [steps, 2 * count] floats (per step: ids, then probabilities) as per-step
    (id, probability) pairs."""
    if not count:
        return []
    width = 2 * count
    return [
        list(zip(map(int, row[i : i + count]), row[i + count : i + width], strict=True))
        for i in range(0, len(row), width)
    ]


class BranchOps:
    """Adoptions and drops asked from any thread; deque appends and pops are atomic, so no lock."""

    def __init__(self):
        self.queue: collections.deque = collections.deque()

    def adopt(self, session: str, sequence: Sequence) -> None:
        self.queue.append((session, sequence))

    def drop(self, session: str) -> None:
        self.queue.append((session, None))

    def apply(self, table: SequenceTable) -> None:
        while self.queue:
            session, sequence = self.queue.popleft()
            if sequence is None:
                table.drop_branches(session)
            else:
                table.adopt(session, sequence)


class DraftingAhead:
    """A base of `Engine` (engine/engine.py), which owns the state this reads: its config, cache table,
    branch ops and `ahead_step_ms`, and the `run` that drafts one batch."""

    def draft_ahead(self, session: str, requests: list[DraftRequest], stop=None) -> list[AheadBranch] | None:
        """Draft `requests` (a session's likely next contexts) as branches of `session`, replacing its earlier
        ones; None, with no branch kept, if `stop()` said so between two decode steps or
        the branches do not fit beside the cached conversations (they never evict one)."""
        cfg = self.config
        self.branch_ops.apply(self.table)
        self.table.drop_branches(session)
        vocab = self.loaded.config.vocab_size
        requests = requests[: cfg.max_batch_size]
        contexts = [as_token_array(r, vocab, cfg.max_seq_len, cfg.max_draft_tokens) for r in requests]
        began, asked = time.perf_counter(), [0]

        def stopping() -> bool:  # asked before every step but the first: counts the steps run when it stops
            asked[0] += 1
            return stop is not None and stop()

        try:
            results, placements = self.run(contexts, requests, branch_of=session, stop=stopping)
        except CacheFull:  # nothing ran
            results, asked[0] = None, 0
        steps = results[0].num_steps if results else asked[0]
        if steps:  # so the server can tell whether a loop would finish before the session's next call
            step_ms = (time.perf_counter() - began) * 1e3 / steps
            old = self.ahead_step_ms
            self.ahead_step_ms = step_ms if old is None else old + AHEAD_STEP_EWMA * (step_ms - old)
        if results is None:
            self.table.drop_branches(session)
        self.count_branch_pages()
        if results is None:
            return None
        return [AheadBranch(r, p.sequence) for r, p in zip(results, placements, strict=True)]
