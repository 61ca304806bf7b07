"""The routes that describe the server rather than draft: liveness, readiness, /info and /metrics."""

from __future__ import annotations

import platform
from importlib import metadata

from starlette.requests import Request
from starlette.responses import Response

from drafter.server.auth import require_auth
from drafter.server.errors import OrjsonResponse
from drafter.server.runtime import Runtime


async def live(request: Request) -> OrjsonResponse:
    """200 while the process and its event loop run and the engine has not failed beyond recovery."""
    runtime: Runtime = request.app.state.runtime
    if not runtime.alive:
        return OrjsonResponse({"status": "failed", "reason": runtime.lifecycle.reason}, status_code=503)
    return OrjsonResponse({"status": "alive"})


async def ready(request: Request) -> OrjsonResponse:
    """200 only once loaded, compiled, captured and warmed up, and not draining or failed."""
    runtime: Runtime = request.app.state.runtime
    body = {"ready": runtime.ready, "stage": runtime.stage, "lifecycle": runtime.lifecycle.snapshot()}
    return OrjsonResponse(body, status_code=200 if runtime.ready else 503)


async def info(request: Request) -> OrjsonResponse:
    runtime: Runtime = request.app.state.runtime
    config = runtime.config
    require_auth(request, config.api_key)
    engine_info = runtime.engine.info() if runtime.engine is not None else {"model": config.model}
    body = {
        **engine_info,
        "protocol_versions": [1, 2],
        "stage": runtime.stage,
        "lifecycle": runtime.lifecycle.snapshot(),
        "server": {
            "max_queue": config.max_queue,
            "batch_window_ms": config.batch_window_ms,
            "inline": runtime.inline.describe() if runtime.inline else {"max_ms": config.inline_max_ms},
            "request_timeout_s": config.request_timeout_s,
            "default_num_draft_tokens": config.default_num_draft_tokens,
            "max_body_bytes": config.max_body_bytes,
            "max_batch_rows": config.max_queue,  # rows of one /draft/batch request
            "auth": config.api_key is not None,
        },
        "versions": versions(),
    }
    if runtime.speculation is not None:
        speculation = runtime.speculation
        body["sessions"] = speculation.sessions.describe()
        body["draft_length_policy"] = speculation.policy.describe()
        body["speculation"] = speculation.describe()
        if runtime.ahead is not None:
            body["draft_ahead"] = {
                **runtime.ahead.ahead.describe(),
                "branch_pages": runtime.engine.branch_pages,
                "top_choices": runtime.engine.config.top_choices,
                "step_ms": runtime.engine.ahead_step_ms,  # an ahead loop's wall time per decode step, lately
            }
        else:
            body["draft_ahead"] = {"branches_per_session": 0}
    body["adaptation"] = runtime.adapt.describe() if runtime.adapt is not None else {"enabled": False}
    return OrjsonResponse(body)


async def metrics(request: Request) -> Response:
    runtime: Runtime = request.app.state.runtime
    require_auth(request, runtime.config.api_key)
    return Response(runtime.metrics.render(), media_type=runtime.metrics.content_type)


def versions() -> dict[str, str]:
    found = {"python": platform.python_version()}
    for package in ("drafter", "torch", "torchao", "starlette", "hypercorn", "orjson"):
        try:
            found[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            found[package] = "not installed"
    return found
