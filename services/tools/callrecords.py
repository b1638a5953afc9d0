"""A worker's durable call records (see :mod:`shared.results`).

A request whose execution id has a ``done`` record with the same argument digest is answered with
the recorded reply and does not run; one recorded with other arguments is refused (``error`` reply
``refused``). A tool that is neither read-only nor idempotent gets a ``started`` record before it
begins; every result is recorded as ``done`` before the reply is sent — a read-only tool's right
after the reply, its ack checked in a callback (running it again is harmless; an unacknowledged
write is written again, the awaited way). A call cut by its deadline, canceled or failed on the
worker has no ``done`` record: its effects are unknown (the ``started`` record says it may have run).
Each record is in the results bucket of its caller's loop's shard (the request's ``Lw-Loop-Id``).
"""

from __future__ import annotations

import logging
import time
from typing import Final

import anyio
import msgspec
from anyio.abc import TaskGroup
from nats.aio.client import Client as NATS

from services.tools.calls import Call
from services.toolwire import protocol as p
from shared.results import DONE, CallRecord, ResultStore, now_ms

log = logging.getLogger("loopwire.tools.worker")

_ACK_SWEEP_SECONDS: Final = 0.5  # how often overdue record acks are looked for


class CallRecords:
    """The records of one worker's calls in ``store``; records not acknowledged are written again."""

    def __init__(self, store: ResultStore, nc: NATS, worker_id: str) -> None:
        self.store = store
        self.nc = nc
        self.worker_id = worker_id
        self._tg: TaskGroup | None = None  # where records are written again (None: not serving)
        self._rewrites = 0  # records being written again (their first write was not acknowledged)

    async def open(self, tg: TaskGroup) -> None:
        """Serving starts: acks are watched, and records not acknowledged are written again in ``tg``."""
        self._tg = tg
        await self.store.open_acks(self._not_acked)
        tg.start_soon(self._sweep_acks)

    def detach(self) -> None:
        """Serving ended: a record not acknowledged from here on is only logged."""
        self._tg = None

    async def close(self) -> None:
        await self.store.close_acks()

    def record_of(self, t: str, eid: str, call: Call, state: str, kind: str = "", body: bytes = b"") -> CallRecord:
        """The record of tool ``t``'s call ``eid`` in ``state`` (a ``done`` one with its reply)."""
        rec = CallRecord(
            tool=t,
            execution_id=eid,
            args_digest=call.digest,
            state=state,
            worker_id=self.worker_id,
            started_ms=now_ms(),
        )
        if state == DONE:
            rec.reply_kind, rec.reply = kind, msgspec.Raw(body)
        return rec

    async def record(
        self, loop_id: str, t: str, eid: str, call: Call, state: str, kind: str = "", body: bytes = b""
    ) -> None:
        """Write the record of loop ``loop_id``'s call ``eid`` of tool ``t`` (see :meth:`record_of`)."""
        await self.store.record_call(self.record_of(t, eid, call, state, kind, body), loop_id=loop_id)

    async def record_done(self, loop_id: str, t: str, eid: str, call: Call, body: bytes) -> None:
        try:
            await self.record(loop_id, t, eid, call, DONE, p.REPLY_RESULT, body)
        except Exception:  # it ran: the caller still gets the answer (a re-run may not see it)
            log.warning("worker %s: result of %s not recorded", self.worker_id, t, exc_info=True)

    async def record_nowait(self, loop_id: str, rec: CallRecord) -> None:
        """Write ``rec`` without waiting for its ack (one not acknowledged in time is written again)."""
        await self.store.record_call_nowait(rec, loop_id=loop_id)

    def _not_acked(self, loop_id: str, rec: CallRecord) -> None:
        """A record written without waiting was not acknowledged: write it again, the awaited way."""
        tg = self._tg
        if tg is None:  # stopped meanwhile
            log.warning("worker %s: result of %s not recorded", self.worker_id, rec.tool)
            return
        self._rewrites += 1
        tg.start_soon(self._rewrite, loop_id, rec)

    async def _rewrite(self, loop_id: str, rec: CallRecord) -> None:
        try:
            await self.store.record_call(rec, loop_id=loop_id)
        except Exception:  # it ran: the caller has the answer (a re-run may not see it)
            log.warning("worker %s: result of %s not recorded", self.worker_id, rec.tool, exc_info=True)
        finally:
            self._rewrites -= 1

    async def _sweep_acks(self) -> None:
        while True:
            await anyio.sleep(_ACK_SWEEP_SECONDS)
            self.store.expire_unacked(time.monotonic())

    async def settle(self) -> None:
        """Drain: every call has answered; wait until its records are acknowledged or written again."""
        # Polled: acks settle in the store's callback, and this runs once, at the end of a drain.
        # A closed connection acknowledges nothing more (the writes are logged as not recorded).
        while self.store.unacked or self._rewrites:
            if self.nc.is_closed:
                return
            await anyio.sleep(0.02)
