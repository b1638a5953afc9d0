"""Tool workers as separate OS processes on a real nats-server: load sharing, failure detection,
discovery, deadlines, heartbeat loss, cancel, drain, and the README's "Add a tool" example."""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from nats.aio.client import Client as NATS

from services.deployment import Deployment
from services.toolcaller import client as cl
from services.toolcaller.executor import PlannedCall, normalise, run_batch
from services.toolcaller.registry import ToolRegistry
from services.toolwire.protocol import CallIds
from shared import shaping
from shared.content import TextBlock, ToolResultMessage
from shared.events import Event, RawToolUse, RetryPolicy
from shared.procs import ServiceProcess
from shared.settings import Settings
from tests import natsfixtures

pytestmark = pytest.mark.anyio

REPO = Path(__file__).resolve().parents[2]
HEARTBEAT = 0.3


class Workers:
    """Tool workers of one test: ``python -m services.tools`` (the entry under test) or a script."""

    def __init__(self, deployment: Deployment) -> None:
        self.deployment = deployment
        self.n = 0

    def start(self, *args: str, wait: bool = True, **env: str) -> ServiceProcess:
        """Start ``python -m services.tools <args>`` (or a script) and wait until it serves."""
        self.n += 1
        argv = list(args) if args[0].endswith(".py") else ["-m", "services.tools", *args]
        return self.deployment.start(f"worker{self.n}", argv, env, timeout=30, wait=wait)


@pytest.fixture
async def workers(settings: Settings, tmp_path: Path) -> AsyncIterator[Workers]:
    extra = {
        "LW_HEARTBEAT_SECONDS": str(HEARTBEAT),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH", "")])),
    }
    deployment = Deployment.for_settings(settings, tmp_path, log_level="WARNING", env=extra)
    await natsfixtures.create_deployment(settings)  # a worker refuses a server without one
    with deployment.sup:
        yield Workers(deployment)


@asynccontextmanager
async def caller(nc: NATS, settings: Settings) -> AsyncIterator[tuple[ToolRegistry, cl.ToolClient]]:
    async with (
        ToolRegistry(nc, settings.names) as registry,
        cl.ToolClient(nc, settings.names, heartbeat_seconds=HEARTBEAT) as client,
    ):
        yield registry, client


def ids(**kw: str) -> CallIds:
    base = {
        "loop_id": str(uuid.uuid4()),
        "step_id": str(uuid.uuid4()),
        "tool_use_id": "u",
        "execution_id": str(uuid.uuid4()),
    }
    return CallIds(**{**base, **kw})


async def batch(
    registry: ToolRegistry, client: cl.ToolClient, name: str, args: str, *, retry: bool = False
) -> tuple[ToolResultMessage, float]:
    """One call through the executor; ``retry``: with the tool's retry policy (default: none, so a
    failure shows at once)."""
    events: list[Event] = []

    async def publish(e: Event) -> None:
        events.append(e)

    use = RawToolUse(id=f"toolu_{uuid.uuid4().hex[:8]}", name=name, input=args)
    t0 = time.monotonic()
    [result] = await run_batch(
        [PlannedCall.approved(use, str(uuid.uuid4()))],
        loop_id=str(uuid.uuid4()),
        turn_id=str(uuid.uuid4()),
        step_id=str(uuid.uuid4()),
        spec_of=registry.get,
        client=client,
        publish=publish,
        on_unavailable=registry.mark_no_workers,
        retries=None if retry else {name: RetryPolicy(max_attempts=1)},
    )
    return result, time.monotonic() - t0


def text(r: ToolResultMessage) -> str:
    assert r.blocks and isinstance(r.blocks[0], TextBlock)
    return r.blocks[0].text


# --- load sharing and a replica killed mid-run ------------------------------------------------------


