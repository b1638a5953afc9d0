"""``loopwire console``: serve the console with uvicorn until SIGTERM/SIGINT (prints READY once it serves)."""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import Iterator
from typing import Final

import anyio
import uvicorn

from services.console.rules import is_loopback
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


def run_console(args: argparse.Namespace, settings: Settings) -> int:
    from services.cli.errors import CliError
    from services.console.app import build_app
    from services.runner import run_service

    token = os.environ.get(TOKEN_VAR, "")
    problem = check_binding(args.host, token)
    if problem:
        raise CliError(problem)

    async def serve(st: Settings, stop: anyio.Event, ready: anyio.Event) -> None:
        config = uvicorn.Config(
            build_app(st, token=token),
            host=args.host,
            port=args.port,
            log_level="warning",
            access_log=False,
            timeout_graceful_shutdown=GRACEFUL_SECONDS,
            lifespan="on",
        )
        server = _Server(config)
        async with anyio.create_task_group() as tg:

            async def run() -> None:
                await server.serve()
                stop.set()  # it stopped by itself (e.g. the port is taken)

            tg.start_soon(run)
            # uvicorn says it serves only through this flag.
            while not server.started and not stop.is_set():  # noqa: ASYNC110
                await anyio.sleep(0.05)
            if server.started:
                print(f"console at http://{_host_for_url(args.host)}:{args.port}/", flush=True)
                ready.set()
            await stop.wait()
            server.should_exit = True
        if not server.started:
            raise CliError(f"the console could not start on {args.host}:{args.port} (see the messages above)")

    return run_service("console", serve, settings)


def _host_for_url(host: str) -> str:
    return f"[{host}]" if ":" in host else host
