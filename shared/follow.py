"""Following every loop's committed records: one ordered consumer per history stream (one per shard).

:func:`follow_all` hands each record to a callback as a :class:`Record`: its shard, its stream
sequence (sequences are per stream; a loop's records are all in one stream, so they order a loop's
records) and its loop. Each stream's records arrive in order; records of different streams arrive
in no set order. :attr:`Follower.caught_up` is set once every record stored when following began
has been handed over, in every stream.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import nats.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import api

from shared import layout
from shared.codec import DEFAULT_MAX_RECORD_BYTES, decode_event
from shared.events import Event
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

    def __init__(self, nc: NATS, names: Names, cb: OnRecord, *, from_seq: int | None = 1) -> None:
        self._nc = nc
        self._names = names
        self._cb = cb
        self._from = from_seq
        self._streams: list[_Stream] = []
        self.caught_up = asyncio.Event()

    async def start(self) -> None:
        """Subscribe to every stream (raises, subscribing to none, if one cannot be read)."""
        js = self._nc.jetstream()
        streams = []
        for h in history_streams(self._names):
            last = (await js.stream_info(h.stream)).state.last_seq
            # Nothing to catch up to when following only new records or starting after the last one.
            target = 0 if self._from is None or self._from > last else last
            streams.append(_Stream(h, target))
        try:
            for s in streams:
                s.sub = await js.subscribe(
                    s.h.subjects, stream=s.h.stream, ordered_consumer=True, cb=self._handler(s), config=self._config()
                )
                self._streams.append(s)
        except BaseException:
            await self.stop()
            raise
        self._check_caught_up()  # (after every subscription: a caught-up follower is always following)

    def _config(self) -> api.ConsumerConfig:
        if self._from is None:
            return api.ConsumerConfig(deliver_policy=api.DeliverPolicy.NEW, inactive_threshold=30.0)
        if self._from <= 1:
            return api.ConsumerConfig(deliver_policy=api.DeliverPolicy.ALL, inactive_threshold=30.0)
        return api.ConsumerConfig(
            deliver_policy=api.DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=self._from, inactive_threshold=30.0
        )

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
        streams, self._streams = self._streams, []
        for s in streams:
            with contextlib.suppress(nats.errors.Error):
                await s.sub.unsubscribe()

    async def __aenter__(self) -> Follower:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()


async def follow_all(nc: NATS, names: Names, cb: OnRecord, *, from_seq: int | None = 1) -> Follower:
    """Follow every loop's committed records: ``cb`` gets each as a :class:`Record`.

    ``from_seq``: 1 (default) from the first stored record; N from sequence N of each history stream;
    None only records stored from now on. A slow ``cb`` slows its stream's delivery (flow control).
    The shards followed are the deployment's (read from it), whatever count ``names`` has.
    Stop with :meth:`Follower.stop` or ``async with await follow_all(...)``.
    """
    follower = Follower(nc, await layout.names_of(nc, names), cb, from_seq=from_seq)
    await follower.start()
    return follower
