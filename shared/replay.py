"""Reading a loop's committed history: ``replay`` its records, ``load`` its fold, list every loop.

``replay`` reads the first 1,000 records with one Direct Get batch (no consumer: cheapest for a
short history or a tail) and anything beyond (a long history, or live records with ``follow=True``)
with an ordered consumer that starts right after the last record read, so nothing is missed or
repeated across the switch (faster than more Direct Get batches for a long history).
Every yielded event is freshly decoded and validated: the consumer owns it.

The history is read from the loop's home stream (:func:`shared.shards.home_of`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator
from typing import Final

import nats.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from shared import layout, shards
from shared.codec import DEFAULT_MAX_RECORD_BYTES, decode_event
from shared.consumers import ordered_consumer
from shared.errors import InvalidEventError, Rule
from shared.events import Event
from shared.history import LoopHistory
from shared.jserrors import JetStreamUnavailableError
from shared.settings import Settings
from shared.streamreads import direct_get_batch, get_msg, subjects
from shared.subjects import DEFAULT_NAMES, Names
from shared.validate import is_uuid

DIRECT_BATCH: Final = 1000  # records read with one Direct Get before switching to a consumer
IDLE_TIMEOUT: Final = 10.0
QUEUE_LIMIT: Final = 4096


def _names(settings: Settings | None, names: Names | None) -> Names:
    if names is not None:
        return names
    return settings.names if settings is not None else DEFAULT_NAMES


def _decode(data: bytes, loop_id: str, max_bytes: int) -> Event:
    event = decode_event(data, max_bytes=max_bytes)
    if event.loop_id != loop_id:
        raise InvalidEventError(type(event).__name__, "loop_id", Rule.INVALID.value)
    return event


async def replay(
    nc: NATS,
    loop_id: str,
    *,
    settings: Settings | None = None,
    names: Names | None = None,
    from_seq: int = 0,
    follow: bool = False,
    max_record_bytes: int | None = None,
) -> AsyncIterator[tuple[int, Event]]:
    """Yield ``(seq, event)`` for every committed record of ``loop_id`` from ``from_seq``, in order.

    Without ``follow`` the iteration ends at the end of the history as it was when reached. With
    ``follow`` it then waits for new records forever (close the iterator to stop, e.g. with
    ``contextlib.aclosing``). Raises :class:`shared.errors.CodecError` / ``InvalidEventError`` for a
    record that does not decode (never expected: the committer validated it), and
    :class:`shared.jserrors.JetStreamUnavailableError` when the stream cannot be read.
    """
    if not is_uuid(loop_id):
        raise ValueError(f"loop_id must be a canonical UUID, got {loop_id!r}")
    n = _names(settings, names)
    max_bytes = max_record_bytes or (settings.max_record_bytes if settings is not None else DEFAULT_MAX_RECORD_BYTES)
    home = await shards.home_of(nc, n, loop_id)
    subject = home.subject
    last = max(0, from_seq - 1)
    # One Direct Get batch first: cheapest for the usual short history or tail (no consumer). When
    # what is left fits one more batch, a second batch beats creating a consumer for a few records.
    for attempt in range(2):
        batch = await direct_get_batch(nc, home.stream, subject, start_seq=last + 1, batch=DIRECT_BATCH)
        for m in batch.messages:
            if m.seq <= last:
                continue
            event = _decode(m.data, loop_id, max_bytes)
            last = m.seq
            yield m.seq, event
        more = bool(batch.messages) and batch.num_pending > 0
        if not more or follow or attempt == 1 or batch.num_pending > DIRECT_BATCH:
            break
    if not more and not follow:
        return
    # The rest of a long history and/or live records.
    async for item in _consume(nc, home, loop_id, last, max_bytes, until_caught_up=not follow):
        yield item


async def _consume(
    nc: NATS, home: shards.Home, loop_id: str, last: int, max_bytes: int, *, until_caught_up: bool
) -> AsyncIterator[tuple[int, Event]]:
    """Records after ``last`` through an ordered consumer; ends once caught up if ``until_caught_up``."""
    # Hand messages over in bulk (one wake-up per burst, not per record). A slow reader blocks the
    # callback once QUEUE_LIMIT records wait, which lets the consumer's flow control slow the server.
    pending: deque[Msg] = deque()
    arrived = asyncio.Event()
    drained = asyncio.Event()

    async def on_msg(m: Msg) -> None:
        while len(pending) >= QUEUE_LIMIT:
            drained.clear()
            await drained.wait()
        pending.append(m)
        arrived.set()

    subject = home.subject
    sub = await ordered_consumer(nc, home.stream, subject, last + 1, on_msg)
    try:
        while True:
            if not pending:
                arrived.clear()
                if until_caught_up:
                    try:
                        await asyncio.wait_for(arrived.wait(), IDLE_TIMEOUT)
                    except TimeoutError:
                        raise JetStreamUnavailableError(f"replay of {subject} stalled for {IDLE_TIMEOUT:g}s") from None
                else:
                    await arrived.wait()
            burst = list(pending)
            pending.clear()
            drained.set()
            for m in burst:
                meta = m.metadata
                seq = meta.sequence.stream
                if seq > last:  # an ordered-consumer reset can redeliver
                    event = _decode(m.data, loop_id, max_bytes)
                    last = seq
                    yield seq, event
                if until_caught_up and meta.num_pending == 0:
                    return
    finally:
        with contextlib.suppress(nats.errors.Error, asyncio.CancelledError):
            await sub.unsubscribe()


async def load(
    nc: NATS,
    names: Names,
    loop_id: str,
    cached: LoopHistory | None = None,
    *,
    max_record_bytes: int | None = None,
    consistent: bool = True,
) -> LoopHistory:
    """The fold of ``loop_id``, reading only the records after ``cached.last_seq``.

    ``cached`` is advanced **in place** and returned (pass ``cached.copy()`` to keep the original).
    If the read fails midway, ``cached`` is still a correct fold of a prefix of the history.

    ``consistent`` (default): first ask the stream **leader** for the loop's last sequence and read
    until the fold reaches it. On R3 a Direct Get may be answered by a follower that lags by a few
    milliseconds; this makes "committed before the call" imply "in the fold" (one extra round trip).
    A one-replica stream needs none of it (``Settings.leader_reads``): its only server answers the
    Direct Get and holds every record it acknowledged.
    """
    h = cached if cached is not None else LoopHistory(loop_id=loop_id)
    target = 0
    if consistent:
        home = await shards.home_of(nc, names, loop_id)
        tip = await get_msg(nc, home.stream, last_by_subj=home.subject)
        target = tip.seq if tip is not None else 0
        if target <= h.last_seq:  # nothing after the fold: no Direct Get
            return h
    loop = asyncio.get_running_loop()
    deadline = loop.time() + IDLE_TIMEOUT
    while True:
        async for seq, event in replay(
            nc, loop_id, names=names, from_seq=h.last_seq + 1, max_record_bytes=max_record_bytes
        ):
            h.apply(event, seq, copy=False)  # freshly decoded for this fold only
        if h.last_seq >= target:
            return h
        if loop.time() > deadline:
            raise JetStreamUnavailableError(f"replica behind the leader at {target} for {IDLE_TIMEOUT:g}s")
        await asyncio.sleep(0.01)


async def loops(nc: NATS, names: Names | None = None) -> list[str]:
    """Every loop id with at least one committed record, sorted."""
    n = await layout.names_of(nc, names or DEFAULT_NAMES)
    found: list[str] = []
    for h in shards.history_streams(n):
        found += await subjects(nc, h.stream, h.subjects)
    return sorted(n.loop_of_hist(s) for s in found)
