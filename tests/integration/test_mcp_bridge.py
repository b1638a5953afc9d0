"""MCP servers bridged as tool workers on a real nats-server: registration, calls, progress, cancel,
supervision (SIGKILL of the stdio child), list_changed, replicas, and bad servers/listings."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import msgspec
import pytest
from nats.aio.client import Client as NATS

from services.mcp.bridge import Bridge
from services.mcp.connect import McpStartError, McpTarget
from services.toolcaller import client as cl
from services.toolcaller.executor import PlannedCall, normalise, run_batch
from services.toolcaller.registry import ToolRegistry
from services.tools.sdk import tool
from services.tools.worker import Worker
from services.toolwire.protocol import CallIds
from shared import shaping
from shared.content import ImageBlock, TextBlock, text_of
from shared.events import RawToolUse
from shared.natsserver import free_port
from shared.settings import Settings
from tests import natsfixtures
from tests.mcpfixtures import everything_command, probe_command, start_everything_http, time_command

pytestmark = pytest.mark.anyio


@asynccontextmanager
async def bridged(
    nc: NATS, settings: Settings, name: str, command: list[str], **options: float
) -> AsyncIterator[Bridge]:
    bridge = Bridge(McpTarget(name=name, command=tuple(command)), settings, nc, **options)
    async with anyio.create_task_group() as tg:
        with anyio.fail_after(30):
            await tg.start(bridge.run)  # raises McpStartError when it ended early
        assert bridge.start_error is None, bridge.start_error
        try:
            yield bridge
        finally:
            tg.cancel_scope.cancel()  # it drains


@asynccontextmanager
async def registry(nc: NATS, settings: Settings) -> AsyncIterator[ToolRegistry]:
    reg = ToolRegistry(nc, settings.names)
    await reg.start()
    try:
        yield reg
    finally:
        await reg.stop()


def ids() -> CallIds:
    n = time.time_ns()  # a fresh idempotency key per call (equal keys would be answered once)
    return CallIds(loop_id="l", turn_id="t", step_id=f"s{n}", tool_use_id=f"u{n}", execution_id=f"e{n}")


async def call(
    nc: NATS, settings: Settings, name: str, args: object, timeout: float = 20, **kw: object
) -> cl.CallOutcome:
    async with cl.ToolClient(nc, settings.names, heartbeat_seconds=settings.heartbeat_seconds) as client:
        return await client.call(name, msgspec.json.encode(args), ids=ids(), timeout=timeout, **kw)  # type: ignore[arg-type]


def text(outcome: cl.CallOutcome) -> str:
    assert outcome.status == cl.OK, outcome
    assert outcome.result is not None
    return shaping.flatten_to_text(outcome.result.blocks)


def log_lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


@pytest.fixture
def probe_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "probe.log"
    monkeypatch.setenv("PROBE_LOG", str(path))
    return path


@pytest.fixture
def probe_hold(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Create this file to keep restarted probe servers from starting (see probe_server.py)."""
    path = tmp_path / "hold"
    monkeypatch.setenv("PROBE_HOLD", str(path))
    return path


async def batch(reg: ToolRegistry, nc: NATS, settings: Settings, name: str, args: str) -> str:
    """One call through the batch executor (what the model-step runs): the model-visible text."""
    async with cl.ToolClient(nc, settings.names) as client:
        use = RawToolUse(id=f"toolu_{time.time_ns()}", name=name, input=args)
        [result] = await run_batch(
            [PlannedCall.approved(use, f"e{time.time_ns()}")],
            loop_id="l",
            turn_id="t",
            step_id=f"s{time.time_ns()}",
            spec_of=reg.get,
            client=client,
            publish=_ignore,
            on_unavailable=reg.mark_no_workers,
        )
    return text_of(result)


async def _ignore(event: object) -> None:
    pass


def hold(path: Path) -> None:
    path.touch()


def release(path: Path) -> None:
    path.unlink()


