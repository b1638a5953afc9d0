"""Keeping every loop driven: the one invariant, its fast path, and the repairs that restore it.

**Invariant.** A loop whose last record needs a drive has a work item, and a live model-step
replica takes it.

A record needs a drive unless the loop rests on it (:data:`RESTING`: idle, closed, parked at a
gate, started without an input). A drive starts only from a work item on the loop's work subject in
its shard's work stream (at most one per loop: a new signal replaces a pending one) and holds the
loop's lease, in its shard's leases bucket, while it runs.

**Fast path.** Whoever stores records that need a drive queues the work right after: the committer
after a command (:meth:`CommitterReconciler.queue`), a replica after its drive ends with work left
or with signals that came in meanwhile (:meth:`ReplicaReconciler.look_again`).

**Repairs.** Each way the fast path can fail is repaired by a check of the invariant made from
outside the path that broke:

========================  ===================  ==================================================
repair                    runs in              restores the invariant when
========================  ===================  ==================================================
unqueued                  committer            the work stream refused a command's signal
unclaimed                 committer            a loop's last stored record needs a drive, and no
                                               record followed nor a lease appeared since
orphaned                  replica start-up     leases name a replica that is gone (its items wait
                                               for the work consumer's ack wait otherwise)
lost items                every replica, per   a shard's work consumer will never deliver an item
                          shard served         again (its state lost in a consumer leader change)
========================  ===================  ==================================================

A spare signal costs one drive that finds nothing to do; a missing one strands a loop, so every
repair errs towards signalling.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Container, Iterable
from dataclasses import dataclass
from typing import Final

import anyio
import nats.errors
import nats.js.errors
from nats.aio.client import Client as NATS
from nats.js.kv import KeyValue

from shared import shards, telemetry
from shared.events import (
    Event,
    GateOpened,
    LoopClosed,
    LoopIdle,
    LoopStarted,
    PermissionRequested,
    UserInputRequested,
)
from shared.history import LoopHistory
from shared.jserrors import JetStreamError, JetStreamUnavailableError
from shared.replay import load
from shared.settings import Settings
from shared.streamreads import get_msg, subjects
from shared.subjects import Names
from shared.worksignals import signal_work

log = logging.getLogger("loopwire.reconcile")

# Records a loop rests on: after them no drive is due until a command comes.
RESTING: Final[tuple[type[Event], ...]] = (
    LoopIdle,
    LoopClosed,
    GateOpened,
    PermissionRequested,
    UserInputRequested,
    LoopStarted,
)
# unqueued: how often a signal the work stream refused is tried again.
REQUEUE_SECONDS: Final = 1.0
# unclaimed: how long a drive may take to show up (a record, or the loop's lease) before the work
# is queued again, doubled after each signal; a killed replica's item comes back within the work
# consumer's ack wait (at most one second), well within this.
FIRST_LOOK_SECONDS: Final = 5.0
MAX_SIGNALS: Final = 3  # then the loop is left to its own, with a warning
TICK_SECONDS: Final = 1.0
LOOKS_AT_ONCE: Final = 32
# lost items: how often the work consumer's counts are compared with the stream's.
LOST_ITEMS_SECONDS: Final = 5.0
# A replica's own signals: how long one is retried while JetStream is unavailable, and how long
# the look after a drive keeps trying to queue the loop's remaining work.
SIGNAL_SECONDS: Final = 2.0
LOOK_AGAIN_SECONDS: Final = 300.0


def needs_drive(last: Event) -> bool:
    """Whether a loop whose last record is ``last`` needs a drive (the invariant's premise)."""
    return not isinstance(last, RESTING)


# --- the committer's side ------------------------------------------------------------------------


@dataclass(slots=True)
class _Watched:
    seq: int  # the loop's last record when it was watched: a record after it means a drive wrote
    due: float  # monotonic
    signals: int = 0


class CommitterReconciler:
    """The committer's part: queue the work of the records it stores, and repair what did not land
    (*unqueued*) or was not taken up (*unclaimed*)."""

    def __init__(self, nc: NATS, settings: Settings) -> None:
        self._nc = nc
        self._settings = settings
        self._names = settings.names
        self._first_look = FIRST_LOOK_SECONDS
        self._unqueued: dict[str, int] = {}  # loop → the seq its refused signal was for
        self._watched: dict[str, _Watched] = {}
        self._leases: dict[int, KeyValue] = {}  # each shard's leases bucket, once looked at

    async def queue(self, loop_id: str, seq: int, last: Event | None = None) -> None:
        """Queue the loop's work after a command stored (or repeated) records through ``seq``.

        Raises the work stream's error when it stays unavailable; the loop is then an *unqueued* one,
        signalled by :meth:`run` until the signal lands.
        """
        try:
            await signal_work(
                self._nc,
                self._names,
                loop_id,
                within=self._settings.commit_retry_seconds,
                headers=telemetry.inject({}),  # the work signal carries the request's trace
            )
        except (JetStreamError, JetStreamUnavailableError):
            self._unqueued[loop_id] = max(seq, self._unqueued.get(loop_id, 0))
            raise
        self._unqueued.pop(loop_id, None)
        if last is not None:
            self.stored(loop_id, seq, last)
        else:
            self._watch(loop_id, seq)

    def stored(self, loop_id: str, seq: int, last: Event) -> None:
        """A commit or a command stored ``last`` at ``seq``: watch the loop unless it rests there."""
        if needs_drive(last):
            self._watch(loop_id, seq)
        else:
            self._watched.pop(loop_id, None)

    async def run(self) -> None:
        """Until cancelled: the *unqueued* and *unclaimed* repairs."""
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._requeue_unqueued)
            tg.start_soon(self._signal_unclaimed)

    def _watch(self, loop_id: str, seq: int) -> None:
        self._watched[loop_id] = _Watched(seq=seq, due=time.monotonic() + self._first_look)

    async def _requeue_unqueued(self) -> None:
        while True:
            await anyio.sleep(REQUEUE_SECONDS)
            for loop_id, seq in list(self._unqueued.items()):
                try:
                    await signal_work(self._nc, self._names, loop_id, within=0)
                except (JetStreamError, JetStreamUnavailableError):
                    break  # still unavailable: try again later
                self._unqueued.pop(loop_id, None)
                log.info("loop %s: its work is queued now", loop_id)
                self._watch(loop_id, seq)

    async def _signal_unclaimed(self) -> None:
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
                for loop_id, w in list(self._watched.items()):
                    if w.due <= now:
                        tg.start_soon(look, loop_id, w)

    async def _look(self, loop_id: str, w: _Watched) -> None:
        names = self._names
        home = await shards.home_of(self._nc, names, loop_id)
        tip = await get_msg(self._nc, home.stream, last_by_subj=home.subject)
        if tip is None or tip.seq > w.seq:
            self._forget(loop_id, w)  # a drive wrote (or the loop is gone)
            return
        if await self._driven(loop_id):
            w.due = time.monotonic() + self._first_look  # a long model call or tool: look later
            return
        if w.signals >= MAX_SIGNALS:
            # Its drive may find nothing to do, e.g. an interrupt of a turn that had already ended.
            log.warning("loop %s: no drive wrote after %d signals; no longer watched", loop_id, w.signals)
            self._forget(loop_id, w)
            return
        await signal_work(self._nc, names, loop_id, within=0)
        w.signals += 1
        w.due = time.monotonic() + self._first_look * 2**w.signals
        log.warning("loop %s: its work was not taken up (history still at %d); signalled again", loop_id, w.seq)

    async def _driven(self, loop_id: str) -> bool:
        """Whether the loop's lease is held (in its shard's leases bucket)."""
        shard = self._names.shard_of(loop_id)
        kv = self._leases.get(shard)
        if kv is None:
            kv = self._leases[shard] = await self._nc.jetstream().key_value(self._names.leases_bucket_of(shard))
        try:
            await kv.get(loop_id)
        except nats.js.errors.KeyNotFoundError:
            return False
        return True

    def _forget(self, loop_id: str, w: _Watched) -> None:
        if self._watched.get(loop_id) is w:
            del self._watched[loop_id]


