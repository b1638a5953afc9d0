"""The console service (``loopwire console``): the console app on uvicorn, with the one service
lifecycle (:mod:`services.lifecycle`)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Final

import anyio
import uvicorn
from anyio.abc import TaskStatus

from services.console.rules import is_loopback
from services.lifecycle import drain_on_cancel
from shared.errors import ServiceStartError
from shared.settings import Settings

TOKEN_VAR: Final = "LW_CONSOLE_TOKEN"
# Open pages hold event streams; on a stop they are cut after this long (the pages reconnect).
GRACEFUL_SECONDS: Final = 1


class _Server(uvicorn.Server):
    # Signals are the runner's (services.runner); uvicorn's own handlers would replace them.
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def check_binding(host: str, token: str) -> str | None:
    """Why this binding is refused, or None."""
    if not is_loopback(host) and not token:
        return f"binding to {host} (not loopback) needs a token: set {TOKEN_VAR}"
    return None


class ConsoleService:
    """Serve the console on ``host:port`` (check the binding with :func:`check_binding` first)."""

    def __init__(self, settings: Settings, *, host: str, port: int, token: str) -> None:
        self.settings = settings
        self.host = host
        self.port = port
        self.token = token

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/"

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled (open event streams are cut after ``GRACEFUL_SECONDS``); raises
        :class:`~shared.errors.ServiceStartError` when uvicorn stops before it serves (e.g. the port is taken)."""
        await drain_on_cancel(self._serve, task_status=task_status)

    async def _serve(self, stop: anyio.Event, task_status: TaskStatus[None]) -> None:
        from services.console.app import build_app

        config = uvicorn.Config(
            build_app(self.settings, token=self.token),
            host=self.host,
            port=self.port,
            log_level="warning",
            access_log=False,
            timeout_graceful_shutdown=GRACEFUL_SECONDS,
            lifespan="on",
        )
        server = _Server(config)
        failed = False
        async with anyio.create_task_group() as tg:

            async def run() -> None:
                nonlocal failed
                await server.serve()
                failed = not server.should_exit and not server.started  # e.g. the port is taken
                stop.set()  # it stopped by itself

            tg.start_soon(run)
            # uvicorn says it serves only through this flag.
            while not server.started and not stop.is_set():  # noqa: ASYNC110
                await anyio.sleep(0.05)
            if server.started:
                print(f"console at {self.url}", flush=True)
                task_status.started()
            await stop.wait()
            server.should_exit = True
        if failed:
            raise ServiceStartError(f"the console could not start on {self.host}:{self.port} (see the messages above)")