async def test_probe_tools_register_and_map_results(nc: NATS, settings: Settings, probe_log: Path) -> None:
    async with registry(nc, settings) as reg, bridged(nc, settings, "probe", probe_command()):
        wanted = {"probe_slow", "probe_count", "probe_pid", "probe_fail", "probe_structured", "probe_image"}
        # (the registrations arrive one by one)
        await reg.wait_until(lambda r: wanted <= {t.name for t in r.live()})
        slow = reg.get("probe_slow")
        assert slow is not None and slow.source == "mcp:probe" and slow.healthy
        assert slow.read_only is True and slow.open_world is False
        assert slow.input_schema["required"] == ["seconds"]
        fail = reg.get("probe_fail")
        assert fail is not None and fail.destructive is True and fail.idempotent is True
        # One long-lived session: the server's counter survives between calls.
        assert text(await call(nc, settings, "probe_count", {})) == "1"
        assert text(await call(nc, settings, "probe_count", {})) == "2"
        out = await call(nc, settings, "probe_fail", {})
        assert out.result is not None and out.result.is_error
        assert normalise("probe_fail", 20, out) == ("error: it broke", True)
        assert text(await call(nc, settings, "probe_structured", {})) == '{"answer":42}'
        img = await call(nc, settings, "probe_image", {})
        assert img.result is not None and isinstance(img.result.blocks[0], ImageBlock)
        assert img.result.blocks[0].media_type == "image/png"
        # Larger than a NATS message: cut like any tool's result (head and tail kept).
        big = text(await call(nc, settings, "probe_big", {"size": 3 * nc.max_payload}))
        assert len(big.encode()) < nc.max_payload and big.startswith("aaa") and big.endswith("z")
        assert "[tool output truncated: omitted" in big
        bad_args = await call(nc, settings, "probe_count", [1, 2])
        assert bad_args.result is not None and bad_args.result.is_error
        assert text(bad_args).startswith("error: invalid tool arguments")


async def test_progress_and_cancel_reach_the_server(nc: NATS, settings: Settings, probe_log: Path) -> None:
    async with bridged(nc, settings, "probe", probe_command()):
        progress: list[str] = []
        first = anyio.Event()

        async def on_progress(message: str) -> None:
            progress.append(message)
            first.set()

        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as tg:
                tg.start_soon(lambda: call(nc, settings, "probe_slow", {"seconds": 30}, on_progress=on_progress))
                with anyio.fail_after(10):
                    await first.wait()
                await anyio.sleep(0.3)
                cancelled_at = time.monotonic()
                scope.cancel()
        assert progress[0] == "step 1 (1)" and len(progress) >= 2
        with anyio.fail_after(1):
            while "cancelled slow" not in log_lines(probe_log):
                await anyio.sleep(0.02)
        assert time.monotonic() - cancelled_at < 1.0
        # The deadline cancels the MCP request too.
        out = await call(nc, settings, "probe_slow", {"seconds": 30}, timeout=0.8)
        assert out.status == cl.TIMEOUT
        with anyio.fail_after(2):
            while log_lines(probe_log).count("cancelled slow") < 2:
                await anyio.sleep(0.02)


