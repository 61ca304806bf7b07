"""The adaptation cycle: train a candidate, score it against the live weights on held-out traffic, swap it in
only if it is better by a margin, and judge a swapped version once it has served: roll it back if, on the
held-out traffic that came after its swap, the version before it would have done better. Versions are
numbered 0 (as loaded), 1, 2, ...; a rollback makes the previous version live again under its own number.

Why the judgment replays both versions on the same traffic: the live tokens per round of two versions come
from different stretches of traffic, and traffic changes (that is why the drafter adapts): comparing them
rolled back good versions whenever the prompts after a swap were harder than those before it. Replayed on
the same rounds (drafter/adaptation/contest.py), the live version's score is what the target got from it and
the previous version's what it would have got, so the margin measures the weights and nothing else.

`work(stop)` runs on the engine thread as background work (the server's drafter/server/adapt_work.py posts
it only on an idle engine): it advances the cycle a step at a time (one optimizer step, or one example
scored, or one tensor of a candidate being made or of a version being loaded into the scorer) and returns as
soon as `stop()` says a request is waiting, keeping its place (a step or an example under way is cut short
between two decoder layers, drafter/adaptation/preempt.py). The swap runs there too, through `swap`
(`Engine.weight_swap`): made ready a module at a time, then committed, each between two engine batches.
Everything a reader on the event loop sees (`describe`, the counters) is replaced by whole values or plain
integers.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Generator, Iterator

import torch

from drafter.adaptation.buffer import TrafficBuffer
from drafter.adaptation.contest import Contest, Version, shared_names
from drafter.adaptation.counters import Counters
from drafter.adaptation.heap import release_freed_memory
from drafter.adaptation.score import Score
from drafter.adaptation.settings import CycleSettings
from drafter.adaptation.trainer import Trainer
from export.versions import dense_state, served_items

log = logging.getLogger(__name__)

TRAIN, SCORE = "train", "score"
CANDIDATE, JUDGMENT = "candidate", "judgment"  # what a scoring round decides: a swap, or a rollback


class Cycle:
    def __init__(
        self,
        settings: CycleSettings,
        buffer: TrafficBuffer,
        hf_config: dict,
        live_tensors: dict[str, torch.Tensor],
        quantization: str,
        dtype: torch.dtype,
        # The engine's swap (`Engine.weight_swap`: the tensors, and the names of those the live version
        # shares): made ready in pieces, committed on the last; returns its weights_version.
        swap: Callable[[dict[str, torch.Tensor], set[str]], Generator[None, None, int]],
        device="cpu",
        weight_scales: str = "tensor",  # an FP8 checkpoint's scale grain: versions are quantized as it was
    ):
        self.settings, self.buffer, self.hf_config = settings, buffer, hf_config
        self.weight_scales = weight_scales
        self.quantization, self.dtype, self.swap, self.device = quantization, dtype, swap, device
        self.tied = bool(hf_config.get("tie_word_embeddings"))
        if quantization != "none":  # torchao's import (0.35 s or more) now, not in a candidate's first piece
            import export.quantize  # noqa: F401
        self.live = Version(0, live_tensors)
        self.previous: Version | None = None  # the version before the live one, for a rollback
        self.next_number = 1
        self.trainer = Trainer(
            hf_config,
            dense_state(live_tensors),
            settings.learning_rate,
            settings.step_tokens,
            device=device,
            adapter_rank=settings.adapter_rank,
        )
        self.contest = Contest(hf_config, live_tensors, device)  # held-out scoring, its scorer model
        self.counters = Counters()
        self.live_rounds: dict[int, list[int]] = {}  # version -> [tokens, rounds] the target got live
        self.by_weights_version = {0: 0}  # the engine's weights_version (+1 a swap) -> our version number
        self.judge_at = 0  # the live version's rounds at which it is judged; 0: not to be judged
        self.examples_at_swap = 0  # the buffer's examples started before the live version went live
        self.judgment_due = False
        self.deciding = CANDIDATE  # what the scoring round under way decides
        self.phase, self.steps = TRAIN, 0
        self.tokens_at_round = 0  # the buffer's target tokens seen when the current round started
        self.candidate: Version | None = None
        # Work done a tensor at a time (a candidate's making, the scorer's loading, a swap's weights made ready),
        # so that a request waits for one tensor of it, not all: on the real 0.5B drafter a whole candidate
        # took seconds, and first calls of conversations waited 3.7-8.7 s for it. (counter to time it into,
        # its pieces)
        self.making: tuple[str, Iterator[None]] | None = None
        self.decided: str | None = None  # what a swap decided ("swapped", "rolled back"), once committed

    # -- on the event loop ----------------------------------------------------------------------------

    def observe(self, weights_version: int, accepted: int, num_draft_tokens: int) -> None:
        """A target verified drafts the engine made at `weights_version`: it kept `accepted` of
        `num_draft_tokens` and added one token."""
        version = self.by_weights_version.get(weights_version)
        if num_draft_tokens < 1 or version is None:
            return
        tally = self.live_rounds.setdefault(version, [0, 0])
        tally[0] += accepted + 1
        tally[1] += 1
        if version == self.live.number and self.judge_at and tally[1] >= self.judge_at:
            self.judgment_due = True

    def has_work(self) -> bool:
        """A judgment is due, a round is under way, or enough new target tokens came in to start one
        (cheap: asked on every verified call)."""
        if self.judgment_due or self.phase == SCORE or self.steps or self.making is not None:
            return True
        new = self.buffer.counters.target_tokens - self.tokens_at_round
        return new >= self.settings.min_train_tokens and bool(self.buffer.training and self.buffer.held_out)

    # -- on the engine thread -------------------------------------------------------------------------

    def work(self, stop: Callable[[], bool]) -> str | None:
        """Advance the cycle until `stop()` or a decision: "swapped", "rejected", "rolled back", "kept" (a
        judged version stays), or None."""
        if self.judgment_due and self.phase == TRAIN and self.making is None:  # a candidate's training is
            self.judgment_due, self.steps = False, 0  # cut short, not kept
            self.start_scoring(JUDGMENT)
        while not stop():
            if self.making is not None:
                self.advance_making()
                if self.decided is not None:  # a swap went in
                    decision, self.decided = self.decided, None
                    release_freed_memory()  # the old packed weights: gigabytes
                    return decision
            elif self.phase == TRAIN:
                examples = tuple(self.buffer.training)
                if not examples:
                    return None
                seen = self.buffer.counters.target_tokens
                began = time.perf_counter()
                loss = self.trainer.step(examples, stop)
                self.counters.training_s += time.perf_counter() - began
                if loss is None:  # cut short for a request: dropped, not counted
                    return None
                if not self.steps:  # the round starts with its first step done: until then it is work to do
                    self.tokens_at_round = seen
                self.counters.last_loss = loss
                self.counters.training_steps += 1
                self.steps += 1
                if self.steps >= self.settings.steps_per_candidate:
                    self.start_scoring(CANDIDATE)
            elif self.contest.pending:
                began = time.perf_counter()
                loading = self.contest.score_next({"live": self.live, "candidate": self.candidate}, stop)
                self.counters.scoring_s += time.perf_counter() - began
                if loading is not None:
                    self.making = ("scoring_s", loading)
            else:
                decision = self.decide()
                if self.making is None:  # decided with no swap to make
                    release_freed_memory()  # a candidate or a judgment came and went: gigabytes freed
                    return decision
        return None

    def start_scoring(self, deciding: str) -> None:
        """Score the live version against another on held-out traffic: a candidate (the trainer's weights)
        on all of it, or, to judge the live version, the one before it on what came after the swap."""
        self.deciding = deciding
        if deciding == CANDIDATE:
            self.candidate = None
            self.making = ("making_s", self.make_candidate())
        else:
            self.candidate = self.previous
        since = self.examples_at_swap if deciding == JUDGMENT else 0
        self.contest.start(
            [
                e
                for e in tuple(self.buffer.held_out)
                if e.num_draft_tokens >= 1 and e.num_targets >= 1 and e.number >= since
            ]
        )
        self.phase = SCORE

    def make_candidate(self) -> Iterator[None]:
        """The trainer's weights as served (merged, quantized by the export's code), a tensor at a time; the
        candidate is there once all are. What training leaves as it was (the embedding; with adapters all
        but the linears' weights) is the live version's own tensors: every version shares them, so they are
        made, loaded into the scorer and swapped in once. On the real 0.5B drafter the embedding and its
        untied head were the longest pieces of a candidate (0.33 and 0.12 s) and of the scorer's loading."""
        tensors = dict(self.live.tensors)
        trained = self.trainer.tensors(trained_only=True)
        for name, tensor in served_items(
            trained, self.quantization, self.dtype, self.tied, self.weight_scales
        ):
            tensors[name] = tensor
            yield
        self.candidate = Version(self.next_number, tensors)
        yield  # the trim a piece of its own
        release_freed_memory()  # the merged weights and the quantization's temporaries: gigabytes

    def advance_making(self) -> None:
        """One piece of the making under way, timed into its counter."""
        counter, pieces = self.making
        began = time.perf_counter()
        finished = next(pieces, StopIteration) is StopIteration
        setattr(self.counters, counter, getattr(self.counters, counter) + time.perf_counter() - began)
        if finished:
            self.making = None

    def decide(self) -> str | None:
        """Swap the candidate in if it beats the live weights by the margin on enough rounds (a judgment:
        roll back to the version before if the live one falls short of it by the rollback margin). A swap is
        made in pieces first: its decision comes once it is in."""
        scores = self.contest.scores()
        candidate, live = scores["candidate"], scores["live"]
        if self.deciding == JUDGMENT:
            return self.judge(candidate, live)
        better = (
            candidate.rounds >= self.settings.min_rounds
            and live.rounds >= self.settings.min_rounds
            and candidate.tokens_per_round > live.tokens_per_round * (1 + self.settings.margin)
        )
        self.counters.last_candidate = {
            "version": self.candidate.number,
            "candidate": candidate.describe(),
            "live": live.describe(),
            "swapped": better,
        }
        self.phase, self.steps = TRAIN, 0
        if not better:
            self.counters.rejected += 1
            self.candidate = None
            return "rejected"
        self.making = ("swap_s", self.swap_in(self.candidate, self.went_live))
        return None

    def swap_in(self, version: Version, then: Callable[[], str]) -> Iterator[None]:
        """`version`'s weights into the engine (a piece at a time, then committed between two batches), and
        `then` the cycle's own record of it, whose decision `work` returns."""
        pieces = self.swap(version.tensors, shared_names(version.tensors, self.live.tensors))
        while True:
            began = time.perf_counter()
            try:
                next(pieces)
            except StopIteration as committed:  # the engine's last piece is its commit alone
                self.counters.commit_s += time.perf_counter() - began
                self.by_weights_version[committed.value] = version.number
                break
            yield
        yield  # a piece of its own: a rollback's trainer reset takes a while
        self.decided = then()

    def went_live(self) -> str:
        self.previous, self.live, self.candidate = self.live, self.candidate, None
        self.next_number += 1
        self.counters.swaps += 1
        self.judge_at, self.examples_at_swap = self.settings.rollback_rounds, self.buffer.counters.examples
        self.judgment_due = False  # one due for the version before is moot
        log.info("adaptation: version %d swapped in (%s)", self.live.number, self.counters.last_candidate)
        return "swapped"

    def judge(self, before: Score, live: Score) -> str | None:
        """The live version against the one before it, on the same traffic since the swap: "kept", None (to be
        judged later), or a rollback started."""
        self.phase, self.candidate = TRAIN, None
        enough = min(before.rounds, live.rounds) >= self.settings.min_rounds
        self.counters.last_judgment = {
            "version": self.live.number,
            "live": live.describe(),
            "before": before.describe(),
        }
        if not enough:  # too little traffic since the swap: judged again after as many live rounds more
            self.judge_at += self.settings.rollback_rounds
            return None
        self.judge_at = 0
        if live.tokens_per_round >= before.tokens_per_round * (1 - self.settings.rollback_margin):
            return "kept"
        self.making = ("swap_s", self.swap_in(self.previous, self.rolled_back))
        return None

    def rolled_back(self) -> str:
        """The live version did worse than the one before: that one again, and training starts from it."""
        log.warning("adaptation: version %d rolled back to %d", self.live.number, self.previous.number)
        self.live, self.previous = self.previous, None
        self.trainer.reset(dense_state(self.live.tensors))
        self.phase, self.steps, self.candidate = TRAIN, 0, None
        self.counters.rollbacks += 1
        return "rolled back"

    def describe(self) -> dict:
        return {
            "version": self.live.number,
            "previous_version": self.previous.number if self.previous else None,
            **self.counters.describe(),
            "adapter_rank": self.settings.adapter_rank,
            "learning_rate": self.settings.learning_rate,
            "round": {"phase": self.phase, "steps": self.steps, "busy": self.has_work()},
            "live_tokens_per_round": {str(v): round(t / r, 4) for v, (t, r) in self.live_rounds.items() if r},
            "buffer": self.buffer.describe(),
        }
