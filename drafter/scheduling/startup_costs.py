"""What drafting costs on this engine, measured once at startup: the figures auto's draft length weighs
(drafter/sessions/draft_length.py) and those that decide which lone requests the event loop may draft itself
(drafter/scheduling/inline.py). Runs on the engine thread, after warmup."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine.engine import Engine
from engine.requests import DraftRequest

PREFILL_PROBE_TOKENS = 512  # long enough that a prefill's fixed cost is a small part of it
# Where no draft could run inline (a CPU with a large model) a short probe still prices a backlog of prefill
# for `"auto"`'s batch rows (drafter.sessions.batch_rows.backlog): ~1 s for the real pair's 0.5B on 2 cores.
SHORT_PREFILL_PROBE_TOKENS = 64


@dataclass(frozen=True, slots=True)
class StartupCosts:
    base_ms: float  # a draft call's fixed cost, without its decode steps
    step_ms: float  # one decode step
    prefill_token_ms: float  # one more uncached context token


def measure(engine: Engine, inline_max_ms: float, repeats: int = 5) -> StartupCosts:
    """The fixed and per-step cost from the fastest of a few drafts at k = 1 and k = max over an already
    cached context, each divided by the steps the engine's loop ran for it (a captured tier plus the step
    ahead under CUDA graphs: 5 and 17 for k = 1 and 16 with tiers 4, 8, 16); the prefill rate from two fresh
    contexts where a short draft could run inline at all, else from one short one (on a CPU with a large model
    a long probe would take seconds; a short one overstates a token's cost a little, the safe side)."""
    max_k = engine.config.max_draft_tokens
    vocab = engine.loaded.config.vocab_size
    length = min(32, engine.config.max_seq_len - max_k)
    context = np.arange(length, dtype=np.int64) % vocab
    engine.draft_batch([DraftRequest(context, 1)])  # caches the context; later calls only decode

    def fastest(k: int) -> float:
        results = [engine.draft_batch([DraftRequest(context, k)])[0] for _ in range(repeats)]
        return min(r.prefill_ms + r.decode_ms for r in results)

    one, longest = fastest(1), fastest(max_k)
    steps_one, steps_longest = engine.decode_steps(1), engine.decode_steps(max_k)
    step_ms = max(longest - one, 0.0) / max(steps_longest - steps_one, 1)
    base_ms = max(one - steps_one * step_ms, 0.0)
    inline = inline_max_ms > 0 and one <= inline_max_ms
    probe = min(
        PREFILL_PROBE_TOKENS if inline else SHORT_PREFILL_PROBE_TOKENS, engine.config.max_seq_len - max_k - 1
    )
    rates = []
    # Fresh contexts: no prefix of them is cached (the one above starts at 0).
    for start in (1, 2) if inline else (1,):
        fresh = (start + 7 * np.arange(probe, dtype=np.int64)) % vocab
        result = engine.draft_batch([DraftRequest(fresh, 1)])[0]
        rates.append(result.prefill_ms / max(result.prefilled, 1))
    return StartupCosts(base_ms, step_ms, min(rates))
