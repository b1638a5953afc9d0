"""The one shape of a service: an object whose ``run`` serves until it is cancelled.

``await tg.start(service.run)`` returns once the service serves (``task_status.started()``);
cancelling the task group stops it, and ``run`` returns only after the service let go of what it
held (its NATS connection drained, in a shielded ``finally``). :mod:`services.runner` runs one in the
foreground of a process; tests and other services start them the same way.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from typing import Protocol

import anyio
from anyio.abc import TaskStatus
from nats.aio.client import Client as NATS


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


async def _answers(nc: NATS) -> bool:
    # Asked first: a drain cut short by a silent server leaves nats-py's drain tasks failing unseen.
    try:
        await nc.flush(timeout=1)
    except Exception:
        return False
    return True


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