async def test_sigkill_of_the_child_mid_call(nc: NATS, settings: Settings, probe_log: Path, probe_hold: Path) -> None:
    async with registry(nc, settings) as reg, bridged(nc, settings, "probe", probe_command()) as bridge:
        pid = int(text(await call(nc, settings, "probe_pid", {})))
        assert text(await call(nc, settings, "probe_count", {})) == "1"
        async with anyio.create_task_group() as tg:
            outcome: list[cl.CallOutcome] = []

            async def slow() -> None:
                outcome.append(await call(nc, settings, "probe_slow", {"seconds": 30}))

            tg.start_soon(slow)
            with anyio.fail_after(10):
                while "started slow" not in log_lines(probe_log):
                    await anyio.sleep(0.02)
            hold(probe_hold)  # the restart waits until the checks of the down state are done
            os.kill(pid, signal.SIGKILL)
        assert outcome[0].status == cl.CRASHED, outcome
        assert (
            normalise("probe_slow", 30, outcome[0])[0]
            == "error: tool crashed: MCP server probe went away during the call"
        )
        # Down: still registered (unhealthy), out of the queue group, answering unavailable at once.
        await reg.wait_until(lambda r: (t := r.get("probe_count")) is not None and not t.healthy)
        with anyio.fail_after(5):
            while bridge.worker.taking_calls:
                await anyio.sleep(0.02)
        began = time.monotonic()
        down = await call(nc, settings, "probe_count", {})
        assert down.status == cl.UNAVAILABLE and time.monotonic() - began < 0.5
        began = time.monotonic()
        said = await batch(reg, nc, settings, "probe_count", "{}")
        assert said == "error: tool unavailable: probe_count (mcp:probe is down, restarting)"
        assert time.monotonic() - began < 0.5
        live = reg.get("probe_count")
        assert live is not None and not live.healthy and "probe_count" in {t.name for t in reg.live()}
        # Restarted: healthy again, a fresh process (its counter starts over), calls succeed.
        release(probe_hold)
        await reg.wait_until(lambda r: (t := r.get("probe_count")) is not None and t.healthy, timeout=15)
        assert bridge.restarts >= 1
        assert int(text(await call(nc, settings, "probe_pid", {}))) != pid
        assert text(await call(nc, settings, "probe_count", {})) == "1"


async def test_list_changed_updates_registrations(nc: NATS, settings: Settings, probe_log: Path) -> None:
    async with registry(nc, settings) as reg, bridged(nc, settings, "probe", probe_command()):
        await reg.wait_for("probe_toggle")
        assert reg.get("probe_extra") is None
        began = time.monotonic()
        assert text(await call(nc, settings, "probe_toggle", {})) == "extra on"
        await reg.wait_for("probe_extra", timeout=1)
        assert time.monotonic() - began < 1.0
        assert text(await call(nc, settings, "probe_extra", {})) == "extra"
        assert text(await call(nc, settings, "probe_toggle", {})) == "extra off"
        await reg.wait_gone("probe_extra", timeout=1)
        assert reg.get("probe_toggle") is not None


async def test_two_bridges_share_calls(nc: NATS, settings: Settings, probe_log: Path, probe_hold: Path) -> None:
    async with (
        registry(nc, settings) as reg,
        bridged(nc, settings, "probe", probe_command()) as one,
        bridged(nc, settings, "probe", probe_command()) as two,
    ):
        live = await reg.wait_for("probe_pid", replicas=2)
        assert live.replicas == 2 and not live.conflict
        pids = {text(await call(nc, settings, "probe_pid", {})) for _ in range(30)}
        assert len(pids) == 2
        # One replica's server goes down (and stays down): calls go to the healthy replica only.
        hold(probe_hold)
        gone, kept = sorted(pids)
        os.kill(int(gone), signal.SIGKILL)
        with anyio.fail_after(5):  # the replica notices (a ping a second) and leaves the queue group
            while one.worker.taking_calls and two.worker.taking_calls:
                await anyio.sleep(0.05)
        now = reg.get("probe_pid")
        assert now is not None and now.healthy and now.replicas == 2  # one healthy replica serves
        answers = [await call(nc, settings, "probe_pid", {}) for _ in range(20)]
        assert all(a.status == cl.OK for a in answers), answers
        assert {text(a) for a in answers} == {kept}
        release(probe_hold)


