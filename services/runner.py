"""Run a service in the foreground: logging, SIGTERM/SIGINT → graceful stop, exit status."""

from __future__ import annotations

import importlib.util
import logging
import signal
import sys
from collections.abc import Awaitable, Callable

import anyio

from shared import logfmt, metrics, telemetry
from shared.logfmt import JsonFormatter
from shared.procs import READY_LINE
from shared.settings import Settings

# serve(settings, stop, ready): runs until ``stop`` is set; sets ``ready`` once it serves.
ServeFn = Callable[[Settings, anyio.Event, anyio.Event], Awaitable[None]]


def setup_logging(settings: Settings, name: str) -> None:
    if settings.log_format == "json":
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(JsonFormatter(name))
        logfmt.ENABLED = True
        logging.basicConfig(level=getattr(logging, settings.log_level.upper(), logging.INFO), handlers=[handler])
        return
    logging.basicConfig(
        level=getattr(logging, settings.log_level.upper(), logging.INFO),
        format=f"%(asctime)s {name}[%(process)d] %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def event_loop_options(settings: Settings) -> dict[str, bool]:
    """asyncio backend options: uvloop when LW_UVLOOP is set and the package is installed."""
    if not settings.uvloop:
        return {}
    if importlib.util.find_spec("uvloop") is None:  # an optional extra (loopwire[bench])
        logging.getLogger("loopwire").warning("LW_UVLOOP is set but uvloop is not installed; using asyncio's loop")
        return {}
    return {"use_uvloop": True}


def run_service(name: str, serve: ServeFn, settings: Settings | None = None) -> int:
    """Run ``serve(settings, stop, ready)`` until SIGTERM/SIGINT sets ``stop``; 0 on a graceful stop."""
    settings = settings or Settings.from_env()
    setup_logging(settings, name)
    telemetry.configure(name)
    metrics.serve(settings.metrics_port)

    async def main() -> None:
        stop = anyio.Event()
        ready = anyio.Event()
        async with anyio.create_task_group() as tg:

            async def on_signals() -> None:
                with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                    async for _ in signals:
                        logging.getLogger(name).info("stopping (signal)")
                        stop.set()
                        return

            async def announce_ready() -> None:
                await ready.wait()
                # shared.procs waits for this line on stdout.
                print(READY_LINE, flush=True)
                logging.getLogger(name).info("ready")

            tg.start_soon(on_signals)
            tg.start_soon(announce_ready)
            await serve(settings, stop, ready)
            tg.cancel_scope.cancel()

    try:
        anyio.run(main, backend_options=event_loop_options(settings))
    except KeyboardInterrupt:
        return 130
    finally:
        telemetry.shutdown()
    return 0
