"""A replica whose NATS connection drops gives up its leases, and they can be taken at once: it
answers under a new liveness token after its reconnect, which comes sooner than another replica asks."""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio
import anyio.lowlevel
import nats.js.errors
import pytest
from nats.aio.client import Client as NATS

from services.model_step.lease import Leases
from shared.connect import connect
from shared.events import new_id
from shared.settings import Settings
from shared.streams import ensure_all

pytestmark = pytest.mark.anyio


@pytest.fixture
async def holder(settings: Settings, nc: NATS) -> AsyncIterator[Leases]:
    """Leases on a connection of their own, told of its drops as the model-step service tells them."""
    await ensure_all(nc.jetstream(timeout=10), settings)
    made: list[Leases] = []

    async def dropped() -> None:
        await made[0].connection_lost()

    own = await connect(settings, name="holder", disconnected_cb=dropped)
    try:
        kv = await own.jetstream().key_value(settings.names.leases_bucket)
        made.append(Leases(own, {0: kv}, settings.names, settings.lease_ttl_seconds))
        await made[0].start()
        yield made[0]
    finally:
        await own.close()


async def _reconnect(nc: NATS) -> None:
    await nc.force_reconnect()  # type: ignore[attr-defined]  # nats-py has it; the stub lacks it
    with anyio.fail_after(10):
        while not nc.is_connected:
            await anyio.sleep(0.01)
    await nc.flush()


async def test_the_leases_of_a_replica_whose_connection_dropped_are_taken_at_once(
    settings: Settings, nc: NATS, holder: Leases
) -> None:
    other = Leases(nc, {0: await nc.jetstream().key_value(settings.names.leases_bucket)}, settings.names, 2.0)
    await other.start()
    mine, own_again, later = new_id(), new_id(), new_id()
    lease = await holder.acquire(mine)
    assert lease is not None and await holder.acquire(own_again) is not None
    assert await other.acquire(mine) is None  # its holder is alive

    await _reconnect(holder.nc)
    assert lease.lost  # given up with the connection
    # Back within milliseconds, yet the keys it gave up are free: no wait for them to expire.
    taken = await other.acquire(mine)
    assert taken is not None and taken.taken_from == lease.value
    assert await holder.acquire(own_again) is not None  # the holder takes its own old key back too
    # Its new token answers: what it holds from now on is held.
    assert await holder.acquire(later) is not None
    assert await other.acquire(later) is None


async def test_a_lease_acquired_while_the_connection_drops_is_not_held(
    settings: Settings, nc: NATS, holder: Leases
) -> None:
    loop_id = new_id()
    got: list[object] = []

    async def acquire() -> None:
        got.append(await holder.acquire(loop_id))

    async with anyio.create_task_group() as tg:
        tg.start_soon(acquire)
        await anyio.lowlevel.checkpoint()  # the create is on its way, under the token of the connection that drops
        await holder.connection_lost()
    # The key it created names a token that answers no more: any replica could take it, so the
    # acquisition is not a lease, and it let the key go.
    assert got == [None]
    kv = await nc.jetstream().key_value(settings.names.leases_bucket)
    with pytest.raises(nats.js.errors.KeyNotFoundError):  # deleted
        await kv.get(loop_id)