async def test_two_replicas_share_calls_and_a_killed_one_loses_nothing_silently(
    nc: NATS, settings: Settings, workers: Workers
) -> None:
    a = workers.start("calculator", wait=False)
    b = workers.start("calculator", wait=False)
    a.wait_ready()
    b.wait_ready()
    async with caller(nc, settings) as (registry, client):
        live = await registry.wait_for("calculator", replicas=2)
        assert live.replicas == 2

        async def run_calls(n: int, pace: float, outcomes: dict[int, cl.CallOutcome]) -> None:
            async with anyio.create_task_group() as tg:
                for i in range(n):

                    async def one(i: int = i) -> None:
                        args = f'{{"expression": "{i} * 3 + 1"}}'.encode()
                        outcomes[i] = await client.call("calculator", args, ids=ids(tool_use_id=f"u{i}"), timeout=10)

                    tg.start_soon(one)
                    if pace:
                        await anyio.sleep(pace)

        # Phase 1: 200 calls, both replicas serve some, all correct.
        first: dict[int, cl.CallOutcome] = {}
        await run_calls(200, 0, first)
        assert len(first) == 200
        for i, out in first.items():
            assert out.status == cl.OK and out.result is not None, out
            assert normalise("calculator", 10, out) == (str(i * 3 + 1), False)
        served = {out.worker_id for out in first.values()}
        assert len(served) == 2, f"both replicas served some calls: {served}"

        # Phase 2: 200 paced calls; SIGKILL one replica in the middle.
        second: dict[int, cl.CallOutcome] = {}
        killed_at = 0.0

        async def kill_later() -> None:
            nonlocal killed_at
            await anyio.sleep(0.4)
            a.signal(signal.SIGKILL)
            killed_at = time.monotonic()

        t0 = time.monotonic()
        async with anyio.create_task_group() as tg:
            tg.start_soon(kill_later)
            tg.start_soon(run_calls, 200, 0.005, second)
        elapsed = time.monotonic() - t0
        assert len(second) == 200, "every call came back"
        ok = [i for i, o in second.items() if o.status == cl.OK]
        failed = {i: o for i, o in second.items() if o.status != cl.OK}
        for i in ok:
            assert normalise("calculator", 10, second[i]) == (str(i * 3 + 1), False)
        for o in failed.values():
            # Visible to the caller as an error result, e.g. "error: tool crashed: worker stopped responding".
            msg, is_error = normalise("calculator", 10, o)
            assert is_error and msg.startswith("error: tool crashed"), msg
        assert killed_at and elapsed < 10
        survivor_ids = {o.worker_id for o in second.values() if o.status == cl.OK}
        assert len(survivor_ids) == 2, "calls before the kill went to both replicas"
        late = [o for i, o in second.items() if i >= 150]
        assert all(o.status == cl.OK for o in late), "the survivor keeps serving"
        assert len({o.worker_id for o in late}) == 1
        assert b.running


# --- discovery: late workers, vanished workers ------------------------------------------------------


async def test_worker_started_after_the_caller_is_usable_within_a_second(
    nc: NATS, settings: Settings, workers: Workers
) -> None:
    async with caller(nc, settings) as (registry, client):
        r, _ = await batch(registry, client, "clock", '{"timezone": "UTC"}')
        assert r.is_error and text(r) == "error: unknown tool: clock"
        workers.start("clock")  # returns once the worker announced READY (subscribed + registered)
        t0 = time.monotonic()
        await registry.wait_for("clock", timeout=1.0)
        r, _ = await batch(registry, client, "clock", '{"timezone": "UTC"}')
        assert time.monotonic() - t0 < 1.0
        assert not r.is_error and text(r).endswith("(UTC)")


