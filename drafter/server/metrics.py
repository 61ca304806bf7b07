"""Prometheus metrics of one server, in a registry of its own (never the process-global one), so two apps
in one process (tests) do not collide and /metrics shows only what this server measured. `Metrics` is
what the rooms below the HTTP face report to, through the interfaces of drafter/reporting.py.
"""

from __future__ import annotations

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST

# Sub-millisecond to seconds: a GPU draft is ~1-5 ms, a CPU one or a long prefill much more.
SECONDS_BUCKETS = (
    0.0002, 0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075,
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip


class RecompileCollector:
    """`drafter_recompiles_total`: torch.compile recompiles after warmup (engine/recompiles.py); must stay 0."""

    def __init__(self, guard):
        self.guard = guard

    def collect(self):
        help_text = "torch.compile recompiles after warmup (each one stalls the engine; should stay 0)"
        yield CounterMetricFamily("drafter_recompiles", help_text, value=self.guard.count)


class AdaptationCollector:
    """Online adaptation's series (drafter/server/adapt_work.py), read from its counters at each scrape."""

    def __init__(self, adapt):
        self.adapt = adapt

    def collect(self):
        cycle = self.adapt.cycle
        c = cycle.counters
        yield GaugeMetricFamily(
            "drafter_adapt_version", "The weights version live (0: as loaded)", cycle.live.number
        )
        for name, text, value in (
            ("swaps", "Candidates swapped in (better than the live weights by the margin)", c.swaps),
            ("rejected_candidates", "Candidates not swapped in (no better on held-out traffic)", c.rejected),
            (
                "rollbacks",
                "Versions rolled back (on the traffic after their swap, short of the version before)",
                c.rollbacks,
            ),
            ("training_steps", "Optimizer steps of the trainer", c.training_steps),
            ("training_seconds", "Engine-thread time spent training", c.training_s),
            ("making_seconds", "Engine-thread time spent making candidates (merged, quantized)", c.making_s),
            ("scoring_seconds", "Engine-thread time spent scoring candidates", c.scoring_s),
            ("swap_seconds", "Engine-thread time spent swapping weights in (pieces and commits)", c.swap_s),
            ("swap_commit_seconds", "Of it, the commits: the part that holds requests up", c.commit_s),
        ):
            yield CounterMetricFamily(f"drafter_adapt_{name}", text, value=value)
        if self.adapt.recache is not None:
            r = self.adapt.recache.counters
            for name, text, value in (
                ("recached_sessions", "Conversations prefilled again while idle after a swap", r.sessions),
                ("recache_seconds", "Engine-thread time spent prefilling them", r.seconds),
            ):
                yield CounterMetricFamily(f"drafter_adapt_{name}", text, value=value)
        yield GaugeMetricFamily(
            "drafter_adapt_buffer_tokens",
            "Token ids in the traffic buffer",
            cycle.buffer.describe()["tokens"],
        )
        last = c.last_candidate
        if last is not None:
            family = GaugeMetricFamily(
                "drafter_adapt_last_candidate_tokens_per_round",
                "The last candidate's score on held-out traffic, and the live weights' on the same",
                labels=["weights"],
            )
            for side in ("candidate", "live"):
                family.add_metric([side], last[side]["tokens_per_round"])
            yield family


class Metrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self, max_batch_size: int):
        disable_created_metrics()  # `*_created` series double the output and no dashboard reads them
        self.registry = registry = CollectorRegistry()
        self.request_seconds = Histogram(
            "drafter_request_seconds",
            "Time from a /draft request's arrival to its answer, by HTTP status",
            ["status"],
            buckets=SECONDS_BUCKETS,
            registry=registry,
        )
        self.queue_wait_seconds = Histogram(
            "drafter_queue_wait_seconds",
            "Time a validated request waited before its batch started on the engine",
            buckets=SECONDS_BUCKETS,
            registry=registry,
        )
        self.prefill_seconds = Histogram(
            "drafter_prefill_seconds",
            "Prefill time of each batch",
            buckets=SECONDS_BUCKETS,
            registry=registry,
        )
        self.decode_seconds = Histogram(
            "drafter_decode_seconds",
            "k-step decode loop time of each batch",
            buckets=SECONDS_BUCKETS,
            registry=registry,
        )
        self.batch_size = Histogram(
            "drafter_batch_size",
            "Requests drafted together in one engine batch",
            buckets=tuple(range(1, max_batch_size + 1)),
            registry=registry,
        )
        self.inline_batches = Counter(
            "drafter_inline_batches",
            "Batches of one drafted on the event loop's own thread (short, lone requests: drafter/scheduling/inline.py)",
            registry=registry,
        )
        self.in_flight = Gauge(
            "drafter_requests_in_flight", "/draft requests being handled now", registry=registry
        )
        self.queue_depth = Gauge(
            "drafter_queue_depth", "Validated requests waiting for the engine", registry=registry
        )
        self.rejections = Counter(
            "drafter_rejections", "Requests refused, by reason", ["reason"], registry=registry
        )
        self.draft_tokens = Counter(
            "drafter_draft_tokens", "Draft tokens returned to clients", registry=registry
        )
        self.cache_tokens = Counter(
            "drafter_cache_tokens",
            "Context tokens served from the KV cache (reused) or computed (prefilled)",
            ["kind"],
            registry=registry,
        )
        self.evictions = Counter(
            "drafter_evictions", "Requests that evicted another conversation's KV slot", registry=registry
        )
        self.shared_tokens = Counter(
            "drafter_prefix_shared_tokens",
            "Context tokens served from pages another conversation computed (a subset of reused)",
            registry=registry,
        )
        self.kv_pages = Gauge(
            "drafter_kv_cache_pages",
            "Pages of the KV-cache pool: used (held by a conversation), idle (cached, evictable), free",
            ["state"],
            registry=registry,
        )
        self.kv_evicted_sequences = Gauge(
            "drafter_kv_cache_evicted_sequences",
            "Conversations evicted from the KV cache since start (least recently used first)",
            registry=registry,
        )
        self.ready = Gauge("drafter_ready", "1 when the engine is ready to draft", registry=registry)
        # Speculation outcomes, vLLM's names under our prefix. Counted when the next call of a session
        # shows what the target kept, so a rate over them covers exactly the drafts that were verified.
        self.spec_drafts = Counter(
            "drafter_spec_decode_num_drafts",
            "Verified drafts (rounds with at least one draft)",
            registry=registry,
        )
        self.spec_draft_tokens = Counter(
            "drafter_spec_decode_num_draft_tokens", "Draft tokens in verified drafts", registry=registry
        )
        self.spec_accepted_tokens = Counter(
            "drafter_spec_decode_num_accepted_tokens", "Draft tokens the target accepted", registry=registry
        )
        self.spec_accepted_per_pos = Counter(
            "drafter_spec_decode_num_accepted_tokens_per_pos",
            "Draft tokens the target accepted, by position in the draft (0 = first)",
            ["position"],
            registry=registry,
        )
        self.sessions_live = Gauge("drafter_sessions_live", "Sessions the server holds", registry=registry)
        # By source (drafter.sessions.draft_source): a hybrid draft's suffix head counts as suffix tokens.
        self.answers_by_source = Counter(
            "drafter_answers_by_source",
            "Answers by the source that made the draft: model, suffix or hybrid (a suffix head, then the model)",
            ["source"],
            registry=registry,
        )
        self.source_draft_tokens = Counter(
            "drafter_spec_decode_num_draft_tokens_by_source",
            "Draft tokens in verified drafts, by the source of each token (model or suffix)",
            ["source"],
            registry=registry,
        )
        self.source_accepted_tokens = Counter(
            "drafter_spec_decode_num_accepted_tokens_by_source",
            "Draft tokens the target accepted, by the source of each token (model or suffix)",
            ["source"],
            registry=registry,
        )
        self.suffix_index_tokens = Gauge(
            "drafter_suffix_index_tokens",
            "Tokens in the suffix indexes: local (all sessions' own) and global (recent responses)",
            ["index"],
            registry=registry,
        )
        self.suffix_pending_tokens = Gauge(
            "drafter_suffix_pending_tokens",
            "Context tokens waiting to be indexed (indexing runs after answering, in slices)",
            registry=registry,
        )

    def add_ahead(self, max_draft_tokens: int) -> None:
        """Drafting ahead's series (drafter/sessions/ahead.py), only on a server that drafts ahead."""
        registry = self.registry
        self.ahead_plans = Counter(
            "drafter_ahead_plans",
            "Sessions' branch sets drafted ahead, by outcome: drafted (kept for the next call), preempted (a "
            "real request came first, or no room beside the cached conversations), stale (the session moved on), "
            "too_slow (not drafted: the session's calls come sooner than a loop would finish, or its pace is "
            "not known yet: its first call)",
            ["outcome"],
            registry=registry,
        )
        self.ahead_branches = Counter(
            "drafter_ahead_branches", "Branches drafted ahead (likely next contexts)", registry=registry
        )
        self.ahead_calls = Counter(
            "drafter_ahead_calls",
            "Session calls by what drafting ahead had for them: hit (answered from a branch, no engine work), "
            "miss (branches, none matched), not_ready (no branches)",
            ["outcome"],
            registry=registry,
        )
        hits_at = Counter(
            "drafter_ahead_hits_by_accepted",
            "Calls answered from a branch, by how many of the last drafts the target accepted",
            ["accepted"],
            registry=registry,
        )
        self.ahead_hits_at = [hits_at.labels(str(a)) for a in range(max_draft_tokens + 1)]
        self.ahead_wasted_steps = Counter(
            "drafter_ahead_wasted_steps",
            "Decode steps of ahead loops whose branches went unused (each step drafts every branch)",
            registry=registry,
        )
        self.ahead_branch_pages = Gauge(
            "drafter_ahead_branch_pages",
            "KV-cache pages held by branches alone (the first to go under pressure)",
            registry=registry,
        )

    def watch_cache(self, engine) -> None:
        """Page gauges read the engine's tables when scraped (plain ints: no lock, no device access)."""
        # engine.table is read at each scrape: reset_cache replaces it.
        self.kv_pages.labels("used").set_function(lambda: engine.table.pages_in_use)
        self.kv_pages.labels("idle").set_function(lambda: len(engine.table.index.idle))
        self.kv_pages.labels("free").set_function(lambda: engine.table.allocator.num_free)
        self.kv_evicted_sequences.set_function(lambda: engine.table.counters.evicted_sequences)
        self.registry.register(RecompileCollector(engine.recompiles))

    def watch_suffix(self, suffix) -> None:
        self.suffix_index_tokens.labels("local").set_function(lambda: suffix.num_local)
        self.suffix_index_tokens.labels("global").set_function(lambda: len(suffix.global_index))
        self.suffix_pending_tokens.set_function(lambda: suffix.pending_tokens)

    def watch_adaptation(self, adapt) -> None:
        self.registry.register(AdaptationCollector(adapt))

    def render(self) -> bytes:
        return generate_latest(self.registry)
