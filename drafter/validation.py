"""The boundary: a `/draft` body becomes a `DraftParams` or an `ApiError` naming the field and its bound.

Nothing here touches the engine, and no message repeats what the client sent, not even an unknown field's
name (a client reflecting it would be an injection vector): the message lists the allowed fields instead.
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from drafter.config import MAX_SESSION_CHARS
from drafter.errors import ApiError, invalid

FIELDS = ("tokens", "num_draft_tokens", "session", "min_confidence", "return_probs")


@dataclass(frozen=True, slots=True)
class Limits:
    vocab_size: int
    max_seq_len: int  # context + draft
    max_draft_tokens: int
    default_num_draft_tokens: int
    max_body_bytes: int


@dataclass(frozen=True, slots=True)
class DraftParams:
    tokens: list[int]
    num_draft_tokens: int
    session: str | None = None
    min_confidence: float = 0.0
    return_probs: bool = False


def check_content_type(header: str | None) -> None:
    media_type = (header or "").split(";", 1)[0].strip().lower()
    if media_type != "application/json":
        raise ApiError(415, "unsupported_media_type", "Content-Type must be application/json")


def too_large(max_body_bytes: int) -> ApiError:
    return ApiError(413, "payload_too_large", f"request body must be at most {max_body_bytes} bytes")


def check_content_length(header: str | None, max_body_bytes: int) -> None:
    """Refuse an announced oversized body before reading it; the bytes read are checked again later."""
    if header is None:
        return
    if not header.strip().isdigit():
        raise invalid("Content-Length must be a non-negative integer")
    if int(header) > max_body_bytes:
        raise too_large(max_body_bytes)


def is_int(value) -> bool:
    return type(value) is int  # bool is a subclass of int; JSON true is not a token id or a count


def parse_draft_body(body: bytes, limits: Limits) -> DraftParams:
    if len(body) > limits.max_body_bytes:
        raise too_large(limits.max_body_bytes)
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise invalid("request body must be valid JSON") from None
    if not isinstance(data, dict):
        raise invalid("request body must be a JSON object")
    if any(key not in FIELDS for key in data):
        raise invalid(f"unknown field; allowed fields: {', '.join(FIELDS)}")
    # JSON null means "not given" for every optional field, as most JSON APIs treat it.
    k = data.get("num_draft_tokens")
    if k is None:
        k = limits.default_num_draft_tokens
    elif not is_int(k) or not 1 <= k <= limits.max_draft_tokens:
        raise invalid(
            f"num_draft_tokens must be an integer in [1, {limits.max_draft_tokens}]", "num_draft_tokens"
        )
    return DraftParams(
        tokens=parse_tokens(data.get("tokens"), k, limits),
        num_draft_tokens=k,
        session=parse_session(data.get("session")),
        min_confidence=parse_min_confidence(data.get("min_confidence")),
        return_probs=parse_return_probs(data.get("return_probs")),
    )


def parse_tokens(tokens, num_draft_tokens: int, limits: Limits) -> list[int]:
    if tokens is None:
        raise invalid("tokens is required: the whole context as a list of token ids", "tokens")
    if not isinstance(tokens, list):
        raise invalid("tokens must be a list of integers", "tokens")
    if not tokens:
        raise invalid("tokens must not be empty", "tokens")
    if len(tokens) + num_draft_tokens > limits.max_seq_len:
        raise invalid(
            f"len(tokens) + num_draft_tokens must be at most {limits.max_seq_len} (the max context), "
            f"got {len(tokens)} + {num_draft_tokens}",
            "tokens",
        )
    if set(map(type, tokens)) != {int}:  # one C-level pass; refuses bool, float, str, null alike
        raise invalid("tokens must contain only integers (not booleans, floats or strings)", "tokens")
    if min(tokens) < 0 or max(tokens) >= limits.vocab_size:
        raise invalid(f"every token id must be in [0, {limits.vocab_size})", "tokens")
    return tokens


def parse_session(session) -> str | None:
    if session is None:
        return None
    if not isinstance(session, str) or len(session) > MAX_SESSION_CHARS:
        raise invalid(f"session must be a string of at most {MAX_SESSION_CHARS} characters", "session")
    return session


def parse_min_confidence(value) -> float:
    if value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 <= value <= 1.0:
        raise invalid("min_confidence must be a number in [0, 1]", "min_confidence")
    return float(value)


def parse_return_probs(value) -> bool:
    if value is None:
        return False
    if not isinstance(value, bool):
        raise invalid("return_probs must be true or false", "return_probs")
    return value
