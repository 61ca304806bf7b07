"""What the adaptation cycle has done so far, as `/info` and `/metrics` report it. Written on the engine
thread, read on the event loop: plain numbers, and dicts replaced whole."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class Counters:
    swaps: int = 0
    rejected: int = 0
    rollbacks: int = 0
    training_steps: int = 0
    training_s: float = 0.0
    making_s: float = 0.0  # candidates' making: the trainer's weights merged and quantized as served
    scoring_s: float = 0.0
    swap_s: float = 0.0  # swaps and rollbacks together: the engine thread's time in `swap`
    commit_s: float = 0.0  # of it, the commits: the one part of a swap a request waits for whole
    last_loss: float | None = None
    last_candidate: dict | None = None  # {"candidate": Score.describe(), "live": ..., "swapped": bool}
    last_judgment: dict | None = None  # {"version": N, "live": Score.describe(), "before": ...}

    def describe(self) -> dict:
        return {
            "swaps": self.swaps,
            "rejected_candidates": self.rejected,
            "rollbacks": self.rollbacks,
            "training_steps": self.training_steps,
            "training_seconds": round(self.training_s, 3),
            "making_seconds": round(self.making_s, 3),
            "scoring_seconds": round(self.scoring_s, 3),
            "swap_seconds": round(self.swap_s, 4),
            "swap_commit_seconds": round(self.commit_s, 4),
            "last_loss": None if self.last_loss is None else round(self.last_loss, 4),
            "last_candidate": self.last_candidate,
            "last_judgment": self.last_judgment,
        }
