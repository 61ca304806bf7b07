"""The boundary: a `/draft` body (or a `/draft/batch` row) becomes a `DraftParams` (drafter/draft_params.py)
or an `ApiError` naming the field and its bound.

Nothing here touches the engine, and no message repeats what the client sent, not even an unknown field's
name (a client reflecting it would be an injection vector): the message lists the allowed fields instead.
"""

from __future__ import annotations

import array
from dataclasses import dataclass

import numpy as np
import orjson

from drafter.draft_params import AUTO, DraftParams
from drafter.server.config import MAX_SESSION_CHARS
from drafter.server.errors import ApiError, invalid

FIELDS = (
    "tokens",
    "num_draft_tokens",
    "session",
    "min_confidence",
    "return_probs",
    "prefix_len",
    "session_token",
    "close",
    "source",
)
BATCH_FIELDS = ("requests",)
MAX_SESSION_TOKEN_CHARS = 64


@dataclass(frozen=True, slots=True)
class Limits:
    vocab_size: int
    max_seq_len: int  # context + draft
    max_draft_tokens: int
    default_num_draft_tokens: int | str  # or AUTO
    max_body_bytes: int
    sources: tuple[str, ...] = ("model",)  # the draft sources this server offers (suffix drafting on or off)


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


FEW_TOKENS = 32  # up to this many are checked in Python: a v2 body of 8 tokens parses in 5.5 us, not 10.8


def is_int(value) -> bool:
    return type(value) is int  # bool is a subclass of int; JSON true is not a token id or a count


def parse_draft_body(body: bytes, limits: Limits) -> DraftParams:
    return parse_draft_fields(json_object(body, limits.max_body_bytes), limits)


def json_object(body: bytes, max_body_bytes: int) -> dict:
    if len(body) > max_body_bytes:
        raise too_large(max_body_bytes)
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise invalid("request body must be valid JSON") from None
    if not isinstance(data, dict):
        raise invalid("request body must be a JSON object")
    return data


def parse_draft_fields(data: dict, limits: Limits) -> DraftParams:
    """One draft call's fields (a /draft body, or one row of a /draft/batch body)."""
    if any(key not in FIELDS for key in data):
        raise invalid(f"unknown field; allowed fields: {', '.join(FIELDS)}")
    # JSON null means "not given" for every optional field, as most JSON APIs treat it.
    k = parse_num_draft_tokens(data.get("num_draft_tokens"), limits)
    session = parse_session(data.get("session"))
    session_token = parse_session_token(data.get("session_token"))
    prefix_len = parse_prefix_len(data.get("prefix_len"), session, session_token, limits)
    return DraftParams(
        tokens=parse_tokens(data.get("tokens"), prefix_len, 1 if k == AUTO else k, limits),
        num_draft_tokens=k,
        session=session,
        min_confidence=parse_min_confidence(data.get("min_confidence")),
        return_probs=parse_flag(data.get("return_probs"), "return_probs"),
        prefix_len=prefix_len,
        session_token=session_token,
        close=parse_flag(data.get("close"), "close"),
        source=parse_source(data.get("source"), limits),
    )


def parse_source(source, limits: Limits) -> str | None:
    if source is None or (isinstance(source, str) and source in limits.sources):
        return source
    offered = ", ".join(f'"{name}"' for name in limits.sources)
    more = (
        "" if len(limits.sources) > 1 else " (this server runs with suffix drafting off: --suffix-tokens 0)"
    )
    raise invalid(f"source must be one of {offered}{more}", "source")


def parse_num_draft_tokens(k, limits: Limits) -> int | str:
    if k is None:
        return limits.default_num_draft_tokens
    if k == AUTO or (is_int(k) and 1 <= k <= limits.max_draft_tokens):
        return k
    raise invalid(
        f'num_draft_tokens must be an integer in [1, {limits.max_draft_tokens}] or "auto"', "num_draft_tokens"
    )


def parse_prefix_len(
    prefix_len, session: str | None, session_token: str | None, limits: Limits
) -> int | None:
    """A v2 call: how many tokens of the session's sequence its context starts with."""
    if prefix_len is None:
        return None
    if not is_int(prefix_len) or not 0 <= prefix_len <= limits.max_seq_len:
        raise invalid(f"prefix_len must be an integer in [0, {limits.max_seq_len}]", "prefix_len")
    if session is None or session_token is None:
        raise invalid(
            "prefix_len needs session and session_token (from the answer to a full-context call)", "session"
        )
    return prefix_len


