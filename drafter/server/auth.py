"""Optional bearer-token auth. When an API key is configured, /draft, /info and /metrics need
`Authorization: Bearer <key>`; the health probes stay open, because orchestrators probe without
credentials and the probes reveal only the serving stage.
"""

from __future__ import annotations

import hmac

from starlette.requests import Request

from drafter.server.errors import ApiError


def require_auth(request: Request, api_key: str | None) -> None:
    if api_key is None:
        return
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    # Constant-time compare, so response timing does not leak how much of a guess was right.
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), api_key.encode()):
        raise ApiError(
            401,
            "unauthorized",
            "missing or wrong API key: send Authorization: Bearer <key>",
            headers={"WWW-Authenticate": "Bearer"},
        )
