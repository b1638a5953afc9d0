"""The one shape of a service: an object whose ``run`` serves until it is cancelled.

``await tg.start(service.run)`` returns once the service serves (``task_status.started()``);
cancelling the task group stops it, and ``run`` returns only after the service let go of what it
held (its NATS connection drained, in a shielded ``finally``). :mod:`services.runner` runs one in the
foreground of a process; tests and other services start them the same way.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Final, Protocol, runtime_checkable

import anyio
from anyio.abc import TaskStatus
from nats.aio.client import Client as NATS

from shared.connection import live_connections

log = logging.getLogger("loopwire.lifecycle")

# How long a stopping service's connection may go without an answer from its server (a PING, or
# getting back up after the server went away) before it is closed without draining.
SILENT_SECONDS: Final = 1.0


@runtime_checkable
class Service(Protocol):
    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None: ...


async def let_go(nc: NATS, *, within: float = 3.0) -> None:
    """Drain ``nc`` (replies in flight leave first) within ``within`` seconds, shielded; else close it.

    Never raises: a connection the broker dropped, or whose broker does not answer a PING within a
    second, is closed without a drain (nothing could leave through it).
    """
    with anyio.CancelScope(shield=True):
        if nc.is_connected and await _answers(nc):
            with anyio.move_on_after(within):
                with contextlib.suppress(Exception):
                    await nc.drain()
        await close_quietly(nc)


async def _answers(nc: NATS, within: float = 1.0) -> bool:
    # Asked first: a drain cut short by a silent server leaves nats-py's drain tasks failing unseen.
    try:
        await nc.flush(timeout=within)  # type: ignore[arg-type]  # a float works; the stub says int
    except Exception:
        return False
    return True


async def let_go_of_silent(*, within: float = SILENT_SECONDS) -> None:
    """While a service stops: close each of the process's connections whose server does not answer
    (neither a PONG nor any message within ``within`` seconds, or still reconnecting after
    ``within`` seconds); checked again every ``within`` seconds until cancelled.

    A stop's drain on such a connection only waits out nats-py's timeouts, one after another (a
    subscription's drain flushes for up to 10 s, a JetStream call waits 5 s), while nothing it sends
    can arrive. Closed, every wait on it ends at once (:class:`shared.connection.Connection`) and the
    stop goes on; what the service held comes back by itself (unacknowledged work is delivered
    again, leases and registrations expire). A connection whose server answers drains as long as its
    work in flight needs.
    """
    while True:
        async with anyio.create_task_group() as tg:
            for nc in live_connections():
                tg.start_soon(_close_if_silent, nc, within)
        await anyio.sleep(within)


async def _close_if_silent(nc: NATS, within: float) -> None:
    if nc.is_reconnecting:
        with anyio.move_on_after(within):
            while nc.is_reconnecting:  # noqa: ASYNC110  # nats-py has no event for getting back up
                await anyio.sleep(0.05)
        if not nc.is_reconnecting:
            return
    else:
        received = nc.stats["in_msgs"]
        # A server that sends messages but is slow to answer the PING (a busy drain) is not silent.
        if await _answers(nc, within) or nc.stats["in_msgs"] != received:
            return
    if nc.is_closed:
        return
    log.warning("NATS connection %s: its server does not answer; closed without draining", nc.options.get("name"))
    await close_quietly(nc)


async def close_quietly(nc: NATS, *, within: float = 1.0) -> None:
    """Close ``nc`` now, shielded and bounded; a transport that is already gone is no error (nats-py
    raises from writing its pending bytes to a closed uvloop transport)."""
    if nc.is_closed:
        return
    with anyio.CancelScope(shield=True), anyio.move_on_after(within), contextlib.suppress(Exception):
        await nc.close()


class _Started(TaskStatus[None]):
    def __init__(self) -> None:
        self.event = anyio.Event()

    def started(self, value: None = None) -> None:
        self.event.set()


async def drain_on_cancel(
    serve: Callable[[anyio.Event, TaskStatus[None]], Awaitable[None]],
    *,
    task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Run ``serve(stop, status)`` shielded from cancellation; a cancellation sets ``stop`` instead.

    For services whose stop is a drain, not a cut: work in flight finishes (bounded by its own
    deadlines) after the cancellation, then ``serve`` returns. ``serve`` returning by itself ends
    the service too.
    """
    stop = anyio.Event()
    status = _Started()
    try:
        async with anyio.create_task_group() as tg:

            async def shielded() -> None:
                with anyio.CancelScope(shield=True):
                    await serve(stop, status)
                tg.cancel_scope.cancel()  # it ended by itself

            tg.start_soon(shielded)
            try:
                await status.event.wait()
                task_status.started()
                await anyio.sleep_forever()
            finally:
                stop.set()
    except BaseExceptionGroup as group:
        raise_single(group)


def raise_single(group: BaseExceptionGroup[BaseException]) -> None:
    """Re-raise a task group's only exception as itself (callers catch the error, not a group)."""
    if len(group.exceptions) == 1:
        inner = group.exceptions[0]
        if isinstance(inner, BaseExceptionGroup):
            raise_single(inner)
        raise inner
    raise group