async def test_bad_listing_keeps_the_good_tools(nc: NATS, settings: Settings, probe_log: Path) -> None:
    class NoArgs(msgspec.Struct):
        pass

    owner = tool(name="probe_pid", description="owns the name", input=NoArgs)(lambda args: "sdk")
    async with registry(nc, settings) as reg, anyio.create_task_group() as tg:
        await tg.start(Worker([owner], settings, nc).run)
        await reg.wait_for("probe_pid")
        async with bridged(nc, settings, "probe", probe_command("--bad")) as bridge:
            await reg.wait_for("probe_count")
            reasons = {r.mcp_name: r.reason for r in bridge.rejected}
            assert "not a valid tool name for model APIs" in reasons["bad name!"]
            assert "inputSchema is not valid JSON Schema" in reasons["badschema"]
            assert reasons["pid"] == "the name 'probe_pid' is already served by a loopwire tool worker"
            names = {t.name for t in reg.live()}
            assert "probe_badschema" not in names and not any("!" in n for n in names)
            assert reg.get("probe_pid").source == ""  # type: ignore[union-attr]
            assert text(await call(nc, settings, "probe_pid", {})) == "sdk"
            assert text(await call(nc, settings, "probe_count", {})) == "1"
        tg.cancel_scope.cancel()


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        ([sys.executable, "-c", "print('hello, not MCP')"], "is not an MCP server"),
        (probe_command("--hang"), "did not answer initialize within 2s"),
        (["/nonexistent/mcp-server"], "cannot start MCP server"),
    ],
    ids=["not-mcp", "no-initialize", "no-such-command"],
)
async def test_start_errors_register_nothing(nc: NATS, settings: Settings, command: list[str], expected: str) -> None:
    async with registry(nc, settings) as reg:
        bridge = Bridge(McpTarget(name="bad", command=tuple(command)), settings, nc, init_timeout=2)
        began = time.monotonic()
        with anyio.fail_after(15), pytest.raises(McpStartError) as raised:
            await bridge.run()
        assert raised.value is bridge.start_error
        assert isinstance(bridge.start_error, McpStartError)
        assert expected in str(bridge.start_error)
        assert time.monotonic() - began < 10
        assert reg.live() == []


async def test_mcp_server_time(nc: NATS, settings: Settings) -> None:
    async with registry(nc, settings) as reg, bridged(nc, settings, "time", time_command()):
        live = await reg.wait_for("time_get_current_time")
        assert live.source == "mcp:time" and "timezone" in live.input_schema["properties"]
        await reg.wait_for("time_convert_time")  # (registrations arrive one by one)
        out = text(await call(nc, settings, "time_get_current_time", {"timezone": "Europe/Warsaw"}))
        assert msgspec.json.decode(out)["timezone"] == "Europe/Warsaw"
        bad = await call(nc, settings, "time_get_current_time", {"timezone": "Not/AZone"})
        assert bad.result is not None and bad.result.is_error and text(bad).startswith("error: ")


async def test_server_everything(nc: NATS, settings: Settings) -> None:
    command = everything_command()
    async with registry(nc, settings) as reg, bridged(nc, settings, "everything", command):
        await reg.wait_for("everything_echo")
        assert text(await call(nc, settings, "everything_echo", {"message": "hi"})) == "Echo: hi"
        structured = await call(nc, settings, "everything_get-structured-content", {"location": "New York"})
        first = structured.result.blocks[0] if structured.result else None
        assert isinstance(first, TextBlock) and "temperature" in msgspec.json.decode(first.text)
        progress: list[str] = []

        async def on_progress(message: str) -> None:
            progress.append(message)

        out = await call(
            nc,
            settings,
            "everything_trigger-long-running-operation",
            {"duration": 1, "steps": 4},
            on_progress=on_progress,
        )
        assert "completed" in text(out).lower()
        assert progress[:2] == ["progress 1/4", "progress 2/4"]


async def test_cli_reports_bad_servers_and_exits_1(settings: Settings) -> None:
    env = {**os.environ, "LW_NATS_URL": ",".join(settings.nats_urls), "LW_PREFIX": settings.prefix}
    cli = [sys.executable, "-m", "services.cli", "serve", "mcp"]
    await natsfixtures.create_deployment(settings)  # a bridge refuses a server without a deployment first
    cases = [
        (["bad", "--init-timeout", "1", "--", *probe_command("--hang")], "did not answer initialize within 1s"),
        (["bad", "--", sys.executable, "-c", "print('hi')"], "is not an MCP server"),
        (["a_b", "--", "x"], "invalid MCP server name 'a_b'"),
        (["ok"], "give the MCP server as -- COMMAND [ARGS...] or as --url URL"),
        (["ok", "--url", "http://127.0.0.1:9/mcp", "--header-env", "Authorization=LW_TEST_UNSET"], "is not set"),
    ]
    for args, expected in cases:
        done = await anyio.run_process([*cli, *args], env=env, check=False)
        assert done.returncode == 1, (args, done.stderr)
        assert "error: " in done.stderr.decode() and expected in done.stderr.decode(), done.stderr.decode()


