"""Where each shard's streams are led, and moving the leaders so the shards spread over the nodes.

A shard has four streams: its history and work streams and the streams behind its leases and results
buckets. :func:`read` reports each one's leader, followers and message count. :func:`plan` gives each
shard one node so that every node leads about as many shards as the others and a shard's four leaders
sit on one node (its writes then stay on one server); :func:`balance` moves the leaders there with
JetStream's leader step-down naming the preferred server (nats-server 2.11 and later).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Final, Literal

import anyio
import msgspec
import nats.errors
import nats.js.errors
from nats.aio.client import Client as NATS

from shared.jsapi import ApiErrorBody, js_request
from shared.jserrors import JetStreamError, JetStreamUnavailableError
from shared.subjects import Names, js_api, kv_stream

Kind = Literal["history", "work", "leases", "results"]
INFO_TIMEOUT: Final = 2.0
STEP_DOWN_TRIES: Final = 5


@dataclass(frozen=True, slots=True)
class Peer:
    """A server following a stream: whether it has every record, and how many it lacks."""

    name: str
    current: bool
    lag: int


@dataclass(frozen=True, slots=True)
class StreamPlace:
    """One shard stream as the cluster places it (``leader`` is empty while it has none, or it is missing)."""

    shard: int
    kind: Kind
    name: str  # the stream's, or the bucket's for leases and results
    stream: str
    leader: str
    followers: tuple[Peer, ...]
    replicas: int
    messages: int
    missing: bool = False

    @property
    def peers(self) -> set[str]:
        """The servers holding a copy: those that can lead it."""
        return ({self.leader} if self.leader else set()) | {f.name for f in self.followers}


@dataclass(frozen=True, slots=True)
class Move:
    stream: str
    leader: str  # now
    to: str


class _Placement(msgspec.Struct):
    preferred: str


class _StepDownRequest(msgspec.Struct):
    placement: _Placement


class _StepDownReply(msgspec.Struct):
    success: bool = False
    error: ApiErrorBody | None = None


def shard_streams(names: Names, shard: int) -> list[tuple[Kind, str, str]]:
    """(kind, name, stream) of a shard's four streams."""
    leases, results = names.leases_bucket_of(shard), names.results_bucket_of(shard)
    return [
        ("history", names.history_stream_of(shard), names.history_stream_of(shard)),
        ("work", names.work_stream_of(shard), names.work_stream_of(shard)),
        ("leases", leases, kv_stream(leases)),
        ("results", results, kv_stream(results)),
    ]


async def _place(nc: NATS, shard: int, kind: Kind, name: str, stream: str) -> StreamPlace:
    try:
        info = await nc.jetstream(timeout=INFO_TIMEOUT).stream_info(stream)
    except nats.js.errors.NotFoundError:
        return StreamPlace(shard, kind, name, stream, "", (), 0, 0, missing=True)
    leader, peers = "", []
    if info.cluster is not None:
        leader, peers = info.cluster.leader or "", info.cluster.replicas or []
    followers = tuple(Peer(p.name or "", bool(p.current), p.lag or 0) for p in peers)
    return StreamPlace(shard, kind, name, stream, leader, followers, info.config.num_replicas or 1, info.state.messages)


async def read(nc: NATS, names: Names) -> list[StreamPlace]:
    """Every shard's four streams, shard by shard."""
    found = []
    for k in names.shard_ids:
        found += [await _place(nc, k, kind, name, stream) for kind, name, stream in shard_streams(names, k)]
    return found


