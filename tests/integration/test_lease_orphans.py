"""A replica starting up finds the loops whose lease names a holder that is gone (not one alive)."""

from __future__ import annotations

import pytest
from nats.aio.client import Client as NATS

from services.model_step.lease import Leases
from shared.connect import connect
from shared.events import new_id
from shared.settings import Settings
from shared.streams import ensure_all

pytestmark = pytest.mark.anyio


async def test_loops_of_a_holder_that_is_gone_are_orphaned_and_others_are_not(settings: Settings, nc: NATS) -> None:
    js = nc.jetstream(timeout=10)
    await ensure_all(js, settings)
    kv = await js.key_value(settings.names.leases_bucket)
    ttl = settings.lease_ttl_seconds

    dead_nc = await connect(settings, name="dead")
    dead = Leases(dead_nc, {0: await dead_nc.jetstream().key_value(settings.names.leases_bucket)}, settings.names, ttl)
    await dead.start()
    alive = Leases(nc, {0: kv}, settings.names, ttl)
    await alive.start()
    orphan, kept, released = new_id(), new_id(), new_id()
    assert await dead.acquire(orphan) is not None
    assert await alive.acquire(kept) is not None
    lease = await dead.acquire(released)
    assert lease is not None
    await lease.release()
    await dead_nc.close()  # its process is gone: nobody answers on its liveness subject

    newcomer = Leases(nc, {0: kv}, settings.names, ttl)
    await newcomer.start()
    assert await newcomer.orphaned() == [orphan]
    # The holder itself never counts its own loops as orphaned.
    assert await alive.orphaned() == [orphan]
