"""The operator console: a Starlette app that talks to NATS on the server side only.

Pages (static HTML + one script, served from the package) read JSON from ``/api/...`` and follow
server-sent events: ``/api/stream`` (the index changed: loops and gates pages refresh) and
``/api/loops/<id>/stream`` (a loop's committed records, ids = stream sequences, plus its live
events). Every action goes through the loop API with a command id (the page mints one per click,
so a retried request is applied once).

Checks on every ``/api`` request: the token (``LW_CONSOLE_TOKEN``, header ``X-Loopwire-Token``)
when one is configured, and for state-changing requests an origin that is this console's own.
The routes are listed in :mod:`services.console.routes`, handled by :class:`~services.console.api.ConsoleApi`.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from typing import Final

import anyio
import nats.errors
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from services.console.api import ConsoleApi
from services.console.index import LoopIndex
from services.console.pages import error_page
from services.console.routes import build_routes
from shared.connect import connect
from shared.errors import ErrorKind, LoopwireError
from shared.settings import Settings

log = logging.getLogger("loopwire.console")

# How long the console waits at start-up for its index to catch up before it serves anyway.
INDEX_WAIT_SECONDS: Final = 3.0


def build_app(settings: Settings, *, token: str = "") -> Starlette:
    api = ConsoleApi(settings, token=token)
    return Starlette(
        routes=build_routes(api),
        lifespan=_lifespan(api),
        exception_handlers={HTTPException: http_error, Exception: http_error},
    )


def _lifespan(api: ConsoleApi) -> Callable[[Starlette], AbstractAsyncContextManager[None]]:
    """While the app serves: the NATS connection, the index and the tool registry, set on ``api``."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        from services.toolcaller.registry import ToolRegistry

        settings = api.settings
        nc = await connect(settings, name="loopwire-console", max_reconnect_attempts=-1, reconnect_time_wait=0.5)
        api.nc = nc
        index = api.index = LoopIndex(nc, settings)
        registry = ToolRegistry(nc, settings.names, replicas=settings.replicas)

        async def load_registry() -> None:
            while True:
                try:
                    await registry.start()
                except (LoopwireError, nats.errors.Error, TimeoutError) as e:
                    log.warning("tool registry not available yet (%s); retrying", e)
                    await anyio.sleep(1)
                else:
                    api.registry = registry
                    return

        try:
            # The index and the registry follow as soon as JetStream has them. The console serves
            # once its index has caught up with the stored history, so a console that says it is
            # up answers (with a committer running that takes milliseconds); with no history stream
            # yet it serves after INDEX_WAIT_SECONDS anyway and says what it waits for.
            async with anyio.create_task_group() as tg:
                tg.start_soon(index.start)
                tg.start_soon(load_registry)
                with anyio.move_on_after(INDEX_WAIT_SECONDS):
                    await index.ready.wait()
                yield
                tg.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True), anyio.move_on_after(3):
                with contextlib.suppress(Exception):
                    await registry.stop()
                await index.stop()
                with contextlib.suppress(Exception):
                    await nc.close()

    return lifespan


async def http_error(request: Request, exc: Exception) -> Response:
    """No route, a wrong method or a bug: a JSON error under ``/api/``, an error page elsewhere."""
    status = exc.status_code if isinstance(exc, HTTPException) else 500
    if status == 500:
        log.error("unexpected error on %s %s", request.method, request.url.path, exc_info=exc)
    message = {404: "no such page", 405: "method not allowed"}.get(status, "the console failed to answer")
    if request.url.path.startswith("/api/"):
        kind = {404: ErrorKind.NOT_FOUND.value, 500: "internal"}.get(status, ErrorKind.INVALID.value)
        return JSONResponse({"ok": False, "error": {"kind": kind, "message": message}}, status_code=status)
    return error_page(status, message.capitalize(), f"{request.method} {request.url.path}: {message}.")