def plan(places: list[StreamPlace]) -> dict[int, str]:
    """The node each shard's streams should be led from: every node leads about as many shards (at
    most one more than another), and among the least loaded a shard keeps the node that leads most of
    its streams now. A shard whose streams share no server is left out."""
    shards: dict[int, list[StreamPlace]] = {}
    for p in places:
        shards.setdefault(p.shard, []).append(p)
    candidates: dict[int, set[str]] = {}
    for k, ps in shards.items():
        common = set.intersection(*(p.peers for p in ps))
        if common:
            candidates[k] = common
    nodes = set().union(*candidates.values()) if candidates else set()
    if not nodes:
        return {}

    def leads(k: int, node: str) -> int:
        return sum(p.leader == node for p in shards[k])

    load: Counter[str] = Counter()
    target: dict[int, str] = {}
    # Shards most led from one node first: they keep it while it has room.
    for k in sorted(candidates, key=lambda k: (-max(leads(k, n) for n in candidates[k]), k)):
        # The least loaded node first (so no node leads two shards more than another), then the one
        # that leads most of this shard already (fewer moves).
        node = min(candidates[k], key=lambda n: (load[n], -leads(k, n), n))
        target[k] = node
        load[node] += 1
    return target


def moves(places: list[StreamPlace], target: dict[int, str]) -> list[Move]:
    """The leader changes that bring each shard's streams to its node in ``target``."""
    return [
        Move(p.stream, p.leader, target[p.shard])
        for p in places
        if p.shard in target and p.leader != target[p.shard] and target[p.shard] in p.peers
    ]


async def _leader(nc: NATS, stream: str, consumer: str = "") -> str:
    js = nc.jetstream(timeout=INFO_TIMEOUT)
    try:
        info = await (js.consumer_info(stream, consumer) if consumer else js.stream_info(stream))
    except (nats.errors.Error, TimeoutError):
        return ""  # no leader yet (an election)
    return (info.cluster.leader or "") if info.cluster is not None else ""


async def step_down(nc: NATS, stream: str, preferred: str, *, consumer: str = "", within: float = 30.0) -> None:
    """Make ``preferred`` the leader of ``stream`` (or of its ``consumer``, which has a Raft group of its
    own): ask the leader to step down in its favour, then wait until it leads (asking again if another
    server won the election)."""
    body = msgspec.json.encode(_StepDownRequest(_Placement(preferred)))
    if consumer:
        subject = f"{js_api('CONSUMER.LEADER.STEPDOWN', stream)}.{consumer}"
    else:
        subject = js_api("STREAM.LEADER.STEPDOWN", stream)
    what = f"{stream} {consumer}".strip()
    with anyio.move_on_after(within):
        for _ in range(STEP_DOWN_TRIES):
            if await _leader(nc, stream, consumer) == preferred:
                return
            try:
                msg = await js_request(nc, subject, body, None, INFO_TIMEOUT)
            except JetStreamUnavailableError:
                await anyio.sleep(0.2)  # no leader to ask yet
                continue
            reply = msgspec.json.decode(msg.data, type=_StepDownReply)
            if reply.error is not None:
                raise JetStreamError(reply.error.code, reply.error.err_code, reply.error.description)
            for _ in range(50):
                if (leader := await _leader(nc, stream, consumer)) == preferred:
                    return
                if leader:
                    break  # another server leads: ask again
                await anyio.sleep(0.1)
    raise JetStreamUnavailableError(f"{what}: {preferred} did not become its leader")


async def balance(nc: NATS, names: Names, *, within: float = 30.0) -> list[Move]:
    """Move leaders as :func:`plan` says; the moves made (each given ``within`` seconds).

    A shard's work consumer (once a model-step created it) follows its work stream to the node: its
    deliveries and acks are decided by its own leader, so elsewhere it would tie the shard to a
    second node."""
    places = await read(nc, names)
    target = plan(places)
    todo = moves(places, target)
    for m in todo:
        await step_down(nc, m.stream, m.to, within=within)
    for k, node in sorted(target.items()):
        stream = names.work_stream_of(k)
        leader = await _leader(nc, stream, names.work_consumer)
        if leader and leader != node:
            await step_down(nc, stream, node, consumer=names.work_consumer, within=within)
            todo.append(Move(f"{stream} {names.work_consumer}", leader, node))
    return todo
