"""Run one service (:mod:`services.lifecycle`) in the foreground of a process: logging, metrics,
telemetry, SIGTERM/SIGINT → cancel → drain, the READY line, the exit status."""

from __future__ import annotations

import importlib.util
import logging
import signal
import sys
from collections.abc import Awaitable, Callable

import anyio
from anyio.abc import TaskStatus

from services.lifecycle import Service, raise_single
from shared import logfmt, metrics, telemetry
from shared.logfmt import JsonFormatter
from shared.procs import READY_LINE
from shared.settings import Settings


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


def run_service(name: str, service: Service, settings: Settings) -> int:
    """Run ``service`` until SIGTERM/SIGINT cancels it (then it drains); 0 on a graceful stop.

    Prints ``READY`` on stdout once the service serves (``shared.procs`` waits for that line).
    """
    setup_logging(settings, name)
    telemetry.configure(name)
    metrics.serve(settings.metrics_port)
    log = logging.getLogger(name)

    async def main() -> None:
        # Signals are caught from the start: one during start-up stops the service once it is up.
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async with anyio.create_task_group() as tg:

                async def on_signals() -> None:
                    async for _ in signals:
                        log.info("stopping (signal)")
                        tg.cancel_scope.cancel()
                        return

                async def serve(*, task_status: TaskStatus[None]) -> None:
                    await service.run(task_status=task_status)
                    tg.cancel_scope.cancel()  # it ended by itself

                tg.start_soon(on_signals)
                await tg.start(serve)
                print(READY_LINE, flush=True)
                log.info("ready")

    try:
        anyio.run(_unwrapped, main, backend_options=event_loop_options(settings))
    except KeyboardInterrupt:
        return 130
    finally:
        telemetry.shutdown()
    return 0


async def _unwrapped(main: Callable[[], Awaitable[None]]) -> None:
    try:
        await main()
    except BaseExceptionGroup as group:
        raise_single(group)
