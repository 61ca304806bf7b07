"""What the engine is asked and what it answers, and the checks that keep bad requests off the device."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np


class DraftError(ValueError):
    """A request the engine refuses before touching the device; `param` names the offending field."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


@dataclass(frozen=True, slots=True)
class DraftRequest:
    tokens: Sequence[int]  # the whole context
    num_draft_tokens: int
    session: str | None = None  # a hint naming the conversation, for cache placement
    # Keep each step's top choices, and run the step after the last draft (drafting ahead plans from them).
    # Eager loops pay for both only when a request asks; static-shape loops always run them (engine.py).
    choices: bool = False


@dataclass(frozen=True, slots=True)
class DraftResult:
    tokens: list[int]  # the new draft tokens only
    probs: list[float]  # the drafter's probability of each draft token
    cached: int  # context tokens served from the KV cache
    prefilled: int  # context tokens computed for this request
    evicted: bool  # this request evicted another conversation's cached pages
    prefill_ms: float  # of the whole batch
    decode_ms: float  # of the whole batch
    engine_ms: float = 0.0  # the whole batch's call: cache lookup, prefill, decode, readback, bookkeeping
    shared: int = 0  # of `cached`, tokens found on other conversations' pages (the prefix index)
    num_steps: int = 0  # decode steps the batch's loop ran (a captured tier plus the step ahead: >= k)
    # With top choices on (engine/ahead.py): per position 0..k, the likeliest tokens there as (id, prob)
    # pairs, best first; position k is the step after the last draft.
    choices: list[list[tuple[int, float]]] = field(default_factory=list)
    weights_version: int = 0  # the engine's weights version that drafted it (Engine.swap_weights)


@dataclass(slots=True)
class EngineStats:
    requests: int = 0
    tokens_reused: int = 0
    tokens_prefilled: int = 0
    draft_tokens: int = 0
    evictions: int = 0
    shared_tokens: int = 0
    batch_sizes: Counter = field(default_factory=Counter)

    def add(self, results: list[DraftResult]) -> None:
        """Count one batch's results."""
        self.requests += len(results)
        self.batch_sizes[len(results)] += 1
        for result in results:
            self.tokens_reused += result.cached
            self.tokens_prefilled += result.prefilled
            self.draft_tokens += len(result.tokens)
            self.evictions += result.evicted
            self.shared_tokens += result.shared


def as_token_array(
    request: DraftRequest, vocab_size: int, max_seq_len: int, max_draft_tokens: int
) -> np.ndarray:
    """The request's context as int64, or a DraftError naming the field and the bound it breaks."""
    k = request.num_draft_tokens
    if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= max_draft_tokens:
        raise DraftError(
            f"num_draft_tokens must be an integer in [1, {max_draft_tokens}]", "num_draft_tokens"
        )
    tokens = request.tokens
    if len(tokens) == 0:
        raise DraftError("tokens must not be empty", "tokens")
    if len(tokens) + k > max_seq_len:
        raise DraftError(
            f"len(tokens) + num_draft_tokens must be at most {max_seq_len}, got {len(tokens)} + {k}", "tokens"
        )
    if isinstance(tokens, np.ndarray):
        if tokens.dtype.kind not in "iu":
            raise DraftError("tokens must be integers", "tokens")
    elif set(map(type, tokens)) != {int}:  # one C-level pass; refuses bool, float and str alike
        raise DraftError("tokens must be integers", "tokens")
    array = np.asarray(tokens, dtype=np.int64)
    if array.min() < 0 or array.max() >= vocab_size:
        raise DraftError(f"token ids must be in [0, {vocab_size})", "tokens")
    return array
