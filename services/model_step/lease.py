"""Loop leases in KV (``<prefix>_leases``): one live drive per loop, and a drive that lost it stops.

A lease is a key of the loop's shard's leases bucket (its TTL is ``LW_LEASE_TTL_SECONDS``) whose
value names the holding replica (one liveness token per replica, whatever shards it serves). The
holder refreshes it every TTL/4 while it drives the loop (the first time TTL/2 after taking it).

The lease is not the fence for commits — the commit's expected sequence is — but it guards every
other side effect. A drive acts (model request, tool call, commit) only while its lease is *held*:

* not **lost**: a refresh found the key gone or rewritten by another replica; and
* not **lapsed**: the last successful refresh (or the acquisition) was *sent* less than one TTL ago,
  on the monotonic clock, which keeps running while a process is stopped (SIGSTOP, a frozen VM).
  The server counts the key's TTL from when that write reached it, so the holder's own view of
  "held" ends no later than the key can expire and be taken by another replica.

Takeover is eager: each replica answers on its own liveness subject
(``<prefix>.msalive.<token>``); a key whose holder has no subscriber there (its process or its
NATS connection is gone, e.g. SIGKILL) is taken at once with a compare-and-set on the holder's
revision, without waiting for the TTL. A stopped or slow holder still answers nothing in time, so
its keys are taken only when they expire — by then it has stopped acting on them. A replica that
loses its NATS connection gives up all its leases at once (another replica may take them now) and
answers under a new token from then on: its connection comes back within a second, often before
another replica asks, and the keys it gave up would otherwise look held until they expire.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Final, Protocol

import anyio
import nats.errors
import nats.js.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js.kv import KeyValue

from shared import metrics
from shared.errors import LoopwireError
from shared.jsapi import is_gone
from shared.jserrors import ERR_WRONG_LAST_SEQUENCE, ERR_WRONG_LAST_SEQUENCE_INFLIGHT
from shared.streamreads import subjects
from shared.subjects import Names, kv_stream

log = logging.getLogger("loopwire.model_step.lease")

# How long a taker waits for a holder's liveness answer; silence is not proof of death.
PING_SECONDS: Final = 0.5
# The holder's own view of its lease ends this much before the key can expire on the server.
SAFETY_SECONDS: Final = 0.05
# Why every lease is given up when the connection drops (Lease.why).
CONNECTION_LOST: Final = "given up: the NATS connection was lost"


class LeaseLost(LoopwireError):
    """This replica no longer holds the loop's lease: stop driving it (another replica may)."""


class Guard(Protocol):
    """What a drive needs of its lease: may it still act, and until when."""

    @property
    def held(self) -> bool: ...

    def check(self) -> None:
        """Raise :class:`LeaseLost` unless held."""

    def start_by_ms(self) -> int:
        """Unix ms after which no side effect of this drive may start."""


@dataclass(eq=False)
class Lease:
    """One held lease. ``check()`` before every side effect; ``held`` is cheap enough for hot loops."""

    kv: KeyValue
    key: str
    value: bytes
    revision: int
    ttl: float
    valid_until: float  # monotonic
    lost: bool = False
    why: str = ""  # given up: why (e.g. CONNECTION_LOST)
    # The value of the holder this lease was taken over from (its process or connection was gone).
    taken_from: bytes = b""
    _on_lost: list[Callable[[], None]] = field(default_factory=list)

    @property
    def held(self) -> bool:
        return not self.lost and time.monotonic() < self.valid_until

    def check(self) -> None:
        if not self.held:
            self.give_up("lapsed" if not self.lost else "lost")
            raise LeaseLost(f"lease of loop {self.key} is no longer held")

    def start_by_ms(self) -> int:
        """The wall-clock time (unix ms) after which no side effect of this lease may start."""
        return int((time.time() + (self.valid_until - time.monotonic())) * 1000)

    def on_lost(self, fn: Callable[[], None]) -> None:
        self._on_lost.append(fn)

    def give_up(self, why: str) -> None:
        if self.lost:
            return
        self.lost, self.why = True, why
        log.warning("lease of loop %s %s", self.key, why, extra={"loop_id": self.key})
        for fn in self._on_lost:
            fn()

    async def refresh(self) -> bool:
        """Extend the lease; False once it is lost or lapsed (then nothing may act on it)."""
        if not self.held:
            self.give_up("lapsed" if not self.lost else "lost")
            return False
        sent = time.monotonic()
        try:
            self.revision = await self.kv.update(self.key, self.value, last=self.revision)
        except (nats.js.errors.KeyWrongLastSequenceError, nats.js.errors.KeyNotFoundError):
            self.give_up("taken by another replica")
            return False
        except Exception as e:  # transient: the lease lapses by itself if this goes on
            log.warning("lease of loop %s: refresh failed: %s", self.key, e, extra={"loop_id": self.key})
            return self.held
        if not self.lost:
            self.valid_until = sent + self.ttl - SAFETY_SECONDS
        return self.held

    async def release(self) -> None:
        if self.lost:
            return
        self.lost = True
        with contextlib.suppress(Exception):
            await self.kv.delete(self.key, last=self.revision)


