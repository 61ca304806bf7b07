"""What a draft call gives back (`Drafts`) and the one exception a caller's bug raises (`DraftRequestError`).

No I/O and no torch here: these are plain values a target can keep, log or compare.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Why a call returned no drafts without raising (the failure policy: speculation is optional);
# context_too_long: the context leaves no room for a draft within the server's max context.
SKIP_REASONS = (
    "overloaded",
    "not_ready",
    "timeout",
    "unreachable",
    "server_error",
    "backing_off",
    "context_too_long",
)


@dataclass(frozen=True, slots=True)
class Drafts:
    """One answer. `tokens` may be empty: the target then decodes one token on its own, which is always
    correct. `skipped` says why no request was answered (one of SKIP_REASONS), None when the server drafted.

    `cached`: context tokens the server took from its KV cache (the rest it prefilled).
    `accepted`: how many of the drafts last returned to this session the new context kept (server v2 only).
    `num_draft_tokens`: the k the server drafted (v2; with "auto" it may be below the k asked, even 0).
    `source`: which source made the draft ("model", "suffix" or "hybrid"; None from servers before suffix
    drafting), and `suffix_tokens`: how many of `tokens` (the first ones) came from the suffix index.
    `server_timing_ms`: the `Server-Timing` header, stage -> milliseconds (queue, prefill,
    decode, engine: the whole engine call; suffix: the suffix lookup).
    """

    tokens: list[int]
    probs: list[float] | None = None
    cached: int | None = None
    accepted: int | None = None
    num_draft_tokens: int | None = None
    source: str | None = None
    suffix_tokens: int = 0
    server_timing_ms: dict[str, float] = field(default_factory=dict)
    skipped: str | None = None

    @classmethod
    def none(cls, reason: str) -> Drafts:
        return cls(tokens=[], skipped=reason)


class DraftRequestError(Exception):
    """The server refused the request as malformed or unauthorized (a 4xx other than 409 session_unknown and
    429): the caller's bug, so it raises instead of silently turning speculation off."""

    def __init__(self, status: int, type: str, message: str, param: str | None = None):
        super().__init__(f"HTTP {status} {type}: {message}" + (f" (param {param})" if param else ""))
        self.status, self.type, self.message, self.param = status, type, message, param
