"""The one shape of a service: an object whose ``run`` serves until it is cancelled.

``await tg.start(service.run)`` returns once the service serves (``task_status.started()``);
cancelling the task group stops it, and ``run`` returns only after the service let go of what it
held (its NATS connection drained, in a shielded ``finally``). :mod:`services.runner` runs one in the
foreground of a process; tests and other services start them the same way.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

import anyio
import nats.errors
from anyio.abc import TaskStatus
from nats.aio.client import Client as NATS


class Service(Protocol):
    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None: ...


async def let_go(nc: NATS, *, within: float = 5.0) -> None:
    """Drain ``nc`` (replies in flight leave first) within ``within`` seconds, shielded; else close it."""
    with anyio.CancelScope(shield=True), anyio.move_on_after(within):
        try:
            await nc.drain()
        except nats.errors.Error:
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
