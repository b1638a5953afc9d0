"""Streams and buckets: created idempotently (also by racing services), incompatible ones reported."""

from __future__ import annotations

import anyio
import pytest
from nats.aio.client import Client as NATS
from nats.js import api

from shared.jserrors import IncompatibleConfigError
from shared.settings import Settings
from shared.streams import TOOLS_TTL_SECONDS, ensure_all, ensure_history_stream, ensure_kv, ensure_work_stream

pytestmark = pytest.mark.anyio


async def test_ensure_all_is_idempotent_and_race_safe(nc: NATS, settings: Settings) -> None:
    js = nc.jetstream(timeout=10)
    async with anyio.create_task_group() as tg:
        for _ in range(3):
            tg.start_soon(ensure_all, js, settings)
    await ensure_all(js, settings)
    n = settings.names
    h = (await js.stream_info(n.history_stream)).config
    assert h.subjects == [n.hist_all] and h.retention == api.RetentionPolicy.LIMITS
    assert h.allow_direct and h.allow_atomic and h.deny_delete and h.deny_purge
    assert h.duplicate_window >= 120 and h.num_replicas == 1
    w = (await js.stream_info(n.work_stream)).config
    assert w.subjects == [n.work_all] and w.retention == api.RetentionPolicy.WORK_QUEUE
    assert w.max_msgs_per_subject == 1 and w.discard == api.DiscardPolicy.OLD and not w.discard_new_per_subject
    tools = (await js.stream_info(f"KV_{n.tools_bucket}")).config
    assert tools.max_age == TOOLS_TTL_SECONDS and tools.max_msgs_per_subject == 1 and tools.allow_msg_ttl
    leases = (await js.stream_info(f"KV_{n.leases_bucket}")).config
    assert leases.max_age == settings.lease_ttl_seconds and leases.max_msgs_per_subject == 1


async def test_incompatible_streams_and_buckets_are_reported(nc: NATS, settings: Settings) -> None:
    js = nc.jetstream(timeout=10)
    n = settings.names
    await js.add_stream(api.StreamConfig(name=n.history_stream, subjects=[n.hist_all], duplicate_window=30))
    with pytest.raises(IncompatibleConfigError) as err:
        await ensure_history_stream(js, settings)
    assert {"allow_atomic", "allow_direct", "deny_delete", "deny_purge", "duplicate_window"} <= set(
        err.value.differences
    )
    assert err.value.name == n.history_stream and "allow_atomic" in str(err.value)

    await js.add_stream(
        api.StreamConfig(
            name=n.work_stream,
            subjects=[n.work_all],
            max_msgs_per_subject=1,
            discard=api.DiscardPolicy.NEW,
            discard_new_per_subject=True,
        )
    )
    with pytest.raises(IncompatibleConfigError) as err:
        await ensure_work_stream(js, settings)
    assert {"retention", "discard", "discard_new_per_subject"} <= set(err.value.differences)

    await ensure_kv(js, n.leases_bucket, ttl=30)
    with pytest.raises(IncompatibleConfigError) as err:
        await ensure_kv(js, n.leases_bucket, ttl=5)
    assert set(err.value.differences) == {"max_age"}
    with pytest.raises(IncompatibleConfigError) as err:
        await ensure_kv(js, n.leases_bucket, ttl=30, history=5)
    assert set(err.value.differences) == {"max_msgs_per_subject"}


async def test_the_leases_bucket_takes_the_configured_ttl(nc: NATS, settings: Settings) -> None:
    """A deployment that changes LW_LEASE_TTL_SECONDS (or one made with the earlier 30 s default) starts."""
    js = nc.jetstream(timeout=10)
    n = settings.names
    await ensure_kv(js, n.leases_bucket, ttl=30)
    await ensure_all(js, settings)
    leases = (await js.stream_info(f"KV_{n.leases_bucket}")).config
    assert leases.max_age == settings.lease_ttl_seconds
