"""What one server process holds while it runs: the engine thread, the engine once loaded, the batcher,
the metrics, and the stage readiness reports (loading → compiling → capturing → ready, or draining/failed).

Load and warmup run in the background on the engine thread, so Hypercorn's 60 s startup timeout never
meets a slow checkpoint or a long compile; readiness is gated on the engine's `Lifecycle` instead.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

import torch

from drafter.scheduling import startup_costs
from drafter.scheduling.batcher import Batcher
from drafter.scheduling.engine_thread import EngineThread
from drafter.scheduling.inline import InlinePolicy, effective_max_ms
from drafter.server.adapt_work import AdaptWork, build_cycle, longest_round_ms
from drafter.server.ahead_work import AheadWork
from drafter.server.config import ServerConfig
from drafter.server.metrics import Metrics
from drafter.server.recache_work import RecacheWork
from drafter.server.request_body import BodyDeadlines
from drafter.server.validation import Limits
from drafter.sessions.ahead import DraftAhead
from drafter.sessions.draft_length import DraftCost, DraftLengthPolicy
from drafter.sessions.speculation import Speculation
from drafter.sessions.suffix_drafts import SuffixDrafts, SuffixRules
from drafter.sessions.table import SessionTable
from engine.engine import Engine
from engine.lifecycle import Lifecycle, State

log = logging.getLogger(__name__)
STARTING = "starting"  # the stage between a warm engine and a server that serves it
# Between two indexing slices (~0.1 ms each) while a batch is on the engine thread: indexing then takes at
# most ~10% of the GIL, and a burst of new conversations is indexed over a few seconds instead of stalling it.
INDEX_PAUSE_BUSY_S = 0.001


class Runtime:
    def __init__(self, config: ServerConfig):
        self.config = config
        self.metrics = Metrics(config.max_batch_size)
        self.metrics.ready.set_function(lambda: float(self.ready))
        self.lifecycle = (
            Lifecycle()
        )  # before loading starts, so readiness says "loading" from the first probe
        self.engine: Engine | None = None
        self.limits: Limits | None = None
        self.batcher: Batcher | None = None
        self.speculation: Speculation | None = None
        self.inline: InlinePolicy | None = None
        self.engine_thread: EngineThread | None = None
        self.draining = False
        self.in_flight = 0  # /draft requests inside a handler; SIGTERM waits for this to reach 0
        self.metrics.in_flight.set_function(lambda: self.in_flight)
        self.body_deadlines = BodyDeadlines(config.body_timeout_s)
        self.fatal = asyncio.Event()  # the engine could not load: the process should exit non-zero
        self.startup: asyncio.Task | None = None
        self.suffix: SuffixDrafts | None = None
        self.suffix_work = asyncio.Event()  # set when the suffix indexes have tokens to take in
        self.indexer: asyncio.Task | None = None
        self.ahead: AheadWork | None = None  # drafting ahead, when --draft-ahead > 0
        self.adapt: AdaptWork | None = None  # online adaptation, with --adapt

    @property
    def ready(self) -> bool:
        return self.lifecycle.ready and self.batcher is not None and not self.draining

    @property
    def stage(self) -> str:
        if self.lifecycle.state is State.FAILED:
            return State.FAILED.value
        if self.draining:
            return "draining"
        if self.lifecycle.state is State.READY and self.batcher is None:
            # The engine is warm; the server still measures its costs and builds its batcher. Never
            # "ready" while readiness says no.
            return STARTING
        return self.lifecycle.state.value

    @property
    def alive(self) -> bool:
        return self.lifecycle.state is not State.FAILED

    async def start(self) -> None:
        self.engine_thread = EngineThread()
        self.startup = asyncio.create_task(self.load_and_warm_up(), name="drafter-startup")

    async def load_and_warm_up(self) -> None:
        config, started = self.config, time.perf_counter()
        try:
            if config.num_threads is not None:
                await self.engine_thread.run(torch.set_num_threads, config.num_threads)
            engine = await self.engine_thread.run(
                Engine.load, config.model, config.engine_config(), self.lifecycle
            )
            if engine.loaded.is_random_preset:
                log.warning(
                    "serving %r, whose weights are RANDOM (a preset, or an export of one): its drafts "
                    "are meaningless (pass --model DIR to serve a real checkpoint)",
                    config.model,
                )
            snapshot = await self.engine_thread.run(engine.warmup)
            threads = await self.engine_thread.run(torch.get_num_threads)
            inline_ms, inline_off = effective_max_ms(config.inline_max_ms, engine.device.type, threads)
            costs = await self.engine_thread.run(startup_costs.measure, engine, inline_ms)
            cycle = None
            if config.adapt:  # the trainer's and scorer's models: before readiness, like the engine
                cycle = await self.engine_thread.run(
                    build_cycle, engine, config.adapt_buffer_tokens, config.adapt_rank
                )
        except Exception as error:  # noqa: BLE001 - anything here means nothing can be served
            if self.lifecycle.state is not State.FAILED:
                self.lifecycle.fail(f"{type(error).__name__}: {error}")
            log.error("could not start the engine: %s", self.lifecycle.reason)
            self.fatal.set()
            return
        self.engine = engine
        self.metrics.watch_cache(engine)
        self.limits = Limits(
            vocab_size=engine.loaded.config.vocab_size,
            max_seq_len=config.max_seq_len,
            max_draft_tokens=config.max_draft_tokens,
            default_num_draft_tokens=config.default_num_draft_tokens,
            max_body_bytes=config.max_body_bytes,
            sources=config.sources,
        )
        if config.suffix_tokens:
            self.suffix = SuffixDrafts(
                SuffixRules(), config.suffix_tokens, config.suffix_global_tokens, self.suffix_work.set
            )
            self.metrics.watch_suffix(self.suffix)
            self.indexer = asyncio.create_task(self.index_suffixes(), name="drafter-suffix-indexer")
        self.speculation = Speculation(
            SessionTable(
                config.max_sessions,
                config.session_ttl_s,
                config.max_seq_len,
                on_drop=self.session_dropped,
            ),
            DraftLengthPolicy(
                DraftCost(
                    config.target_verify_ms,
                    costs.base_ms,
                    costs.step_ms,
                    config.target_verify_ms_per_token,
                    costs.prefill_token_ms,
                ),
                config.max_draft_tokens,
                config.max_batch_size,
                config.auto_zero_queue_depth,
                engine.decode_steps,
                learn_target_cost=config.target_cost == "learn",
            ),
            self.metrics,
            config.max_draft_tokens,
            config.max_seq_len,
            self.suffix,
            config.default_source,
            config.suffix_min_score,
        )
        self.inline = InlinePolicy(
            inline_ms,
            costs.prefill_token_ms,
            self.speculation.policy,
            engine.decode_steps,
            engine.expected_prefill,
            inline_off,
        )
        if inline_ms > 0 and config.num_threads is not None:  # each thread has its own count
            torch.set_num_threads(config.num_threads)
        self.batcher = Batcher(
            self.engine_thread,
            engine.draft_batch,
            config.max_batch_size,
            config.max_queue,
            config.batch_window_ms / 1e3,
            self.metrics,
            self.on_engine_failure,
            self.speculation.policy.observe,  # each batch's decode ms and the steps that ran
            self.inline,
        )
        if config.draft_ahead:
            self.metrics.add_ahead(config.max_draft_tokens)
            self.metrics.ahead_branch_pages.set_function(lambda: engine.branch_pages)
            ahead = DraftAhead(
                config.draft_ahead,
                self.speculation.policy,
                config.max_seq_len,
                config.max_draft_tokens,
                self.metrics,
            )
            self.ahead = AheadWork(ahead, self.batcher, engine, self.speculation.sessions)
        if cycle is not None:
            directory = Path(config.adapt_dir).expanduser() if config.adapt_dir else None
            self.adapt = AdaptWork(
                cycle,
                self.batcher,
                directory,
                cycle.hf_config,
                cycle.dtype,
                lambda: longest_round_ms(self.speculation.policy.target),
                RecacheWork(engine, self.speculation.sessions),
            )
            self.speculation.on_verified = self.adapt.verified
            self.metrics.watch_adaptation(self.adapt)
            self.adapt.start()
        log.info(
            "ready in %.1f s: %s on %s (%s), stages %s, fallbacks %s",
            time.perf_counter() - started,
            config.model,
            config.device,
            config.dtype,
            snapshot["stage_seconds"],
            snapshot["fallbacks"] or "none",
        )

    def session_dropped(self, name: str) -> None:
        """A session left the table (TTL, count, close): its suffix index and branches go too."""
        if self.suffix is not None:
            self.suffix.drop(name)
        if self.ahead is not None:
            self.ahead.forget(name)
        if self.adapt is not None:
            self.adapt.forget(name)

    async def index_suffixes(self) -> None:
        """Take new context tokens into the suffix indexes a slice at a time, between the loop's other
        work, so indexing never holds up an answer for more than one slice (drafter.sessions.suffix_drafts).
        While the engine thread drafts, slices are spaced out: pure-Python indexing back to back holds the
        GIL the engine's Python-driven loop needs between kernels (measured: 16 new 1k-token conversations
        at once stretched the next batch's 36 ms decode to 460 ms)."""
        try:
            while True:
                await self.suffix_work.wait()
                self.suffix_work.clear()
                while self.suffix.work():
                    await asyncio.sleep(INDEX_PAUSE_BUSY_S if self.batcher.running else 0)
        except Exception:  # a bug here must not take the server down: lookups go on from what is indexed
            log.exception("suffix indexing stopped; suffix drafts come from what was indexed until now")

    def on_engine_failure(self, error: BaseException) -> None:
        # Readiness and liveness both fail from here on, so an orchestrator restarts the process.
        self.lifecycle.fail(f"engine error while drafting: {type(error).__name__}: {error}")
        log.error("engine failed while drafting; restart the process", exc_info=error)

    async def drain(self) -> None:
        """Readiness goes 503 at once; wait (bounded) for requests already inside a handler to finish."""
        self.draining = True
        self.body_deadlines.expire_all()  # a client still sending its body gets 503 now, not at its deadline
        log.info("draining: readiness is 503, waiting for %d in-flight request(s)", self.in_flight)
        deadline = time.monotonic() + self.config.drain_timeout_s
        while self.in_flight and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        if self.in_flight:
            log.warning("drain timed out with %d request(s) still in flight", self.in_flight)

    async def close(self) -> None:
        if self.indexer is not None:
            self.indexer.cancel()
        if self.batcher is not None:
            await self.batcher.stop()
        if self.startup is not None and not self.startup.done():
            self.startup.cancel()  # the load itself goes on in the engine thread; see `stop_engine_thread`

    def stop_engine_thread(self, timeout_s: float = 2.0) -> bool:
        """End the engine thread; False if it is still inside a load, warmup or batch."""
        return self.engine_thread is None or self.engine_thread.stop(timeout_s)