class Leases:
    """This replica's leases: acquisition (with eager takeover from a dead holder) and liveness."""

    def __init__(self, nc: NATS, buckets: Mapping[int, KeyValue], names: Names, ttl: float) -> None:
        self.nc = nc
        self.buckets = dict(buckets)  # the leases bucket of each shard served
        self.names = names
        self.ttl = ttl
        self._who = f"{socket.gethostname()}:{os.getpid()}"
        self.token, self.value = self._new_token()
        self._held: set[Lease] = set()
        self._sub: Subscription | None = None

    def _new_token(self) -> tuple[str, bytes]:
        token = uuid.uuid4().hex
        # The value names the holder: its liveness token, then host:pid for people.
        return token, f"{token} {self._who}".encode()

    async def start(self) -> None:
        self._sub = await self.nc.subscribe(self.names.lease_holder(self.token), cb=self._answer)

    async def connection_lost(self) -> None:
        """The connection dropped (nats-py is about to reconnect): give up every lease, and answer
        under a new token, so the keys given up are taken at once by whoever asks next, this
        replica included.

        Called before the reconnect: the old subscription leaves without being sent again, the new
        one reaches the server before any request made from now on (nats-py sends the
        subscriptions first)."""
        self.give_up_all(CONNECTION_LOST)
        old = self._sub
        if old is None:
            return  # not started, or stopped
        self.token, self.value = self._new_token()
        with contextlib.suppress(Exception):
            await old.unsubscribe()
        self._sub = None
        with contextlib.suppress(Exception):  # closed or draining: the service is stopping
            self._sub = await self.nc.subscribe(self.names.lease_holder(self.token), cb=self._answer)

    async def stop(self) -> None:
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()
            self._sub = None

    async def _answer(self, msg: Msg) -> None:
        if msg.reply:
            with contextlib.suppress(Exception):
                await msg.respond(b"")

    def give_up_all(self, why: str) -> None:
        """E.g. on a lost connection: other replicas may take these loops over right now."""
        for lease in list(self._held):
            lease.give_up(why)

    def bucket_of(self, loop_id: str) -> KeyValue:
        """The leases bucket of the loop's shard (one this replica serves)."""
        return self.buckets[self.names.shard_of(loop_id)]

    async def acquire(self, loop_id: str) -> Lease | None:
        """The loop's lease, or None while another live replica (or another drive here) holds it."""
        kv = self.bucket_of(loop_id)
        sent = time.monotonic()
        token, value = self.token, self.value
        taken = await self._create(kv, loop_id, token, value)
        if taken is None:
            return None
        revision, taken_from = taken
        if token != self.token:
            # The connection dropped meanwhile: the token the key names answers no more, so any
            # replica may take it now. Not held; let it go (the item comes back).
            with contextlib.suppress(Exception):
                await kv.delete(loop_id, last=revision)
            return None
        lease = Lease(
            kv=kv,
            key=loop_id,
            value=value,
            revision=revision,
            taken_from=taken_from,
            ttl=self.ttl,
            valid_until=sent + self.ttl - SAFETY_SECONDS,
        )
        self._held.add(lease)
        lease.on_lost(lambda: self._held.discard(lease))
        return lease

    def forget(self, lease: Lease) -> None:
        self._held.discard(lease)

    async def orphaned(self) -> list[str]:
        """Loops of the shards served whose lease names a holder that is gone (its process or its
        connection).

        Their work items are still held by the dead replica until the work consumer's ack wait
        passes; a new signal replaces such an item at once. Asked once by a replica starting up,
        which is when a crashed replica's replacement arrives.
        """
        found: list[str] = []
        limiter = anyio.CapacityLimiter(32)

        async def check(kv: KeyValue, loop_id: str) -> None:
            async with limiter:
                try:
                    entry = await kv.get(loop_id)
                except nats.js.errors.KeyNotFoundError:
                    return  # released or expired
                holder = (entry.value or b"").split(b" ", 1)[0].decode(errors="replace")
                if (
                    holder
                    and holder != self.token
                    and await is_gone(self.nc, self.names.lease_holder(holder), timeout=PING_SECONDS)
                ):
                    found.append(loop_id)

        async with anyio.create_task_group() as tg:
            for shard, kv in self.buckets.items():
                bucket = self.names.leases_bucket_of(shard)
                prefix = f"$KV.{bucket}."
                for key in await subjects(self.nc, kv_stream(bucket), f"{prefix}>"):
                    tg.start_soon(check, kv, key[len(prefix) :])
        return sorted(found)

    async def _create(self, kv: KeyValue, loop_id: str, token: str, value: bytes) -> tuple[int, bytes] | None:
        """(revision, the value of the holder it was taken over from, or b"")."""
        try:
            return int(await kv.create(loop_id, value)), b""
        except nats.js.errors.KeyWrongLastSequenceError:
            pass
        except nats.js.errors.APIError as e:
            if e.err_code not in (ERR_WRONG_LAST_SEQUENCE, ERR_WRONG_LAST_SEQUENCE_INFLIGHT):
                raise
        return await self._take_over(kv, loop_id, token, value)

    async def _take_over(self, kv: KeyValue, loop_id: str, token: str, value: bytes) -> tuple[int, bytes] | None:
        """Take the key from a holder whose connection is gone; None if it is alive (or unknown).
        (The drive says so in its log, once it knows the turn it takes up.)"""
        try:
            entry = await kv.get(loop_id)
        except nats.js.errors.KeyNotFoundError:
            return None  # just expired or released: the next delivery creates it
        holder = (entry.value or b"").split(b" ", 1)[0].decode(errors="replace")
        if holder == token or not holder or entry.revision is None:
            return None  # another drive in this process holds it
        if not await is_gone(self.nc, self.names.lease_holder(holder), timeout=PING_SECONDS):
            return None  # alive, or stopped or busy: its key expires by itself
        try:
            revision = int(await kv.update(loop_id, value, last=entry.revision))
        except (nats.js.errors.KeyWrongLastSequenceError, nats.js.errors.KeyNotFoundError):
            return None  # another replica was faster, or the key expired meanwhile
        metrics.inc(metrics.LEASE_TAKEOVERS)
        return revision, entry.value or b"?"


async def keep(lease: Lease, *, tick: float, in_progress: Callable[[], Awaitable[object]] | None = None) -> None:
    """Until ``lease`` is lost: call ``in_progress`` every ``tick`` and refresh the lease every TTL/4,
    the first of each after twice its interval (most drives are over sooner and send neither; the
    lease, taken just now, holds for the TTL, and the item for ``4 * tick``)."""
    every = lease.ttl / 4
    refreshed = time.monotonic() + every  # so the first refresh is due TTL/2 from now
    ticks = 0
    while True:
        await anyio.sleep(max(0.0, min(tick, every, lease.valid_until - time.monotonic())))
        ticks += 1
        if in_progress is not None and ticks > 1:
            with contextlib.suppress(Exception):
                await in_progress()
        if time.monotonic() - refreshed >= every or lease.valid_until - time.monotonic() < tick:
            refreshed = time.monotonic()
            if not await lease.refresh():
                return
        elif not lease.held:
            lease.give_up("lapsed")
            return
