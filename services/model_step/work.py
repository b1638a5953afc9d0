"""The work queue from the model-step's side: pulling work items (lost ones are found by services.reconcile).

A work item is a message on the loop's work subject (``<prefix>.work.<loop_id>`` with one shard) in
its shard's work stream (at most one per loop: a new signal replaces a pending one). Replicas share
one durable pull consumer per shard, and pull from each shard they serve with a puller of its own.

Pulls are made here rather than with nats-py's ``fetch``: a fetch that times out on the client
leaves its pull request waiting on the server, which may later deliver an item nobody asked for
(held, unacknowledged, by a replica with no free slot). Here a waiting pull ends only on the
server's own answer (an item, or its 408/404 status), and a top-up pull never waits (``no_wait``),
so a replica holds at most as many items as it asked for. A pull waiting when the connection drops
ends at once (:meth:`WorkPuller.connection_lost`): the server forgets a pull request whose reply
subject lost its interest, so its answer would never come, and the next pull goes out with the
reconnect. A waiting pull asks the server for idle heartbeats and ends when they stop: the consumer
leader that held it is gone (its node died or stalls) while the connection still looks alive, and
the next pull reaches the new leader instead of waiting out the whole expiry and a grace.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Sequence
from typing import Final

import anyio
import nats.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from shared.errors import ConfigError
from shared.subjects import H_STATUS, Names, js_api

log = logging.getLogger("loopwire.model_step.work")

# Extra time a pull allows the server for its answer past its expiry before giving it up.
_ANSWER_GRACE_SECONDS: Final = 5.0
_HEARTBEAT_STATUS: Final = "100"
# A waiting pull's heartbeat is this fraction of its expiry (the server takes at most half), and the
# pull is lost after this many heartbeats' worth of silence (one late beat is no loss).
_HEARTBEATS_PER_WAIT: Final = 4
_SILENT_BEATS: Final = 3


def served_shards(names: Names, served: Sequence[int]) -> tuple[int, ...]:
    """The shards a replica serves: ``served`` (``LW_SHARDS_SERVED``), or every shard when empty."""
    if not served:
        return tuple(names.shard_ids)
    bad = sorted({k for k in served if k not in names.shard_ids})
    if bad:
        raise ConfigError(f"LW_SHARDS_SERVED names shards {bad}; LW_SHARDS={names.shards} has 0 to {names.shards - 1}")
    return tuple(sorted(set(served)))


def consumer_config(names: Names, shard: int, ack_wait: float) -> ConsumerConfig:
    """The work consumer of ``shard``'s work stream (the same durable name in each)."""
    return ConsumerConfig(
        durable_name=names.work_consumer,
        ack_policy=AckPolicy.EXPLICIT,
        deliver_policy=DeliverPolicy.ALL,
        filter_subject=names.work_all_of(shard),
        ack_wait=ack_wait,
        max_deliver=-1,
        max_ack_pending=-1,
    )


class WorkPuller:
    """Pull requests on one shard's shared work consumer, answered on this replica's own inbox."""

    def __init__(self, nc: NATS, names: Names, shard: int) -> None:
        self.nc = nc
        self.shard = shard
        self._next = f"{js_api('CONSUMER.MSG.NEXT', names.work_stream_of(shard))}.{names.work_consumer}"
        self._inbox = ""
        self._sub: Subscription | None = None
        self._waiting: anyio.CancelScope | None = None  # the wait for a pull's answer, while one waits

    async def start(self) -> None:
        self._inbox = self.nc.new_inbox()
        self._sub = await self.nc.subscribe(self._inbox)

    async def close(self) -> None:
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()
            self._sub = None

    async def pull(self, batch: int, *, wait: float = 0.0) -> list[Msg]:
        """Up to ``batch`` items: waiting up to ``wait`` seconds for the first, or none (``wait=0``).

        An item delivered late (after a lost answer) waits on the inbox and is taken by the next
        pull, within that pull's batch.
        """
        assert self._sub is not None, "start() first"
        req: dict[str, object] = {"batch": batch}
        silence = wait + _ANSWER_GRACE_SECONDS
        if wait > 0:
            beat = wait / _HEARTBEATS_PER_WAIT
            req["expires"] = int(wait * 1e9)
            req["idle_heartbeat"] = int(beat * 1e9)
            silence = beat * _SILENT_BEATS
        else:
            req["no_wait"] = True
        out: list[Msg] = []
        # Items already waiting from an earlier request count first.
        while len(out) < batch and self._sub.pending_msgs > 0:
            m = await self._sub.next_msg(timeout=0.01)
            if not self._status(m):
                out.append(m)
        if len(out) >= batch:
            return out
        await self.nc.publish(self._next, json.dumps(req).encode(), reply=self._inbox)
        with anyio.CancelScope() as self._waiting:
            await self._answer(self._sub, out, batch, wait + _ANSWER_GRACE_SECONDS, silence)
        self._waiting = None
        return out

    async def _answer(self, sub: Subscription, out: list[Msg], batch: int, patience: float, silence: float) -> None:
        """Take the items of one pull into ``out`` until its batch is full or the server ends it;
        give it up after ``patience`` in all, or ``silence`` with nothing from the server."""
        limit = time.monotonic() + patience
        while len(out) < batch:
            wait = min(silence, limit - time.monotonic())
            try:
                m = await sub.next_msg(timeout=max(0.01, wait))
            except nats.errors.TimeoutError:
                log.warning("work pull of shard %d: the server said nothing for %.1fs; pulling again", self.shard, wait)
                return
            status = self._status(m)
            if status == _HEARTBEAT_STATUS:
                continue
            if status:
                return  # 404 no items, 408 expired, 409 and the like: this request is over
            out.append(m)

    def connection_lost(self) -> None:
        """The connection dropped: the pull waiting now gets no answer (see the module docstring)."""
        if self._waiting is not None:
            self._waiting.cancel()

    def _status(self, m: Msg) -> str:
        """The status of a message the server sent about a pull (items arrive on their own subject)."""
        return (m.headers or {}).get(H_STATUS, "") if m.subject == self._inbox else ""
