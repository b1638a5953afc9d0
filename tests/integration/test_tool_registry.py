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
from shared.connect import connect
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


CHURN_TOOLS = 150
CHURN_STARTS = 200


async def test_a_registry_started_again_after_a_stop_loads_afresh(nc: NATS, settings: Settings) -> None:
    """The model-step's start-up stops its registry and starts it again when a later step of its
    start-up meets a JetStream still electing: the second start loads the bucket as the first did."""
    kv = await ensure_tools_bucket(nc.jetstream(), settings.names)
    reg = Registration(worker_id="w", spec=ToolSpec(name="alpha"))
    await kv.put(registration_key("alpha", "w"), msgspec.json.encode(reg))
    registry = ToolRegistry(nc, settings.names)
    await registry.start()
    await kv.put(registration_key("alpha", "w"), msgspec.json.encode(reg))  # the watch is past the load
    await registry.wait_for("alpha", timeout=5)
    await registry.stop()
    await kv.put(
        registration_key("beta", "w"), msgspec.json.encode(Registration(worker_id="w", spec=ToolSpec(name="beta")))
    )
    try:
        with anyio.fail_after(5):
            await registry.start()
        assert sorted(t.name for t in registry.live()) == ["alpha", "beta"]
    finally:
        await registry.stop()


async def test_every_start_sees_every_live_tool_while_workers_rewrite_and_add_entries(
    nc: NATS, settings: Settings
) -> None:
    """Workers refresh their entries, new ones register and old ones leave while callers start: each
    start still holds every entry written before it began and not deleted since."""
    writer = await connect(settings, name="test-writers")
    kv = await ensure_tools_bucket(writer.jetstream(), settings.names)
    written: set[str] = set()  # tool names acked by the bucket so far
    gone: set[str] = set()  # names deleted (or about to be): a start may rightly miss them
    added: list[str] = []

    async def put(name: str) -> None:
        reg = Registration(worker_id="w", spec=ToolSpec(name=name, description="d" * 200))
        await kv.put(registration_key(name, "w"), msgspec.json.encode(reg))
        written.add(name)

    for i in range(CHURN_TOOLS):
        await put(f"tool_{i}")

    async def refresh() -> None:
        # Every entry rewritten at once, over and over (well inside the bucket's TTL), as a worker's
        # refresh does for each of its tools.
        while True:
            async with anyio.create_task_group() as burst:
                for name in [f"tool_{i}" for i in range(CHURN_TOOLS)] + added:
                    burst.start_soon(put, name)

    async def come_and_go() -> None:
        # New workers register; the oldest of them leave again (a deletion marker each).
        k = 0
        while True:
            name = f"new_{k}"
            await put(name)
            added.append(name)
            k += 1
            if len(added) > 60:
                old = added.pop(0)
                gone.add(old)
                await kv.delete(registration_key(old, "w"))
            await anyio.sleep(0.003)

    short: list[tuple[int, list[str]]] = []
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(refresh)
            tg.start_soon(come_and_go)
            for attempt in range(CHURN_STARTS):
                before = set(written)
                async with ToolRegistry(nc, settings.names) as registry:
                    missing = sorted(before - {t.name for t in registry.live()} - gone)
                if missing:
                    short.append((attempt, missing[:5]))
            tg.cancel_scope.cancel()
    finally:
        await writer.close()
    assert short == [], f"{len(short)} of {CHURN_STARTS} starts missed entries (attempt, first missing): {short[:10]}"
