"""Run one service (:mod:`services.lifecycle`) in the foreground of a process: logging, metrics,
telemetry, SIGTERM/SIGINT → cancel → drain, the READY line, the exit status."""

from __future__ import annotations

import contextlib
import gc
import importlib.util
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Final, NoReturn

import anyio
from anyio.abc import TaskGroup

from services.lifecycle import Service, let_go, let_go_of_silent, raise_single
from services.synccheck import warn_unless_synced
from shared import layout, logfmt, metrics, telemetry
from shared.connect import broker_reachable, connect
from shared.errors import LoopwireError, NatsUnreachableError
from shared.logfmt import JsonFormatter
from shared.procs import READY_LINE
from shared.settings import Settings

# The last resort for a stop while no NATS server answers: every service stops within 5 s of SIGTERM.
STOP_WITHOUT_BROKER_SECONDS: Final = 4.5
# A signal this soon after the first is the same stop, not a second one (which exits at once): GNU
# timeout sends its SIGTERM both to the child and to the child's process group, and a Ctrl-C in a
# shell reaches every process of the group a supervisor may signal too. A person's second Ctrl-C
# comes later than this.
SAME_STOP_SECONDS: Final = 0.3


def env_settings(**overrides: object) -> Settings:
    """The environment's settings; a bad value ends the process with one ``error:`` line and status 1
    (a service refuses to start on it, never with a traceback)."""
    try:
        return Settings.from_env(None, **overrides)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        raise SystemExit(1) from None


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
    """asyncio backend options: uvloop unless LW_UVLOOP=0 or the package is missing (Windows).

    uvloop's event loop takes less CPU per message than asyncio's: a single loop's step was ~10 %
    faster and the committer's CPU per step ~25 % lower (docs/benchmarks.md).
    """
    if not settings.uvloop:
        return {}
    if importlib.util.find_spec("uvloop") is None:  # not installed where it does not build (Windows)
        logging.getLogger("loopwire").info("uvloop is not installed; using asyncio's own event loop")
        return {}
    return {"use_uvloop": True}


def tune_gc() -> None:
    """Run the cyclic garbage collector less often in a long-lived service.

    Each message makes short-lived objects by the dozen, so the default young-generation threshold
    (700 allocations) ran a collection every few messages, and the older generations, which hold the
    cached loop histories, were walked again and again. What start-up made (modules, settings,
    clients) is frozen out of every collection. 64 loops × 20 steps: about 9 % less CPU per step in
    alternated runs; a single loop's step latency is unchanged.
    """
    gc.freeze()
    gc.set_threshold(50_000, 50, 100)


def run_service(name: str, service: Service | Callable[[Settings], Service], settings: Settings) -> int:
    """Run ``service`` until SIGTERM/SIGINT cancels it (then it drains); 0 on a graceful stop.

    ``service`` is a loopwire service's factory: it is made with the deployment's settings, read at
    connect (:func:`_deployment`); a ready-made one runs with the settings it has. Prints ``READY``
    on stdout once the service serves (``shared.procs`` waits for that line).
    """
    setup_logging(settings, name)
    telemetry.configure(name)
    metrics.serve(settings.metrics_port)
    log = logging.getLogger(name)
    ready = False

    async def main() -> None:
        nonlocal ready
        # Caught from the start: a signal during start-up stops the service too (never abruptly).
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            stop = anyio.CancelScope()
            async with anyio.create_task_group() as watcher:
                watcher.start_soon(_cancel_on_signal, signals, stop, log, settings, watcher)
                with stop:
                    async with contextlib.AsyncExitStack() as stack:
                        running = service
                        if isinstance(running, type) or not isinstance(running, Service):  # a factory
                            running = running(await _deployment(stack, name, settings))
                        async with anyio.create_task_group() as tg:
                            await tg.start(running.run)
                            ready = True
                            print(READY_LINE, flush=True)
                            metrics.gauge_set(metrics.READY, 1)
                            log.info("ready")
                            # Once serving (a refusal stays one line): one warning per server that does not sync.
                            tg.start_soon(warn_unless_synced, settings)
                watcher.cancel_scope.cancel()  # stopped by a signal, or it ended by itself

    tune_gc()
    try:
        anyio.run(_unwrapped, main, backend_options=event_loop_options(settings))
    except KeyboardInterrupt:
        return 130
    except NatsUnreachableError as e:
        log.error("%s", e)  # one line: the connection's own attempts were logged as they failed
        return 1
    except LoopwireError as e:
        # A typed refusal (another LW_SHARDS than the deployment's, settings that do not fit it,
        # JetStream refused a stream, no deployment at all) already says what is wrong: one line, no
        # traceback, exit 1, before anything was created or written.
        _say_refusal(settings, log, f"{name} {'stopped' if ready else 'cannot start'}: {e}")
        return 1
    finally:
        telemetry.shutdown()
    return 0


def _say_refusal(settings: Settings, log: logging.Logger, text: str) -> None:
    """The one line a refusal is: the CLI's ``error:`` line, or with JSON logs one log record."""
    if settings.log_format == "json":
        log.error("%s", text)
    else:
        print(f"error: {text}", file=sys.stderr, flush=True)


async def _deployment(stack: contextlib.AsyncExitStack, name: str, settings: Settings) -> Settings:
    """Connect, read the deployment's layout (:func:`shared.layout.read_deployment`: a disagreeing
    ``LW_SHARDS`` raises) and answer presence requests on this connection while the service runs
    (``loopwire shards grow`` refuses while any service answers)."""
    nc = await connect(settings, name=f"{name}:deployment"[:128])
    stack.push_async_callback(let_go, nc)
    adopted = await layout.read_deployment(nc, settings, within=settings.connect_seconds)
    await layout.announce(nc, adopted.names, name)
    return adopted


async def _cancel_on_signal(
    signals: AsyncIterator[int], scope: anyio.CancelScope, log: logging.Logger, settings: Settings, tg: TaskGroup
) -> None:
    first: float | None = None
    async for _ in signals:
        now = anyio.current_time()
        if first is not None:
            if now - first < SAME_STOP_SECONDS:
                continue  # one stop sent twice
            _exit_now(log, "stopped at once (a second signal): nothing was drained")
        first = now
        log.info("stopping (signal)")
        scope.cancel()
        tg.start_soon(let_go_of_silent)
        tg.start_soon(_cut_short_without_broker, log, settings)


async def _cut_short_without_broker(log: logging.Logger, settings: Settings) -> None:
    """The last resort: with no NATS server answering, the process ends
    :data:`STOP_WITHOUT_BROKER_SECONDS` after the signal whatever still runs. The stop does not count
    on it: :func:`~services.lifecycle.let_go_of_silent` closes the connections whose server is gone,
    so the drain ends in about a second. With a server answering, the drain takes what it needs
    (calls in flight finish by their own deadlines)."""
    deadline = anyio.current_time() + STOP_WITHOUT_BROKER_SECONDS
    if await broker_reachable(settings):
        return
    await anyio.sleep_until(deadline)
    _exit_now(log, f"stopped after {STOP_WITHOUT_BROKER_SECONDS:g}s without draining: NATS does not answer")


def _exit_now(log: logging.Logger, why: str) -> NoReturn:
    """End the process now, with status 0: what it held comes back by itself (unacknowledged work
    items are delivered again, leases expire) and everything committed is in JetStream already."""
    log.warning("%s", why)
    logging.shutdown()
    sys.stdout.flush()
    os._exit(0)


async def _unwrapped(main: Callable[[], Awaitable[None]]) -> None:
    try:
        await main()
    except BaseExceptionGroup as group:
        raise_single(group)
