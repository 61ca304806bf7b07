"""What the server's drafts came to: verified draft tokens and accepted ones, by position and by source, and
answers by the source that made them; the figures `/info` shows under `speculation` and their Prometheus
counters. Counts only: what the policy learns from the same feedback lives in drafter.sessions.draft_length.
"""

from __future__ import annotations

from drafter.reporting import SpeculationMetrics
from drafter.sessions.draft_source import HYBRID, MODEL, SUFFIX

SOURCE_LABELS = (MODEL, SUFFIX)  # what each draft token came from; a hybrid draft has tokens of both


class AcceptanceTally:
    def __init__(self, metrics: SpeculationMetrics, max_draft_tokens: int):
        self.metrics = metrics
        self.num_drafts = self.num_draft_tokens = self.num_accepted_tokens = 0
        # By source: verified draft tokens, and accepted ones; answers by the source that made them.
        self.by_source = {label: [0, 0] for label in SOURCE_LABELS}
        self.answers_by_source = dict.fromkeys((MODEL, SUFFIX, HYBRID), 0)
        # Python lists: at most max_draft_tokens entries, updated on every call, where numpy's per-call
        # overhead would cost more than the loop.
        self.drafted_per_pos = [0] * max_draft_tokens
        self.accepted_per_pos = [0] * max_draft_tokens
        # Every position shows in /metrics from the start; children looked up once, not per call.
        self.accepted_at = [metrics.spec_accepted_per_pos.labels(str(i)) for i in range(max_draft_tokens)]

    def answered(self, source: str) -> None:
        self.answers_by_source[source] += 1
        self.metrics.answers_by_source.labels(source).inc()

    def record(self, num_drafted: int, num_accepted: int, head_len: int = 0) -> None:
        """A verified draft of `num_drafted` tokens (the first `head_len` from the suffix index) of which the
        target kept `num_accepted`."""
        metrics = self.metrics
        for label, drafted, kept in (
            (SUFFIX, head_len, min(num_accepted, head_len)),
            (MODEL, num_drafted - head_len, max(0, num_accepted - head_len)),
        ):
            if drafted:
                tally = self.by_source[label]
                tally[0] += drafted
                tally[1] += kept
                metrics.source_draft_tokens.labels(label).inc(drafted)
                metrics.source_accepted_tokens.labels(label).inc(kept)
        self.num_drafts += 1
        self.num_draft_tokens += num_drafted
        self.num_accepted_tokens += num_accepted
        for position in range(num_drafted):
            self.drafted_per_pos[position] += 1
        for position in range(num_accepted):
            self.accepted_per_pos[position] += 1
        metrics.spec_drafts.inc()
        metrics.spec_draft_tokens.inc(num_drafted)
        metrics.spec_accepted_tokens.inc(num_accepted)
        for counter in self.accepted_at[:num_accepted]:
            counter.inc()

    def describe(self) -> dict:
        drafted = self.drafted_per_pos
        per_position = [
            round(accepted / num, 4) if num else None
            for accepted, num in zip(self.accepted_per_pos, drafted, strict=True)
        ]
        return {
            "num_drafts": self.num_drafts,
            "num_draft_tokens": self.num_draft_tokens,
            "num_accepted_tokens": self.num_accepted_tokens,
            "mean_accepted_length": self.num_accepted_tokens / self.num_drafts if self.num_drafts else None,
            "acceptance_rate": (
                self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else None
            ),
            # P(accepted | the draft had this position), over verified drafts; null where none had it
            "acceptance_per_position": per_position,
            "num_drafted_per_position": list(drafted),
            "by_source": {
                label: {
                    "num_draft_tokens": drafted,
                    "num_accepted_tokens": kept,
                    "acceptance_rate": round(kept / drafted, 4) if drafted else None,
                }
                for label, (drafted, kept) in self.by_source.items()
            },
            "answers_by_source": dict(self.answers_by_source),
        }
