"""The tool registry's start-up on a real nats-server: once ``start()`` returns, every registered tool
is in the view, however the watch's first messages and its "initial values done" marker interleave."""

from __future__ import annotations

import anyio
import msgspec
import pytest
from nats.aio.client import Client as NATS

from services.toolcaller.registry import ToolRegistry
from services.toolwire.bucket import ensure_tools_bucket, registration_key
from services.toolwire.spec import Registration, ToolSpec
from shared.settings import Settings

pytestmark = pytest.mark.anyio

TOOLS = 50
STARTS = 200


async def test_every_start_sees_every_registered_tool(nc: NATS, settings: Settings) -> None:
    kv = await ensure_tools_bucket(nc.jetstream(), settings.names)
    for i in range(TOOLS):
        reg = Registration(worker_id=f"w{i}", spec=ToolSpec(name=f"tool_{i}", description="d" * 200))
        await kv.put(registration_key(reg.spec.name, reg.worker_id), msgspec.json.encode(reg))
    short: list[tuple[int, int]] = []
    for attempt in range(STARTS):
        async with ToolRegistry(nc, settings.names) as registry:
            seen = len(registry.live())
            if seen != TOOLS:
                short.append((attempt, seen))
    assert short == [], f"starts that returned before the registry was loaded (attempt, tools seen): {short}"


async def test_start_on_an_empty_bucket_returns_at_once(nc: NATS, settings: Settings) -> None:
    with anyio.fail_after(2):
        async with ToolRegistry(nc, settings.names) as registry:
            assert registry.live() == []


async def test_start_sees_deletions_and_then_follows_new_workers(nc: NATS, settings: Settings) -> None:
    kv = await ensure_tools_bucket(nc.jetstream(), settings.names)
    for name in ("alpha", "beta"):
        reg = Registration(worker_id="w", spec=ToolSpec(name=name))
        await kv.put(registration_key(name, "w"), msgspec.json.encode(reg))
    await kv.delete(registration_key("beta", "w"))  # the last record of the bucket is a deletion marker
    async with ToolRegistry(nc, settings.names) as registry:
        assert [t.name for t in registry.live()] == ["alpha"]
        reg = Registration(worker_id="w", spec=ToolSpec(name="gamma"))
        await kv.put(registration_key("gamma", "w"), msgspec.json.encode(reg))
        await registry.wait_for("gamma", timeout=5)
        assert [t.name for t in registry.live()] == ["alpha", "gamma"]
