"""The server's side of online adaptation (`--adapt`, docs/adaptation.md): feed the buffer from verified
calls, tell the cycle which weights version drafted what a target verified, run the cycle as background work
on an idle engine, and after a swap save the new version (with `--adapt-dir`).

The cycle (drafter/adaptation/cycle.py) runs as the batcher's background work: only on an idle engine with
nothing queued, arriving or held, one job at a time, stopping between two steps when a request shows up;
its swap therefore falls between two engine batches, with no draft on the event loop beside it. Drafted-ahead
answers made before a swap are never served after it: they carry the weights version that drafted them,
and a branch of another version than the engine's is a miss (drafter/sessions/ahead.py). A round starts
only once new target tokens came in since the last, so an idle server with no new traffic trains nothing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path

import numpy as np

from drafter.adaptation.buffer import TrafficBuffer
from drafter.adaptation.cycle import Cycle
from drafter.adaptation.heap import release_freed_memory
from drafter.adaptation.settings import CycleSettings
from drafter.adaptation.weights import source_hf_config, source_tensors
from drafter.scheduling.batcher import Batcher
from drafter.server.recache_work import RecacheWork
from drafter.sessions.draft_source import MODEL
from drafter.sessions.speculation import Call
from drafter.sessions.target_cost import TargetCost
from engine.engine import DTYPES, Engine
from engine.requests import DraftResult
from export.versions import version_config, write_version

log = logging.getLogger(__name__)

JOB_KEY = "\0adaptation"  # a background-work key no session name can take (names are printable)
# The engine must have answered nothing for this long before the cycle starts: while conversations are
# under way (a target verifies a round in milliseconds to tens of them) a call would meet a training step
# and wait for it (tiny test model, 1 client, one run: p99 24 -> 40 ms with training in every
# gap, on a 2-core machine under other load). After a quiet spell, the first call of a new burst waits
# for the layer or chunk of logits under way (drafter/adaptation/preempt.py).
QUIET_S = 0.05
# And for twice the target's longest round (the largest median gap between a session's calls, by drafts
# verified; its told step until gaps come): between two calls of a conversation the engine is
# idle while the target verifies, and on a shared CPU (or GPU) work there takes the target's cores. On the
# real pair (2 cores, a ~0.5 s verify) a 50 ms spell let the trainer run 10 of its 60 steps and most of its
# scoring inside conversations: the target ran at 0.75x the fixed drafter's speed, and calls waited 0.42 s
# at p50 (1.9 ms on the fixed server). Twice its plain step (0.8 s) was still short of its rounds at k = 4
# (1.4-1.6 s between calls): candidates were made and scored in those gaps, and the target ran at 0.80x.
QUIET_ROUNDS = 2.0
# Drafting ahead comes first, and the spell counts from its loops too: a branch answers the session's next
# call in milliseconds, a training step only pays later. On the real pair the cycle, posted while an ahead
# loop ran (the spell counted from the answer before it), started after it and ran until a real request
# came; the next round's ahead loop, queued behind it, was not ready when its call came: the adapting
# server drafted 83 of 155 calls in the engine (~455 ms each) where the fixed one drafted 40 of 156, and
# the target ran at 0.78x the fixed drafter's tokens/s. So the cycle starts only with no other background
# work, the spell counting from the last one's end, and yields to any queued after it.


def quiet_spell_s(target_round_ms: float) -> float:
    """How long the engine must have answered nothing before training starts."""
    return max(QUIET_S, QUIET_ROUNDS * target_round_ms / 1e3)


def longest_round_ms(target: TargetCost) -> float:
    """The longest of the target's rounds lately: the largest median gap between a session's calls over the
    draft lengths and row counts seen (a whole pass: a row's share times its rows), else its told step."""
    learned = [rows * gap for rows, gaps in target.by_rows.items() for gap in gaps.medians if gap is not None]
    return max(learned, default=target.step_ms())


def build_cycle(engine: Engine, buffer_tokens: int, adapter_rank: int = 0) -> Cycle:
    """The cycle for what `engine` serves, from version 0 (its checkpoint as served); on the engine thread,
    since it builds the trainer's and the scorer's models."""
    loaded, dtype = engine.loaded, DTYPES[engine.config.dtype]
    cycle = Cycle(
        CycleSettings.for_rank(adapter_rank),
        TrafficBuffer(buffer_tokens),
        source_hf_config(loaded),
        source_tensors(loaded, dtype),
        loaded.quantization,
        dtype,
        engine.weight_swap,
        engine.device,
        loaded.weight_scales or "tensor",
    )
    release_freed_memory()  # the models' construction freed more than they hold
    return cycle


class AdaptWork:
    def __init__(
        self,
        cycle: Cycle,
        batcher: Batcher,
        directory: Path | None,
        hf_config: dict,
        dtype,
        target_round_ms: Callable[[], float] = lambda: 0.0,  # the target's longest round (longest_round_ms)
        recache: RecacheWork | None = None,  # the conversations' caches made again after a swap
    ):
        self.cycle, self.batcher, self.directory, self.recache = cycle, batcher, directory, recache
        self.target_round_ms = target_round_ms
        self.hf_config, self.dtype = hf_config, dtype
        self.drafted_by: dict[str, int] = {}  # session -> weights version of the model drafts it was sent
        self.posted = False
        self.saves: set[asyncio.Task] = set()
        self.saved: list[int] = []  # version numbers written to the directory
        self.stopped_because: str | None = None  # a failure in training or scoring: adaptation stops
        self.last_answer = 0.0  # event-loop time of the last answer
        self.timer: asyncio.TimerHandle | None = None  # a post waiting for the engine to be quiet

    def start(self) -> None:
        """Version 0 saved (with a directory): the weights as loaded, beside the versions that follow."""
        if self.directory is not None:
            self.save(self.cycle.live.number, self.cycle.live.tensors)

    def verified(
        self, session: str, context: np.ndarray, last_len: int, accepted: int, num_drafts: int
    ) -> None:
        """Speculation's hook: a call verified its session's last drafts (on the event loop)."""
        self.cycle.buffer.add(session, context, last_len, accepted, num_drafts)
        version = self.drafted_by.pop(session, None)
        if version is not None:
            self.cycle.observe(version, accepted, num_drafts)
        self.post()

    def answered(self, call: Call, result: DraftResult) -> None:
        """A call's answer is out: which weights drafted it, if the model alone did (a suffix draft says
        nothing of the weights)."""
        self.last_answer = asyncio.get_running_loop().time()
        name = call.params.session
        if name is None:
            return
        if call.source == MODEL and result.tokens:
            self.drafted_by[name] = result.weights_version
        else:
            self.drafted_by.pop(name, None)

    def forget(self, name: str) -> None:
        self.drafted_by.pop(name, None)

    def post(self) -> None:
        """Hand the cycle to the batcher once the engine has been quiet for its spell (checked again then)."""
        if self.posted or self.timer is not None or self.stopped_because is not None:
            return
        if not (self.cycle.has_work() or (self.recache is not None and self.recache.todo)):
            return
        loop = asyncio.get_running_loop()
        batcher = self.batcher
        quiet_for = loop.time() - max(self.last_answer, batcher.background_ended)
        spell = quiet_spell_s(self.target_round_ms())
        busy = batcher.running or batcher.waiting or batcher.background_running or batcher.background
        if quiet_for < spell or busy:
            self.timer = loop.call_later(max(spell - quiet_for, QUIET_S / 10), self.recheck)
            return
        self.posted = True
        batcher.run_in_background(JOB_KEY, self.work, self.done, yields=True)

    def recheck(self) -> None:
        self.timer = None
        self.post()

    def work(self, stop) -> str | None:
        """The cycle's work on the engine thread. Its failures stop adaptation, not the server: the batcher
        takes a background job's error for the device's. (The one step that writes the engine, the swap's
        copy, follows a check of every tensor, so it cannot fail halfway on bad weights.)"""
        try:
            if self.recache is not None and self.recache.todo:  # the conversations first: the round waits
                self.recache.work(stop)
                return None
            return self.cycle.work(stop)
        except Exception as error:  # noqa: BLE001 - training or scoring failed: serving goes on
            self.stopped_because = f"{type(error).__name__}: {error}"
            log.exception("adaptation stopped; the live weights stay")
            return None

    def done(self, decision: str | None, error: BaseException | None) -> None:
        self.posted = False
        if error is not None:
            log.error("adaptation stopped for this round: %s: %s", type(error).__name__, error)
            return
        if decision == "swapped" and self.directory is not None:
            self.save(self.cycle.live.number, self.cycle.live.tensors)
        if decision in ("swapped", "rolled back") and self.recache is not None:
            self.recache.after_swap()  # done before the cycle's next round
        self.post()

    def save(self, number: int, tensors: dict) -> None:
        """Write version `number` as `DIR/v{number}/` off the event loop and the engine thread."""
        config = version_config(self.hf_config, self.cycle.quantization, self.dtype, self.cycle.weight_scales)
        path = self.directory / f"v{number}"

        def write() -> None:
            try:
                write_version(path, tensors, config)
            except OSError as error:
                log.error("adaptation: could not save version %d to %s: %s", number, path, error)
                return
            self.saved.append(number)
            log.info("adaptation: version %d saved to %s", number, path)

        task = asyncio.get_running_loop().create_task(asyncio.to_thread(write))
        self.saves.add(task)
        task.add_done_callback(self.saves.discard)

    def describe(self) -> dict:
        return {
            **self.cycle.describe(),
            "directory": str(self.directory) if self.directory is not None else None,
            "saved_versions": sorted(self.saved),
            "stopped_because": self.stopped_because,
            "recache": self.recache.counters.describe() if self.recache is not None else None,
        }
