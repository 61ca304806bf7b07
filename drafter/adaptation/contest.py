"""Two weights versions scored on the same held-out traffic (drafter/adaptation/score.py): a candidate against
the live weights, or, to judge the live version, the one before it on the traffic since its swap.

One scorer model (transformers', fp32) holds one version at a time. Each side's examples are scored together
(the candidate's first, then the live's), so the scorer loads each version once a contest, a tensor at a
time: `score_next` hands that loading back to the cycle as pieces of work, as it does a candidate's making.
An example under way is cut short between two decoder layers when a request arrives, and scored again later.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from drafter.adaptation.buffer import Example
from drafter.adaptation.preempt import Preempted, preemptible
from drafter.adaptation.score import Score, agreement, replay
from drafter.adaptation.trainer import hf_model
from export.versions import dense_items, dense_state

SIDES = ("live", "candidate")  # the live version, and the one it is scored against


@dataclass(slots=True)
class Version:
    number: int
    tensors: dict[str, torch.Tensor]  # the served layout (export/versions.py): what the engine holds


def shared_names(tensors: dict[str, torch.Tensor], other: dict[str, torch.Tensor]) -> set[str]:
    """Names whose tensor is the very one `other` holds: versions share what training leaves as it was
    (drafter/adaptation/cycle.py), so those are neither loaded nor swapped in again."""
    return {name for name, tensor in tensors.items() if other.get(name) is tensor}


class Contest:
    def __init__(self, hf_config: dict, tensors: dict[str, torch.Tensor], device):
        self.scorer = hf_model(hf_config, dense_state(tensors), device)
        self.holds: Version | None = None  # the version whose weights `scorer` holds
        self.pending: list[tuple[str, Example]] = []  # (side, held-out example) still to score, last first
        self.totals: dict[str, list[int]] = {}  # side -> [tokens, rounds, positions, agreed]

    def start(self, held_out: list[Example]) -> None:
        """A contest on `held_out` (copied: the buffer may grow an example meanwhile, and both sides must
        score the same tokens)."""
        copies = [Example(e.session, e.tokens[:], e.num_context, e.num_draft_tokens, True) for e in held_out]
        self.pending = [(side, e) for side in SIDES for e in copies]
        self.totals = {side: [0, 0, 0, 0] for side in SIDES}

    def score_next(self, versions: dict[str, Version], stop: Callable[[], bool]) -> Iterator[None] | None:
        """Score the next example with its side's version; or, if the scorer does not hold that version, the
        loading to run first, a piece at a time. Left for later if `stop()` turns true meanwhile."""
        side, example = self.pending[-1]
        version = versions[side]
        if self.holds is not version:
            return self.load(version)
        try:
            with preemptible(self.scorer, stop):
                agree = agreement(self.scorer, example, stop)
        except Preempted:
            return None
        self.pending.pop()
        tokens, rounds = replay(agree, example.num_draft_tokens)
        total = self.totals[side]
        for i, value in enumerate((tokens, rounds, len(agree), sum(agree))):
            total[i] += value
        return None

    def load(self, version: Version) -> Iterator[None]:
        """The scorer holds `version` once this is through (copied into its parameters, dequantized: a tied
        lm_head is the embedding it shares). Tensors the version shares with the one the scorer holds (the
        cycle's versions share all that training leaves as it was) are there already."""
        tensors = version.tensors
        same = shared_names(tensors, self.holds.tensors if self.holds is not None else {})
        self.holds = None  # part this version, part another, until the last tensor

        def differs(weight: str) -> bool:  # an FP8 weight is dequantized with its scale: both go if one does
            scale = f"{weight}_scale"
            return weight not in same or (scale in tensors and scale not in same)

        changed = {name: t for name, t in tensors.items() if differs(name.removesuffix("_scale"))}
        for name, tensor in dense_items(changed):
            with torch.no_grad():  # not around the yield: the caller's grad mode is its own
                self.scorer.get_parameter(name).copy_(tensor)
            yield
        self.holds = version

    def scores(self) -> dict[str, Score]:
        return {side: Score(*total) for side, total in self.totals.items()}
