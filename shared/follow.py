"""Following every loop's committed records: one ordered consumer per history stream (one per shard).

:func:`follow_all` hands each record to a callback as a :class:`Record`: its shard, its stream
sequence (sequences are per stream; a loop's records are all in one stream, so they order a loop's
records) and its loop. Each stream's records arrive in order; records of different streams arrive
in no set order. :attr:`Follower.caught_up` is set once every record stored when following began
has been handed over, in every stream.

A connection that comes back after it was lost (a NATS restart, a network cut) is followed on
where each stream left off: the server may have forgotten the consumers (an ordered consumer is
ephemeral), so each stream is subscribed again from the sequence after its last record handed
over, never a record twice and none left out; ``on_resume`` is told (``loopwire tail`` says so).

Starting, each stream's state and consumer are asked for again while JetStream does not answer
(it elects leaders after a node went away), for up to 30 s in all
(:mod:`shared.consumers`); then :class:`shared.jserrors.JetStreamUnavailableError`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Final

import nats.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from shared import layout
from shared.codec import DEFAULT_MAX_RECORD_BYTES, decode_event
from shared.consumers import answered, ordered_consumer, setup_deadline
from shared.events import Event
from shared.jserrors import JetStreamUnavailableError
from shared.shards import HistoryStream, history_streams
from shared.subjects import Names


@dataclass(frozen=True, slots=True)
class Record:
    """One committed record: where it is stored and its bytes."""

    shard: int
    seq: int  # its sequence in its shard's history stream
    loop_id: str
    data: bytes

    def event(self, max_bytes: int = DEFAULT_MAX_RECORD_BYTES) -> Event:
        """The record decoded and validated (raises :class:`shared.errors.CodecError` if it does not)."""
        return decode_event(self.data, max_bytes=max_bytes)


OnRecord = Callable[[Record], Awaitable[None]]
OnResume = Callable[["Follower"], Awaitable[None]]

# How often the connection is looked at for a reconnect (nats-py has no event a second party can wait on).
RECONNECT_CHECK_SECONDS: Final = 0.2
RETRY_SECONDS: Final = 0.5


class _Stream:
    """One history stream being followed: its last record handed over and the one to catch up to."""

    def __init__(self, h: HistoryStream, target: int) -> None:
        self.h = h
        self.last = 0
        self.target = target
        self.sub: Any = None

    @property
    def caught_up(self) -> bool:
        return self.last >= self.target


class Follower:
    """Every history stream followed with an ordered consumer; :meth:`stop` (or ``async with``) ends it."""

    def __init__(
        self, nc: NATS, names: Names, cb: OnRecord, *, from_seq: int | None = 1, on_resume: OnResume | None = None
    ) -> None:
        self._nc = nc
        self._names = names
        self._cb = cb
        self._from = from_seq
        self._on_resume = on_resume
        self._streams: list[_Stream] = []
        self._watch: asyncio.Task[None] | None = None
        self.caught_up = asyncio.Event()
        self.resumes = 0  # how often the connection came back and every stream was followed on

    @property
    def positions(self) -> dict[int, int]:
        """Each shard's last record handed over (its stream sequence; 0: none yet)."""
        return {s.h.shard: s.last for s in self._streams}

    async def start(self) -> None:
        """Subscribe to every stream (raises, subscribing to none, if one cannot be read).

        While JetStream does not answer (it elects leaders after a node went away) each request is
        asked again, for up to :data:`shared.consumers.CONSUMER_SETUP_SECONDS` in all; then
        :class:`shared.jserrors.JetStreamUnavailableError`.
        """
        js = self._nc.jetstream()
        deadline = setup_deadline()
        streams = []
        for h in history_streams(self._names):
            info = await answered(f"read {h.stream}", functools.partial(js.stream_info, h.stream), deadline=deadline)
            last = info.state.last_seq
            # Nothing to catch up to when following only new records or starting after the last one.
            target = 0 if self._from is None or self._from > last else last
            s = _Stream(h, target)
            # Where a resume starts: after the last record stored (following new ones only) or before from_seq.
            s.last = last if self._from is None else max(0, self._from - 1)
            streams.append(s)
        reconnects = self._nc.stats["reconnects"]
        try:
            for s in streams:
                await self._subscribe(s, deadline)
                self._streams.append(s)
        except BaseException:
            await self.stop()
            raise
        self._check_caught_up()  # (after every subscription: a caught-up follower is always following)
        self._watch = asyncio.create_task(self._follow_on_after_reconnects(reconnects))

    async def _subscribe(self, s: _Stream, deadline: float | None = None) -> None:
        """An ordered consumer on ``s`` from the record after its last one handed over."""
        s.sub = await ordered_consumer(
            self._nc, s.h.stream, s.h.subjects, s.last + 1, self._handler(s), deadline=deadline
        )

    async def _follow_on_after_reconnects(self, seen: int) -> None:
        """Each time the connection came back: every stream subscribed again where it left off."""
        while not self._nc.is_closed:
            await asyncio.sleep(RECONNECT_CHECK_SECONDS)
            now = self._nc.stats["reconnects"]
            if now == seen or not self._nc.is_connected:
                continue
            seen = now
            for s in self._streams:
                await self._resubscribe(s)
            self.resumes += 1
            if self._on_resume is not None:
                await self._on_resume(self)

    async def _resubscribe(self, s: _Stream) -> None:
        old, s.sub = s.sub, None
        with contextlib.suppress(nats.errors.Error, TimeoutError):
            await old.unsubscribe()
        while True:
            try:
                await self._subscribe(s)
                return
            except (nats.errors.Error, TimeoutError, JetStreamUnavailableError):
                # JetStream may still be recovering its streams after a restart: asked again until it answers.
                if self._nc.is_closed:
                    raise
                await asyncio.sleep(RETRY_SECONDS)

    def _handler(self, s: _Stream) -> Callable[[Msg], Awaitable[None]]:
        async def on_msg(m: Msg) -> None:
            meta = m.metadata
            seq = meta.sequence.stream
            if seq <= s.last:  # an ordered-consumer reset can redeliver
                return
            s.last = seq
            if meta.num_pending == 0:
                s.target = min(s.target, seq)  # the stream's end, even if its last record was removed
            await self._cb(Record(s.h.shard, seq, self._names.loop_of_hist(m.subject), m.data))
            if not self.caught_up.is_set() and s.caught_up:
                self._check_caught_up()

        return on_msg

    def _check_caught_up(self) -> None:
        if len(self._streams) == self._names.shards and all(s.caught_up for s in self._streams):
            self.caught_up.set()

    async def stop(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._watch
            self._watch = None
        streams, self._streams = self._streams, []
        for s in streams:
            if s.sub is not None:
                with contextlib.suppress(nats.errors.Error):
                    await s.sub.unsubscribe()

    async def __aenter__(self) -> Follower:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()


async def follow_all(
    nc: NATS, names: Names, cb: OnRecord, *, from_seq: int | None = 1, on_resume: OnResume | None = None
) -> Follower:
    """Follow every loop's committed records: ``cb`` gets each as a :class:`Record`.

    ``from_seq``: 1 (default) from the first stored record; N from sequence N of each history stream;
    None only records stored from now on. A slow ``cb`` slows its stream's delivery (flow control).
    After a lost connection came back every stream is followed on where it left off, then
    ``on_resume(follower)`` is awaited (:attr:`Follower.positions` says where).
    The shards followed are the deployment's (read from it), whatever count ``names`` has.
    Stop with :meth:`Follower.stop` or ``async with await follow_all(...)``. Raises
    :class:`shared.jserrors.JetStreamUnavailableError` when JetStream does not answer (see :meth:`Follower.start`).
    """
    follower = Follower(nc, await layout.names_of(nc, names), cb, from_seq=from_seq, on_resume=on_resume)
    await follower.start()
    return follower