# --- a model-step replica's side -----------------------------------------------------------------


class ReplicaReconciler:
    """A model-step replica's part: the look after a drive, and the *orphaned* and *lost items* repairs."""

    def __init__(self, nc: NATS, settings: Settings, has_work: Callable[[LoopHistory], bool]) -> None:
        self._nc = nc
        self._settings = settings
        self._names = settings.names
        self._has_work = has_work  # the drive's own rule: whether a fold has a next action

    async def look_again(self, loop_id: str, cached: LoopHistory | None) -> None:
        """After a drive's ack: queue a work item if the loop has work again (no lost wake-ups).

        A signal that arrived while ours was pending replaced it (and was acked with it), so look
        once more, and hand found work back to the queue instead of driving it unbacked (a crash now
        would otherwise strand the loop with no work item left). Our item is already acked, so a
        failed look must not end here (a leader election makes reads fail for seconds): signal
        anyway and keep trying until one of the two succeeds.
        """
        nc, names = self._nc, self._names
        deadline = anyio.current_time() + LOOK_AGAIN_SECONDS
        while True:
            try:
                h = await load(nc, names, loop_id, cached, consistent=self._settings.leader_reads)
                if self._has_work(h):
                    await signal_work(nc, names, loop_id, within=SIGNAL_SECONDS, headers=telemetry.inject({}))
                return
            except Exception as e:
                log.warning(
                    "loop %s: looking again after the ack failed (%s); signalling anyway",
                    loop_id,
                    e,
                    extra={"loop_id": loop_id},
                )
            try:
                await signal_work(nc, names, loop_id, within=SIGNAL_SECONDS, headers=telemetry.inject({}))
                return
            except Exception as e:
                if anyio.current_time() > deadline:
                    log.error(
                        "loop %s: could not queue its work for %gs: %s",
                        loop_id,
                        LOOK_AGAIN_SECONDS,
                        e,
                        extra={"loop_id": loop_id},
                    )
                    return
            await anyio.sleep(0.5)

    async def signal_orphaned(self, orphaned: Callable[[], Awaitable[list[str]]]) -> None:
        """Once, at start-up: signal the loops a dead replica held (in every shard served, each in
        its own shard's work stream), so they resume now rather than after the work consumer's ack
        wait (an optimisation: the ack wait brings them back anyway)."""
        try:
            loops = await orphaned()
            for loop_id in loops:
                await signal_work(self._nc, self._names, loop_id, within=SIGNAL_SECONDS)
        except Exception as e:
            log.warning("start-up: could not look for loops of a replica that is gone (%s)", e)
            return
        if loops:
            log.info("start-up: %d loop(s) of a replica that is gone signalled", len(loops))

    async def signal_lost_items(self, busy: Container[str], served: Iterable[int]) -> None:
        """Until cancelled: signal again the loops whose items the work consumer of a ``served``
        shard lost (:class:`LostItems`), except those this replica handles right now."""
        checks = [LostItems(self._nc, self._names, k) for k in served]
        while True:
            await anyio.sleep(LOST_ITEMS_SECONDS)
            for lost_items in checks:
                await self._signal_lost(lost_items, busy)

    async def _signal_lost(self, lost_items: LostItems, busy: Container[str]) -> None:
        try:
            for loop_id in await lost_items.check():
                if loop_id not in busy:
                    await signal_work(self._nc, self._names, loop_id, within=SIGNAL_SECONDS)
                    log.warning(
                        "loop %s: its work item was no longer delivered; signalled again",
                        loop_id,
                        extra={"loop_id": loop_id},
                    )
        except Exception as e:  # a safety net: the next check tries again
            log.debug("checking shard %d's work consumer for lost items failed (%s)", lost_items.shard, e)