async def test_streamable_http_server_and_its_restart(nc: NATS, settings: Settings) -> None:
    port = free_port()
    server = start_everything_http(port)
    try:
        target = McpTarget(name="web", url=f"http://127.0.0.1:{port}/mcp", headers={"X-Loopwire-Test": "1"})
        bridge = Bridge(target, settings, nc, ping_interval=0.3, ping_timeout=2, backoff_max=0.5)
        async with registry(nc, settings) as reg, anyio.create_task_group() as tg:
            with anyio.fail_after(20):
                await tg.start(bridge.run)
            assert (await reg.wait_for("web_echo")).source == "mcp:web"
            assert text(await call(nc, settings, "web_echo", {"message": "over http"})) == "Echo: over http"
            progress: list[str] = []

            async def on_progress(message: str) -> None:
                progress.append(message)

            out = await call(
                nc, settings, "web_trigger-long-running-operation", {"duration": 1, "steps": 2}, on_progress=on_progress
            )
            assert "completed" in text(out).lower() and progress[:2] == ["progress 1/2", "progress 2/2"]
            # The server goes away: its tools stay registered, unhealthy, and answer unavailable at once.
            server.kill()
            server.wait()
            await reg.wait_until(lambda r: (t := r.get("web_echo")) is not None and not t.healthy, timeout=5)
            with anyio.fail_after(5):
                while bridge.worker.taking_calls:
                    await anyio.sleep(0.02)
            down = await call(nc, settings, "web_echo", {"message": "x"})
            assert down.status == cl.UNAVAILABLE and not down.worker_id  # left the queue group
            assert await batch(reg, nc, settings, "web_echo", '{"message": "x"}') == (
                "error: tool unavailable: web_echo (mcp:web is down, restarting)"
            )
            # It comes back: the bridge reconnects (new session, tools re-listed) and calls succeed.
            server = start_everything_http(port)
            await reg.wait_until(lambda r: (t := r.get("web_echo")) is not None and t.healthy, timeout=15)
            assert text(await call(nc, settings, "web_echo", {"message": "again"})) == "Echo: again"
            tg.cancel_scope.cancel()
    finally:
        server.kill()
        server.wait()


async def test_a_child_that_stops_answering_is_replaced(nc: NATS, settings: Settings, probe_log: Path) -> None:
    async with (
        registry(nc, settings) as reg,
        bridged(nc, settings, "probe", probe_command(), ping_interval=0.2, ping_timeout=0.5) as bridge,
    ):
        pid = int(text(await call(nc, settings, "probe_pid", {})))
        # Busy with a call (answering nothing, pings included): not hung, the call's deadline bounds it.
        assert text(await call(nc, settings, "probe_block", {"seconds": 1.5})) == "unblocked"
        assert bridge.restarts == 0 and int(text(await call(nc, settings, "probe_pid", {}))) == pid
        os.kill(pid, signal.SIGSTOP)  # alive but silent: only the ping can tell
        try:
            began = time.monotonic()
            await reg.wait_until(lambda r: (t := r.get("probe_pid")) is not None and not t.healthy, timeout=5)
            assert time.monotonic() - began < 2.5
            await reg.wait_until(lambda r: (t := r.get("probe_pid")) is not None and t.healthy, timeout=15)
            assert bridge.restarts >= 1
            assert int(text(await call(nc, settings, "probe_pid", {}))) != pid
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
