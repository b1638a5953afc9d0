"""The deployment's layout (its shard count), read from the deployment by every process at connect.

Shard 0's history stream records the count in its metadata (:data:`shared.shards.META_SHARDS`), and
whether the deployment grew from one shard (:data:`shared.shards.META_GREW`). Every service (through
:mod:`services.runner`) and every CLI command reads it once it is connected and goes on with the
deployment's count (:func:`read_deployment`); ``LW_SHARDS`` only chooses the count of a deployment not created
yet. A process whose ``LW_SHARDS`` is set to another count refuses to start (:class:`ShardCountError`,
one line) before it creates or writes anything: it would look for loops in the wrong streams.
A program using the Python API adopts it the same way (``loopwire.read_deployment``); following
every loop (``follow_all``) and listing loops read it themselves (:func:`names_of`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import socket
from dataclasses import dataclass
from typing import Final

import anyio
import msgspec
import nats.errors
import nats.js.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from shared import shards
from shared.errors import LoopwireError
from shared.jserrors import JetStreamUnavailableError
from shared.settings import Settings
from shared.subjects import Names

# How long one read of shard 0's stream may take (a cluster still electing answers late).
READ_SECONDS: Final = 5.0


class ShardCountError(LoopwireError):
    """``LW_SHARDS`` is set to another count than the deployment's."""

    def __init__(self, chosen: int, recorded: int, prefix: str) -> None:
        self.chosen = chosen
        self.recorded = recorded
        super().__init__(
            f"LW_SHARDS={chosen} but the deployment (LW_PREFIX={prefix}) has {recorded} shard"
            f"{'s' if recorded != 1 else ''}: unset LW_SHARDS (every process reads the count from the "
            f"deployment), or grow it with `loopwire shards grow N` while its services are stopped"
        )


@dataclass(frozen=True, slots=True)
class Layout:
    """What shard 0's stream records; ``exists`` is False for a deployment not created yet."""

    shards: int
    grew: bool
    exists: bool


async def read(nc: NATS, prefix: str) -> Layout:
    """The layout recorded in shard 0's history stream of ``prefix`` (raises the JetStream errors)."""
    try:
        info = await nc.jetstream(timeout=READ_SECONDS).stream_info(Names(prefix).history_stream_of(0))
    except nats.js.errors.NotFoundError:
        return Layout(1, False, exists=False)
    meta = info.config.metadata or {}
    return Layout(int(meta.get(shards.META_SHARDS, "1")), meta.get(shards.META_GREW) == "1", exists=True)


def check(settings: Settings, layout: Layout) -> Settings:
    """``settings`` with the deployment's count; :class:`ShardCountError` when ``LW_SHARDS`` says another."""
    if not layout.exists:
        return dataclasses.replace(settings, shards=settings.shards or 1)
    if settings.shards and settings.shards != layout.shards:
        raise ShardCountError(settings.shards, layout.shards, settings.prefix)
    adopted = dataclasses.replace(settings, shards=layout.shards)
    shards.grew(adopted.names, layout.grew)
    return adopted


async def read_deployment(nc: NATS, settings: Settings, *, within: float = 30.0) -> Settings:
    """Read the layout (retrying a JetStream that does not answer yet for ``within`` seconds) and
    :func:`check` ``settings`` against it."""
    layout: Layout | None = None
    with anyio.move_on_after(within):
        while layout is None:
            try:
                layout = await read(nc, settings.prefix)
            except (nats.errors.TimeoutError, nats.js.errors.ServiceUnavailableError, nats.errors.NoRespondersError):
                await anyio.sleep(0.2)
    if layout is None:
        raise JetStreamUnavailableError(
            f"JetStream did not answer within {within:g} s: cannot read the deployment's shard count"
        )
    return check(settings, layout)


async def names_of(nc: NATS, names: Names) -> Names:
    """``names`` with the deployment's shard count, read now (for calls made once, such as following
    every loop: a process that reads often adopts the count once, :func:`read_deployment`)."""
    try:
        layout = await read(nc, names.prefix)
    except (nats.errors.Error, nats.js.errors.Error):
        return names  # the read that follows reports what it meets
    if not layout.exists or layout.shards == names.shards:
        return names
    adopted = Names(names.prefix, layout.shards)
    shards.grew(adopted, layout.grew)
    return adopted


class Presence(msgspec.Struct, frozen=True):
    """A running service's answer on :attr:`~shared.subjects.Names.presence`."""

    service: str
    shards: int
    pid: int
    host: str


async def announce(nc: NATS, names: Names, service: str) -> None:
    """Answer every presence request on ``nc`` while it is open (the service's life)."""
    body = msgspec.json.encode(Presence(service, names.shards, os.getpid(), socket.gethostname()))

    async def answer(msg: Msg) -> None:
        if msg.reply:
            await nc.publish(msg.reply, body)

    await nc.subscribe(names.presence, cb=answer)
    await nc.flush(timeout=READ_SECONDS)  # type: ignore[arg-type]  # a float works; the stub says int


async def live_services(nc: NATS, names: Names, *, within: float = 1.0) -> list[Presence]:
    """Every service that answers a presence request within ``within`` seconds."""
    found: list[Presence] = []
    inbox = nc.new_inbox()

    async def collect(msg: Msg) -> None:
        with contextlib.suppress(msgspec.DecodeError, msgspec.ValidationError):
            found.append(msgspec.json.decode(msg.data, type=Presence))

    sub = await nc.subscribe(inbox, cb=collect)
    try:
        await nc.publish(names.presence, b"", reply=inbox)
        await anyio.sleep(within)
    finally:
        await sub.unsubscribe()
    return found
