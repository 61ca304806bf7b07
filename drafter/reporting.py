"""What the rooms below the HTTP face report, as interfaces: the series a conversation's speculation counts
(`SpeculationMetrics`, drafter/sessions/speculation.py) and the batcher's (`BatcherMetrics`,
drafter/scheduling/batcher.py), each a `Protocol` of counters, gauges and histograms.

The HTTP face implements them with Prometheus (drafter/server/metrics.py `Metrics`, one registry per
server) and exposes them on /metrics; the rooms below count through these shapes alone, so they import
neither the HTTP face nor prometheus_client. Only the names and methods they use are listed here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol


class Counter(Protocol):
    def inc(self, amount: float = 1) -> None: ...


class LabelledCounter(Protocol):
    """A counter per label value (`labels("model")`, say)."""

    def labels(self, *values: str) -> Counter: ...


class Gauge(Protocol):
    def set(self, value: float) -> None: ...

    def set_function(self, read: Callable[[], float]) -> None: ...


class Histogram(Protocol):
    def observe(self, amount: float) -> None: ...


class SpeculationMetrics(Protocol):
    """Verified drafts and their acceptance, overall, by position and by source; answers by source; the
    sessions held."""

    spec_drafts: Counter
    spec_draft_tokens: Counter
    spec_accepted_tokens: Counter
    spec_accepted_per_pos: LabelledCounter  # by position in the draft, "0" first
    answers_by_source: LabelledCounter
    source_draft_tokens: LabelledCounter
    source_accepted_tokens: LabelledCounter
    sessions_live: Gauge


class BatcherMetrics(Protocol):
    """The queue, each batch's size and times, and what its requests found in the KV cache."""

    queue_depth: Gauge
    queue_wait_seconds: Histogram
    batch_size: Histogram
    prefill_seconds: Histogram
    decode_seconds: Histogram
    inline_batches: Counter
    cache_tokens: LabelledCounter  # "reused" or "prefilled"
    shared_tokens: Counter
    evictions: Counter