@pytest.mark.parametrize("how", ["sigterm", "sigkill"])
async def test_stopping_all_workers_makes_the_next_call_fail_fast(
    nc: NATS, settings: Settings, workers: Workers, how: str
) -> None:
    procs = [workers.start("clock", wait=False) for _ in range(2)]
    for p in procs:
        p.wait_ready()
    async with caller(nc, settings) as (registry, client):
        await registry.wait_for("clock", replicas=2)
        r, _ = await batch(registry, client, "clock", "{}")
        assert not r.is_error
        for p in procs:
            if how == "sigterm":
                assert p.stop() == 0
            else:
                p.kill()
        if how == "sigterm":
            await registry.wait_gone("clock", timeout=2)  # graceful stops deregister
        r, elapsed = await batch(registry, client, "clock", "{}")
        assert r.is_error and elapsed < 1.0, "no waiting for the 60 s deadline"
        if how == "sigterm":
            assert text(r) == "error: unknown tool: clock"
        else:
            # Killed workers' entries linger until their TTL; NATS "no responders" is authoritative.
            assert text(r) == "error: tool unavailable: clock (no live workers)"
            # Known but unreachable: offered to no model, and later calls say "unavailable", not "unknown".
            view = registry.get("clock")
            assert view is not None and view.replicas == 0 and "clock" not in [t.name for t in registry.live()]
            r, _ = await batch(registry, client, "clock", "{}")
            assert text(r) == "error: tool unavailable: clock (no live workers)"
            # A read-only tool's default retry policy waits a few seconds for a worker before giving up.
            r, elapsed = await batch(registry, client, "clock", "{}", retry=True)
            assert text(r) == "error: tool unavailable: clock (no live workers)" and 3.0 < elapsed < 6.0
            # A worker registering again makes it live at once.
            workers.start("clock")
            await registry.wait_for("clock")
            r, _ = await batch(registry, client, "clock", "{}")
            assert not r.is_error


# --- deadline, heartbeat loss, cancel, drain --------------------------------------------------------


async def test_deadline_is_enforced_by_the_worker(nc: NATS, settings: Settings, workers: Workers) -> None:
    workers.start("sleep", LW_TOOL_TIMEOUT_SECONDS="0.8")
    async with caller(nc, settings) as (registry, client):
        spec = await registry.wait_for("sleep")
        assert spec.timeout_seconds == 0.8
        r, elapsed = await batch(registry, client, "sleep", '{"seconds": 30}')
        assert r.is_error and text(r) == "error: tool timed out after 0.8s"
        assert 0.7 < elapsed < 2.0
        out = await client.call("sleep", b'{"seconds": 30}', ids=ids(), timeout=0.5)
        assert out.status == cl.TIMEOUT and out.message.startswith("deadline passed"), "the worker said so itself"
        r, _ = await batch(registry, client, "sleep", '{"seconds": 0.05}')
        assert text(r) == "slept 0.05s"


async def test_heartbeat_loss_is_detected_well_before_the_deadline(
    nc: NATS, settings: Settings, workers: Workers
) -> None:
    w = workers.start("sleep")
    async with caller(nc, settings) as (registry, client):
        await registry.wait_for("sleep")
        progress: list[str] = []

        async def on_progress(m: str) -> None:
            progress.append(m)

        async def stop_worker() -> None:
            await anyio.sleep(0.8)  # a couple of heartbeats first
            w.signal(signal.SIGSTOP)

        t0 = time.monotonic()
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(stop_worker)
                out = await client.call("sleep", b'{"seconds": 20}', ids=ids(), timeout=30, on_progress=on_progress)
            elapsed = time.monotonic() - t0
        finally:
            w.signal(signal.SIGCONT)
        assert out.status == cl.CRASHED and out.message == "worker stopped responding"
        assert normalise("sleep", 30, out) == ("error: tool crashed: worker stopped responding", True)
        assert elapsed < 0.8 + 3 * HEARTBEAT + 1.0, f"detected after {elapsed:.2f}s, deadline 30 s"
        assert progress and progress[0].startswith("running for"), "heartbeats arrived before the stop"
        # Resumed, the worker serves again, and it dropped the orphaned call (the caller's toolctl):
        # its graceful stop does not wait for the 20 s sleep.
        r, _ = await batch(registry, client, "sleep", '{"seconds": 0}')
        assert text(r) == "slept 0s"
    t0 = time.monotonic()
    assert w.stop() == 0
    assert time.monotonic() - t0 < 3.0


