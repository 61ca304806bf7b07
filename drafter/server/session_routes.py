"""`DELETE /sessions/{name}`: a client closes its session, proving it holds it with the session token."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from drafter.server.auth import require_auth
from drafter.server.errors import ApiError
from drafter.server.runtime import Runtime

TOKEN_HEADER = "Drafter-Session-Token"


async def close_session(request: Request) -> Response:
    runtime: Runtime = request.app.state.runtime
    require_auth(request, runtime.config.api_key)
    token = request.headers.get(TOKEN_HEADER)
    speculation = runtime.speculation
    # One answer for "never existed", "already gone" and "wrong token": a name alone reveals nothing.
    if speculation is None or not token or not speculation.sessions.close(request.path_params["name"], token):
        raise ApiError(
            404,
            "session_unknown",
            f"no such session with that {TOKEN_HEADER} (never seen, expired, closed or restarted)",
            "session",
        )
    return Response(status_code=204)
