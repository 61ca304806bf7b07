"""The adaptation cycle's settings (drafter/adaptation/cycle.py): how long a candidate trains, how it is
scored against the live weights, and when a swapped version is judged. The defaults are the ones measured in
docs/adaptation.md; `--adapt-rank` picks adapters and their learning rate.
"""

from __future__ import annotations

from dataclasses import dataclass

# On the real 0.5B drafter (bench/adapt/sweep.py) rank-8 adapters at 1e-3, LoRA's usual step, made held-out
# traffic worse by 9-19% within 64 steps, 3e-4 by 4-6%, and 1e-4 held it (0.98-1.00x) while learning the
# traffic it trained on. A tiny random-weight model needs more (the tests train theirs at 3e-3).
ADAPTER_LEARNING_RATE = 1e-4


@dataclass(frozen=True, slots=True)
class CycleSettings:
    steps_per_candidate: int = 16  # optimizer steps between two candidates
    step_tokens: int = 128  # ids in one step's window: bounds how long a request may wait for a step
    learning_rate: float = 1e-4
    adapter_rank: int = 0  # 0: every decoder weight trains; else low-rank adapters (docs/adaptation.md)
    min_train_tokens: int = 64  # new target tokens buffered since the last round before a round starts
    min_rounds: int = 16  # held-out rounds a candidate must be scored on
    margin: float = 0.02  # a candidate's tokens per round must beat the live weights' by this fraction
    rollback_rounds: int = 64  # live rounds of a new version before it is judged (again, if undecided)
    rollback_margin: float = 0.05  # rolled back when its tokens per round fall this fraction short

    @classmethod
    def for_rank(cls, adapter_rank: int) -> CycleSettings:
        """The settings for training every decoder weight (0) or adapters of this rank, which start at zero
        and need a larger step (docs/adaptation.md)."""
        if not adapter_rank:
            return cls()
        return cls(adapter_rank=adapter_rank, learning_rate=ADAPTER_LEARNING_RATE)
