"""JSON in and out with orjson, and the one map that turns every error into the protocol's error shape:
`{"error": {"type", "message", "param"}}`. Messages name the field and the bound, never the input.

The rooms below the HTTP face raise their own errors (a session the table does not hold: `SessionUnknown`)
and know no status codes; `REFUSALS` says which answer each one means, here and nowhere else.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import orjson
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse

from drafter.sessions.table import SessionUnknown

log = logging.getLogger(__name__)


class OrjsonResponse(JSONResponse):
    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)


class ApiError(Exception):
    """An answer other than 200; `reason` labels the rejection in /metrics."""

    def __init__(
        self,
        status: int,
        type: str,
        message: str,
        param: str | None = None,
        headers: dict[str, str] | None = None,
        reason: str | None = None,
    ):
        super().__init__(message)
        self.status, self.type, self.message, self.param = status, type, message, param
        self.headers = headers or {}
        self.reason = reason or type


def invalid(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, "invalid_request", message, param)


def session_unknown() -> ApiError:
    return ApiError(
        409,
        "session_unknown",
        "the server does not hold this session (never seen, expired, closed or restarted), the "
        "session_token does not match, or prefix_len is past its sequence: resend the whole context "
        "without prefix_len, with the same session name, to get a new session_token",
        "session",
    )


# What the rooms below raise, and the answer each one means.
REFUSALS: dict[type[Exception], Callable[[], ApiError]] = {SessionUnknown: session_unknown}
REFUSED = (ApiError, *REFUSALS)  # what a route catches as a refusal; `as_api_error` gives its answer


def as_api_error(error: Exception) -> ApiError:
    """A refusal as its answer: an ApiError as it is, an error of a room below as the ApiError it means."""
    if isinstance(error, ApiError):
        return error
    return REFUSALS[type(error)]()


def error_response(error: ApiError) -> OrjsonResponse:
    body = {"error": {"type": error.type, "message": error.message, "param": error.param}}
    return OrjsonResponse(body, status_code=error.status, headers=error.headers)


HTTP_TYPES = {404: "not_found", 405: "method_not_allowed"}


async def on_api_error(request: Request, error: Exception) -> OrjsonResponse:
    error = as_api_error(error)
    metrics = getattr(request.app.state, "metrics", None)
    if metrics is not None:
        metrics.rejections.labels(error.reason).inc()
    return error_response(error)


async def on_http_exception(request: Request, error: Exception) -> OrjsonResponse:
    assert isinstance(error, HTTPException)
    status = error.status_code
    kind = HTTP_TYPES.get(status, "http_error")
    return error_response(ApiError(status, kind, str(error.detail), headers=dict(error.headers or {})))


async def on_unexpected(request: Request, error: Exception) -> OrjsonResponse:
    # Starlette logs the traceback after this answer; the client learns nothing about the internals.
    return error_response(ApiError(500, "internal_error", "internal server error"))


EXCEPTION_HANDLERS = {
    ApiError: on_api_error,
    **dict.fromkeys(REFUSALS, on_api_error),
    HTTPException: on_http_exception,
    Exception: on_unexpected,
}