async def test_cancel_via_toolctl(nc: NATS, settings: Settings, workers: Workers) -> None:
    w = workers.start("sleep")
    async with caller(nc, settings) as (registry, client):
        await registry.wait_for("sleep")
        call_ids = ids()

        async def cancel_later() -> None:
            await anyio.sleep(0.5)
            await nc.publish(settings.names.toolctl(call_ids.execution_id), b"")

        t0 = time.monotonic()
        async with anyio.create_task_group() as tg:
            tg.start_soon(cancel_later)
            out = await client.call("sleep", b'{"seconds": 20}', ids=call_ids, timeout=30)
        assert out.status == cl.CANCELED and time.monotonic() - t0 < 2.0
        assert normalise("sleep", 30, out) == (shaping.TOOL_CALL_CANCELED, True)

        # Cancelling a batch (the caller's cancel scope) cancels the call on the worker too.
        with anyio.move_on_after(0.3) as scope:
            await batch(registry, client, "sleep", '{"seconds": 20}')
        assert scope.cancelled_caught
    # Nothing is left running on the worker: its graceful stop does not wait for the 20 s sleeps.
    t0 = time.monotonic()
    assert w.stop() == 0
    assert time.monotonic() - t0 < 3.0


async def test_sigterm_drains_in_flight_calls_and_takes_no_new_ones(
    nc: NATS, settings: Settings, workers: Workers
) -> None:
    w = workers.start("sleep")
    async with caller(nc, settings) as (registry, client):
        await registry.wait_for("sleep")
        results: dict[str, Any] = {}

        async def long_call() -> None:
            results["long"] = await client.call("sleep", b'{"seconds": 1.5}', ids=ids(), timeout=10)

        async with anyio.create_task_group() as tg:
            tg.start_soon(long_call)
            await anyio.sleep(0.3)
            w.signal(signal.SIGTERM)
            await registry.wait_gone("sleep", timeout=2)  # subscriptions drained, then deregistered
            results["new"] = await client.call("sleep", b'{"seconds": 0}', ids=ids(), timeout=10)
            r, elapsed = await batch(registry, client, "sleep", '{"seconds": 0}')
            assert "long" not in results, "the in-flight call is still running"
        assert results["new"].status == cl.UNAVAILABLE, "a draining worker takes no new calls"
        assert r.is_error and text(r) == "error: unknown tool: sleep" and elapsed < 1.0
        long = results["long"]
        assert long.status == cl.OK and normalise("sleep", 10, long) == ("slept 1.5s", False)
        assert w.proc is not None
        assert await anyio.to_thread.run_sync(lambda: w.proc.wait(timeout=10)) == 0  # type: ignore[union-attr]


# --- the README example -----------------------------------------------------------------------------

EXAMPLE = REPO / "examples" / "add_a_tool.py"


def test_example_is_ten_lines_and_in_the_docs() -> None:
    code = EXAMPLE.read_text()
    lines = [line for line in code.splitlines() if line.strip()]
    assert len(lines) <= 10, lines
    docs = (REPO / "docs" / "tools.md").read_text()
    assert code in docs, "docs/tools.md shows examples/add_a_tool.py verbatim"
    readme = REPO / "README.md"
    if readme.exists() and "Add a tool in 10 lines" in readme.read_text():
        assert code in readme.read_text(), "README shows examples/add_a_tool.py verbatim"


async def test_readme_example_runs_as_written(nc: NATS, settings: Settings, workers: Workers) -> None:
    w = workers.start(str(EXAMPLE))
    async with caller(nc, settings) as (registry, client):
        spec = await registry.wait_for("shout")
        assert spec.input_schema["required"] == ["text"]
        r, _ = await batch(registry, client, "shout", '{"text": "hello"}')
        assert (text(r), r.is_error) == ("HELLO!", False)
        r, _ = await batch(registry, client, "shout", '{"text": 5}')
        assert r.is_error and text(r).startswith("error: invalid tool arguments: Expected `str`")
    assert w.stop() == 0