def parse_tokens(tokens, prefix_len: int | None, num_draft_tokens: int, limits: Limits) -> np.ndarray:
    """The token ids as int64, converted once here: the sessions and the engine take the array as it is
    (converting and checking a 2k-token list costs ~0.1 ms in Python, ~25 us this way)."""
    if tokens is None:
        raise invalid("tokens is required: the whole context as a list of token ids", "tokens")
    if not isinstance(tokens, list):
        raise invalid("tokens must be a list of integers", "tokens")
    if not tokens and not prefix_len:  # an incremental call may add nothing to a non-empty prefix
        raise invalid("tokens must not be empty (unless prefix_len is at least 1)", "tokens")
    context_len = len(tokens) + (prefix_len or 0)
    if context_len + num_draft_tokens > limits.max_seq_len:
        # Worded for the form the caller used: a full-context (v1) call never sent a prefix_len.
        total = (
            "len(tokens) + num_draft_tokens"
            if prefix_len is None
            else "prefix_len + len(tokens) + num_draft_tokens"
        )
        raise invalid(
            f"{total} must be at most {limits.max_seq_len} (the max context), got {context_len} + {num_draft_tokens}",
            "tokens",
        )
    if not tokens:
        return np.zeros(0, dtype=np.int64)
    vocab = limits.vocab_size
    if len(tokens) <= FEW_TOKENS:  # a v2 call's new tokens: plain Python beats numpy's fixed costs
        if not all(type(token) is int for token in tokens):
            raise not_integers()
        if not all(0 <= token < vocab for token in tokens):
            raise out_of_range(vocab)
        return np.array(tokens, dtype=np.int64)
    try:  # one C-level pass that refuses floats, strings, null, lists and objects
        ids = np.frombuffer(array.array("q", tokens), dtype=np.int64)
    except TypeError:
        raise not_integers() from None
    except OverflowError:  # orjson reads integers up to 2**64 - 1; int64 holds less
        raise out_of_range(vocab) from None
    # array('q') takes JSON true and false for 1 and 0 (bool is an int): only those ids need a look.
    if any(type(tokens[i]) is not int for i in np.flatnonzero(ids <= 1)):
        raise not_integers()
    if ids.view(np.uint64).max() >= vocab:  # a negative id wraps past every vocabulary
        raise out_of_range(vocab)
    return ids


def not_integers() -> ApiError:
    return invalid("tokens must contain only integers (not booleans, floats or strings)", "tokens")


def out_of_range(vocab_size: int) -> ApiError:
    return invalid(f"every token id must be in [0, {vocab_size})", "tokens")


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


def parse_session_token(token) -> str | None:
    if token is None:
        return None
    if not isinstance(token, str) or not 0 < len(token) <= MAX_SESSION_TOKEN_CHARS:
        raise invalid(
            f"session_token must be a string of 1 to {MAX_SESSION_TOKEN_CHARS} characters", "session_token"
        )
    return token


def parse_flag(value, name: str) -> bool:
    if value is None:
        return False
    if not isinstance(value, bool):
        raise invalid(f"{name} must be true or false", name)
    return value


def parse_batch_body(body: bytes, max_body_bytes: int, max_rows: int) -> list:
    """A `/draft/batch` body, `{"requests": [draft call, ...]}`, as its rows (each still to be parsed with
    `parse_draft_fields`, so one bad row is that row's error, not the batch's). A row that is not a JSON
    object is given back as its ApiError."""
    data = json_object(body, max_body_bytes)
    if any(key not in BATCH_FIELDS for key in data):
        raise invalid(f"unknown field; allowed fields: {', '.join(BATCH_FIELDS)}")
    rows = data.get("requests")
    if not isinstance(rows, list) or not 1 <= len(rows) <= max_rows:
        raise invalid(f"requests must be a list of 1 to {max_rows} draft calls", "requests")
    return [row if isinstance(row, dict) else invalid("each request must be a JSON object") for row in rows]
