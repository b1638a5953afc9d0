"""A model-step replica's drive slots, and drives that wait on tool calls outside them.

A replica drives at most ``LW_MODEL_STEP_CONCURRENCY`` loops at once: each drive holds a slot, and
the replica pulls a work item only for a free slot. A drive whose tool calls have run for
:data:`STEP_OUT_AFTER_SECONDS` gives its slot back until their results are in, then takes a slot
again before it acts on them. Otherwise a parent loop waiting on a sub-agent (a tool call that
runs a child loop) would hold its slot for the child's whole run, and once every slot were held by
a waiting parent no child could ever be driven. The waiting drive keeps its lease (refreshed as
before) and its work item; it just does not count against the slots.

At most ``LW_MODEL_STEP_WAITING`` drives of a replica wait outside a slot at once (each still costs
its lease refreshes and its work item's progress notes); a drive past that bound waits in its slot,
as every drive did before. Short calls never step out: releasing and taking a slot back for a call
of a few milliseconds would let the replica pull more items than it has slots for nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Final, Protocol

import anyio

from shared import metrics

# How long a drive's tool calls run before it gives its slot back until they end.
STEP_OUT_AFTER_SECONDS: Final = 0.5
# How often the pool looks for drives that have waited that long.
_SCAN_SECONDS: Final = 0.1


class SlotHolder(Protocol):
    """What a drive needs of its slot: take it (again) before acting, wait outside it on calls."""

    async def take(self) -> None: ...

    def waiting(self) -> contextlib.AbstractAsyncContextManager[None]: ...


class SlotPool:
    """One replica's slots: a semaphore the pull loops take from, and the drives waiting outside it."""

    def __init__(self, slots: int, waiting: int) -> None:
        self.free = anyio.Semaphore(max(1, slots))
        self.max_waiting = max(0, waiting)
        self.waiting = 0  # drives waiting on calls with their slot given back
        self.calling: dict[Slot, float] = {}  # drives whose calls run, since when (monotonic)

    def slot(self) -> Slot:
        """A slot just taken from ``free`` (by a pull loop) for one work item's handler."""
        return Slot(self)

    async def run(self) -> None:
        """Give the slots of drives whose calls have run long enough back, for the service's lifetime."""
        while True:
            await anyio.sleep(_SCAN_SECONDS)
            if not self.calling:
                continue
            due = anyio.current_time() - STEP_OUT_AFTER_SECONDS
            for slot, since in list(self.calling.items()):
                if self.waiting >= self.max_waiting:
                    break
                if since <= due and slot.held:
                    slot.step_out()


@dataclass(eq=False)
class Slot:
    """One handler's slot: held while it drives, given back while its drive waits on long calls."""

    pool: SlotPool
    held: bool = True
    _out: bool = field(default=False, repr=False)  # given back by the pool while calls run

    async def take(self) -> None:
        """Hold a slot again (after a wait outside it that was cut short, e.g. by an interrupt)."""
        if not self.held:
            await self.pool.free.acquire()
            self.held = True

    def release(self) -> None:
        """The handler is done: its slot is free for the next work item."""
        if self.held:
            self.held = False
            self.pool.free.release()

    def step_out(self) -> None:
        pool = self.pool
        self.held, self._out = False, True
        pool.waiting += 1
        metrics.gauge_add(metrics.LOOPS_WAITING, 1)
        pool.free.release()

    @contextlib.asynccontextmanager
    async def waiting(self) -> AsyncIterator[None]:
        """Around a drive's tool calls: past :data:`STEP_OUT_AFTER_SECONDS` the slot is given back
        (while fewer than the pool's bound wait so), and taken again when the calls end, before
        the drive acts on their results. A cancelled take leaves the slot to :meth:`take`."""
        pool = self.pool
        pool.calling[self] = anyio.current_time()
        try:
            yield
        finally:
            del pool.calling[self]
            out, self._out = self._out, False
            if out:
                pool.waiting -= 1
                metrics.gauge_add(metrics.LOOPS_WAITING, -1)
        if out:  # (after an error the drive's next pass takes it, or its handler ends without)
            await self.take()


__all__ = ["STEP_OUT_AFTER_SECONDS", "Slot", "SlotHolder", "SlotPool"]