class LostItems:
    """Work items still in one shard's work stream that its work consumer will never deliver again.

    A JetStream consumer keeps which items it delivered and which wait for an ack in its own state,
    and a consumer leader change in the middle of a delivery or a nak can lose that state (the new
    leader's next sequence is past an item that is not pending either). Such an item stays in the
    stream, unacked, for ever. The symptom is visible from outside: the stream holds more items
    than the consumer has left to deliver plus those waiting for an ack. :meth:`check` names the
    items that were already delivered once and sat unchanged through two such observations in a
    row; a new signal replaces each one, past the consumer's next sequence, so it is delivered again.
    """

    def __init__(self, nc: NATS, names: Names, shard: int) -> None:
        self.nc = nc
        self.names = names
        self.shard = shard
        self._stream = names.work_stream_of(shard)
        self._suspects: dict[str, int] = {}  # work subject -> the item's stream sequence

    async def check(self) -> list[str]:
        """Loop ids whose items the consumer lost (empty while the counts agree)."""
        js = self.nc.jetstream()
        consumer = await js.consumer_info(self._stream, self.names.work_consumer)
        stream = await js.stream_info(self._stream)
        missing = stream.state.messages - (consumer.num_pending or 0) - (consumer.num_ack_pending or 0)
        if missing <= 0:
            self._suspects = {}
            return []
        delivered = consumer.delivered.stream_seq or 0
        found: dict[str, int] = {}
        for subject in await subjects(self.nc, self._stream, self.names.work_all_of(self.shard)):
            m = await get_msg(self.nc, self._stream, last_by_subj=subject)
            if m is not None and m.seq <= delivered:  # not merely waiting for its first delivery
                found[subject] = m.seq
        lost = [subject for subject, seq in found.items() if self._suspects.get(subject) == seq]
        self._suspects = found
        return [self.names.loop_of_work(subject) for subject in lost]
