"""Loops that should be driven: make sure a drive takes them up, whatever became of their work signal.

A loop moves on only while a drive holds it, and a drive starts only from a work item. A command that
needs a drive (an input, a gate's answer, ...) queues one; a drive that ends with work left queues
one. With model-step replicas killed, loops have been left with a record that needed a drive —
a gate's answer, or a step whose next step was never run — and no work item at all, waiting for ever.

So the committer, which stores every record, watches each loop whose last record it stored needs a
drive: every record but those a loop rests on (idle, parked at a gate, closed, started without an
input). A loop whose history has not grown since, and which no replica drives (no lease), some
seconds later, is signalled again — a spare signal costs one drive that finds nothing to do. A loop
that grew, or that is driven, needs nothing more; a loop still untouched after a few signals is left
alone (its drive may find nothing to do, e.g. an interrupt of a turn that had already ended), with a
warning.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Final

import anyio
import nats.js.errors
from nats.aio.client import Client as NATS
from nats.js.kv import KeyValue

from shared.bus import JetStreamError, JetStreamUnavailableError, get_msg, signal_work
from shared.events import (
    Event,
    GateOpened,
    LoopClosed,
    LoopIdle,
    LoopStarted,
    PermissionRequested,
    UserInputRequested,
)
from shared.subjects import Names

log = logging.getLogger("loopwire.committer.watch")

# How long a drive may take to show up (a commit, or the loop's lease) before the work is queued
# again; doubled after each signal. A replica killed while holding the item hands it on within the
# work consumer's ack wait (at most one second), well within this.
FIRST_LOOK_SECONDS: Final = 5.0
# Signals sent again before the loop is left to its own.
MAX_SIGNALS: Final = 3
# Records a loop rests on: after them no drive is due until a command comes.
RESTING: Final[tuple[type[Event], ...]] = (
    LoopIdle,
    LoopClosed,
    GateOpened,
    PermissionRequested,
    UserInputRequested,
    LoopStarted,
)
# How often the watched loops are looked at, and how many at once.
TICK_SECONDS: Final = 1.0
LOOKS_AT_ONCE: Final = 32


@dataclass(slots=True)
class _Watched:
    seq: int  # the loop's last record when it was watched: a record after it means a drive wrote
    due: float  # monotonic
    signals: int = 0


class WorkWatch:
    """The loops whose last record this committer stored needs a drive, until a drive takes them up."""

    def __init__(self, nc: NATS, names: Names) -> None:
        self._nc = nc
        self._names = names
        self._first_look = FIRST_LOOK_SECONDS
        self._loops: dict[str, _Watched] = {}
        self._leases: KeyValue | None = None

    def queued(self, loop_id: str, seq: int) -> None:
        """The loop's records through ``seq`` need a drive (its work was queued just now)."""
        self._loops[loop_id] = _Watched(seq=seq, due=time.monotonic() + self._first_look)

    def stored(self, loop_id: str, seq: int, last: Event) -> None:
        """A commit or a command stored ``last`` at ``seq``: watch the loop unless it rests there."""
        if isinstance(last, RESTING):
            self._loops.pop(loop_id, None)
        else:
            self.queued(loop_id, seq)

    async def run(self) -> None:
        """Until cancelled: look at the loops that are due."""
        limiter = anyio.CapacityLimiter(LOOKS_AT_ONCE)

        async def look(loop_id: str, w: _Watched) -> None:
            async with limiter:
                try:
                    await self._look(loop_id, w)
                except (JetStreamError, JetStreamUnavailableError, nats.errors.Error) as e:
                    log.debug("loop %s: watching its work failed (%s); trying again", loop_id, e)
                    w.due = time.monotonic() + TICK_SECONDS

        while True:
            await anyio.sleep(TICK_SECONDS)
            now = time.monotonic()
            async with anyio.create_task_group() as tg:
                for loop_id, w in list(self._loops.items()):
                    if w.due <= now:
                        tg.start_soon(look, loop_id, w)

    async def _look(self, loop_id: str, w: _Watched) -> None:
        names = self._names
        tip = await get_msg(self._nc, names.history_stream, last_by_subj=names.hist(loop_id))
        if tip is None or tip.seq > w.seq:
            self._forget(loop_id, w)  # a drive wrote (or the loop is gone)
            return
        if await self._driven(loop_id):
            w.due = time.monotonic() + self._first_look  # a long model call or tool: look later
            return
        if w.signals >= MAX_SIGNALS:
            log.warning("loop %s: no drive wrote after %d signals; no longer watched", loop_id, w.signals)
            self._forget(loop_id, w)
            return
        await signal_work(self._nc, names, loop_id, within=0)
        w.signals += 1
        w.due = time.monotonic() + self._first_look * 2**w.signals
        log.warning("loop %s: its work was not taken up (history still at %d); signalled again", loop_id, w.seq)

    async def _driven(self, loop_id: str) -> bool:
        if self._leases is None:
            self._leases = await self._nc.jetstream().key_value(self._names.leases_bucket)
        try:
            await self._leases.get(loop_id)
        except nats.js.errors.KeyNotFoundError:
            return False
        return True

    def _forget(self, loop_id: str, w: _Watched) -> None:
        if self._loops.get(loop_id) is w:
            del self._loops[loop_id]
