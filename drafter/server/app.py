"""The Starlette app: routes as a plain list, a lifespan that starts the engine in the background, and
one exception-handler map. `create_app(config)` is all a server (or a test) needs.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.routing import Route

from drafter.server.batch_route import draft_batch
from drafter.server.config import ServerConfig
from drafter.server.draft_route import draft
from drafter.server.errors import EXCEPTION_HANDLERS
from drafter.server.request_body import AnswerEarlyThenDrain
from drafter.server.runtime import Runtime
from drafter.server.session_routes import close_session
from drafter.server.status_routes import info, live, metrics, ready

ROUTES = [
    Route("/draft", draft, methods=["POST"]),
    Route("/draft/batch", draft_batch, methods=["POST"]),
    Route("/health/live", live, methods=["GET"]),
    Route("/health/ready", ready, methods=["GET"]),
    Route("/info", info, methods=["GET"]),
    Route("/metrics", metrics, methods=["GET"]),
    Route("/sessions/{name}", close_session, methods=["DELETE"]),
]


def create_app(config: ServerConfig) -> Starlette:
    runtime = Runtime(config)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        # Returns at once: load and warmup continue in the background, gated by readiness.
        await runtime.start()
        try:
            yield
        finally:
            await runtime.close()

    finish_body = Middleware(
        AnswerEarlyThenDrain, deadlines=runtime.body_deadlines, max_discard_bytes=config.max_body_bytes
    )
    app = Starlette(
        routes=ROUTES, middleware=[finish_body], exception_handlers=EXCEPTION_HANDLERS, lifespan=lifespan
    )
    # No slash redirects: `/health/live/` would answer 307 with a Location built from the client's Host
    # header (an open redirect). It is a 404 like any other unknown path.
    app.router.redirect_slashes = False
    app.state.runtime = runtime
    app.state.metrics = runtime.metrics
    return app
