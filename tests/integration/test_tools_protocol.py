"""The call protocol and discovery with in-process workers on a real nats-server."""

from __future__ import annotations

import dataclasses
import itertools
import threading
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import anyio
import msgspec
import pytest
from anyio.abc import TaskStatus
from nats.aio.client import Client as NATS

from services.toolcaller import client as cl
from services.toolcaller.registry import ToolRegistry
from services.tools.builtins import BUILTINS
from services.tools.sdk import Tool, ToolContext, tool
from services.tools.service import ToolService
from services.toolwire.bucket import ensure_tools_bucket
from services.toolwire.protocol import CallIds, now_ms, request_headers
from services.toolwire.spec import Registration
from shared.content import TextBlock
from shared.settings import Settings
from shared.subjects import H_REPLY_KIND
from tests import natsfixtures

pytestmark = pytest.mark.anyio

RUNS: list[str] = []


class Work(msgspec.Struct):
    tag: str = ""
    seconds: float = 0.0
    size: int = 0


@tool(name="work", description="counts its runs")
async def work(args: Work, ctx: ToolContext) -> str:
    RUNS.append(args.tag)
    await anyio.sleep(args.seconds)
    return "x" * args.size if args.size else f"done {args.tag} {ctx.ids.tool_use_id}"


@pytest.fixture
def fast(settings: Settings) -> Settings:
    return dataclasses.replace(settings, heartbeat_seconds=0.3)


@asynccontextmanager
async def worker(settings: Settings, tools: Sequence[Tool]) -> AsyncIterator[None]:
    await natsfixtures.create_deployment(settings)
    async with anyio.create_task_group() as tg:
        with anyio.fail_after(10):
            await tg.start(ToolService(tools, settings).run)
        yield
        tg.cancel_scope.cancel()  # it drains


def ids(key: str = "") -> CallIds:
    return CallIds(loop_id=key or str(uuid.uuid4()), step_id="s", tool_use_id="u", execution_id=str(uuid.uuid4()))


def text(out: cl.CallOutcome) -> str:
    assert out.result is not None, out
    return "".join(b.text for b in out.result.blocks if isinstance(b, TextBlock))


async def test_idempotency_key_runs_a_call_once(nc: NATS, fast: Settings) -> None:
    RUNS.clear()
    async with worker(fast, [work]), cl.ToolClient(nc, fast.names, heartbeat_seconds=0.3) as client:
        loop = str(uuid.uuid4())
        args = b'{"tag": "a", "seconds": 0.4}'
        outs: list[cl.CallOutcome] = []

        async def go() -> None:
            outs.append(await client.call("work", args, ids=ids(loop), timeout=5))

        async with anyio.create_task_group() as tg:  # a duplicate while the first runs
            tg.start_soon(go)
            await anyio.sleep(0.1)
            tg.start_soon(go)
        assert [text(o) for o in outs] == ["done a u", "done a u"]
        again = await client.call("work", args, ids=ids(loop), timeout=5)  # after it finished
        assert text(again) == "done a u"
        assert RUNS == ["a"], "one execution for one idempotency key"
        other = await client.call("work", b'{"tag": "b"}', ids=ids(loop), timeout=5)  # same key, other args
        assert text(other) == "done b u" and RUNS == ["a", "b"]

        # A canceled call is forgotten: a retry with the same key runs again.
        cancel_ids = ids(str(uuid.uuid4()))
        with anyio.move_on_after(0.2):
            await client.call("work", b'{"tag": "c", "seconds": 0.8}', ids=cancel_ids, timeout=10)
        retry = await client.call("work", b'{"tag": "c", "seconds": 0.8}', ids=cancel_ids, timeout=10)
        assert text(retry) == "done c u" and RUNS.count("c") == 2


async def test_cancel_that_overtakes_its_request(nc: NATS, fast: Settings) -> None:
    async with worker(fast, [work]), cl.ToolClient(nc, fast.names) as client:
        call_ids = ids()
        await client.cancel(call_ids.execution_id)
        await nc.flush()
        out = await client.call("work", b'{"tag": "z", "seconds": 5}', ids=call_ids, timeout=10)
        assert out.status == cl.CANCELED and out.message == "canceled before it started"


async def test_a_cancel_applies_to_its_attempt_only(nc: NATS, fast: Settings) -> None:
    """A request and its own cancel arriving together are answered "canceled"; a later attempt with
    the same execution id, idempotency key and arguments (a re-run step) still runs the tool."""
    RUNS.clear()
    async with worker(fast, [work]), cl.ToolClient(nc, fast.names, heartbeat_seconds=0.3) as client:
        call_ids = ids()
        args = b'{"tag": "again"}'
        first = nc.new_inbox()
        sub = await nc.subscribe(first)
        await nc.publish(fast.names.toolctl(call_ids.execution_id), first.encode())  # cancel overtakes
        await nc.publish(fast.names.tool("work"), args, reply=first, headers=request_headers(call_ids, now_ms() + 5000))
        reply = await sub.next_msg(timeout=5)
        assert reply.headers and reply.headers[H_REPLY_KIND] == "error" and b"canceled" in reply.data
        assert RUNS == []
        second = await client.call("work", args, ids=call_ids, timeout=5)
        assert second.status == cl.OK and text(second) == "done again u", second
        assert RUNS == ["again"]


async def test_a_request_past_its_start_by_time_never_runs(nc: NATS, fast: Settings) -> None:
    """``Lw-Start-By`` (the caller's lease end) has passed when the request arrives: not started."""
    RUNS.clear()
    async with worker(fast, [work]), cl.ToolClient(nc, fast.names) as client:
        late = await client.call("work", b'{"tag": "late"}', ids=ids(), timeout=5, start_by_ms=now_ms() - 1)
        assert late.status == cl.NOT_STARTED and "not started" in late.message, late
        in_time = await client.call("work", b'{"tag": "ok"}', ids=ids(), timeout=5, start_by_ms=now_ms() + 5000)
        assert in_time.status == cl.OK
        assert RUNS == ["ok"]


async def test_worker_survives_odd_requests(nc: NATS, fast: Settings) -> None:
    async with worker(fast, [work, BUILTINS["ask_user"]]), cl.ToolClient(nc, fast.names) as client:
        subject = fast.names.tool("work")
        await nc.publish(subject, b'{"tag": "noreply"}')  # no reply subject: dropped
        msg = await nc.request(subject, b'{"tag": "h"}', headers={"Lw-Deadline": "soon"}, timeout=5)
        assert msg.headers and msg.headers[H_REPLY_KIND] == "result"
        # A deadline already passed: timed out at once, the tool never runs.
        past = request_headers(ids(), now_ms() - 1000)
        msg = await nc.request(subject, b'{"tag": "late"}', headers=past, timeout=5)
        assert msg.headers and msg.headers[H_REPLY_KIND] == "error" and b"timeout" in msg.data
        # A result bigger than a NATS message is cut to fit.
        out = await client.call("work", b'{"size": 3000000}', ids=ids(), timeout=10)
        assert out.status == cl.OK and "[tool output truncated: omitted" in text(out)
        assert len(text(out).encode()) < nc.max_payload
        # ask_user is never run by a worker; called directly it says so.
        out = await client.call("ask_user", b'{"question": "?"}', ids=ids(), timeout=5)
        assert out.result is not None and out.result.is_error and "user-input gate" in text(out)
        assert text(await client.call("work", b'{"tag": "still"}', ids=ids(), timeout=5)).startswith("done still")


@tool(name="pace", read_only=True)
def pace(args: Work, ctx: ToolContext) -> str:
    if args.tag:
        ctx.progress(args.tag)
    time.sleep(args.seconds)
    return "paced"


@tool(name="quick", read_only=True, inline=True)
def quick(args: Work, ctx: ToolContext) -> str:
    ctx.progress("never sent: the event loop is held until the call returns")
    return f"{args.tag} on {threading.get_ident()}"


async def replies_of(nc: NATS, settings: Settings, name: str, args: bytes) -> list[tuple[float, str, bytes]]:
    """Every reply to one request: (seconds after sending, Lw-Reply, body), up to the final one."""
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox)
    sent = time.monotonic()
    headers = request_headers(ids(), now_ms() + 10_000, first_send=True)
    await nc.publish(settings.names.tool(name), args, reply=inbox, headers=headers)
    out: list[tuple[float, str, bytes]] = []
    while not out or out[-1][1] == "progress":
        msg = await sub.next_msg(timeout=5)
        out.append((time.monotonic() - sent, (msg.headers or {}).get(H_REPLY_KIND, ""), msg.data))
    with anyio.move_on_after(0.4):  # nothing follows the final reply
        extra = await sub.next_msg(timeout=0.4)
        out.append((time.monotonic() - sent, (extra.headers or {}).get(H_REPLY_KIND, ""), extra.data))
    await sub.unsubscribe()
    return out


async def test_heartbeats_only_for_calls_that_outlive_the_interval(nc: NATS, fast: Settings) -> None:
    """Interval 0.3 s: a shorter call gets its result alone; a longer one a heartbeat every interval
    from the first interval on; a progress message goes out at once; nothing after the final reply."""
    async with worker(fast, [pace, quick]):
        short = await replies_of(nc, fast, "pace", b'{"seconds": 0.05}')
        assert [k for _, k, _ in short] == ["result"]
        long = await replies_of(nc, fast, "pace", b'{"seconds": 1.05}')
        kinds = [k for _, k, _ in long]
        # Three intervals fit in the call; a loaded machine may send the first one late (the gaps
        # are checked below), so at least two heartbeats come before the result.
        assert kinds == ["progress"] * (len(kinds) - 1) + ["result"] and len(kinds) >= 3, long
        times = [t for t, _, _ in long]
        assert 0.25 <= times[0] <= 0.6, f"first heartbeat one interval in: {times}"
        assert all(b - a <= 0.6 for a, b in itertools.pairwise(times)), f"on time: {times}"
        assert all(b'"heartbeat_seconds":0.3' in body for _, k, body in long if k == "progress")
        told = await replies_of(nc, fast, "pace", b'{"tag": "warming up", "seconds": 0.1}')
        assert [k for _, k, _ in told] == ["progress", "result"] and b"warming up" in told[0][2], told
        assert told[0][0] < 0.25, "progress is sent at once, not at the next interval"
        inline = await replies_of(nc, fast, "quick", b'{"tag": "p"}')
        assert [k for _, k, _ in inline] == ["result"], inline


async def test_inline_tools_answer_on_the_worker_loop(nc: NATS, fast: Settings) -> None:
    """An inline tool answers like any other: results, duplicates by idempotency key, a cancel that
    overtook the request, a deadline already passed (never run), and many calls at once."""
    async with worker(fast, [quick]), cl.ToolClient(nc, fast.names) as client:
        out = await client.call("quick", b'{"tag": "a"}', ids=ids(), timeout=5)
        assert out.status == cl.OK and text(out) == f"a on {threading.get_ident()}", "ran on the event loop"
        loop = str(uuid.uuid4())
        first = await client.call("quick", b'{"tag": "k"}', ids=ids(loop), timeout=5)
        again = await client.call("quick", b'{"tag": "k"}', ids=ids(loop), timeout=5, first_send=True)
        assert text(first) == text(again)
        call_ids = ids()
        await client.cancel(call_ids.execution_id)
        await nc.flush()
        canceled = await client.call("quick", b'{"tag": "c"}', ids=call_ids, timeout=5, first_send=True)
        assert canceled.status == cl.CANCELED and canceled.message == "canceled before it started"
        past = request_headers(ids(), now_ms() - 1000, first_send=True)
        msg = await nc.request(fast.names.tool("quick"), b'{"tag": "late"}', headers=past, timeout=5)
        assert msg.headers and msg.headers[H_REPLY_KIND] == "error" and b"timeout" in msg.data
        outs: list[cl.CallOutcome] = []

        async def one(i: int) -> None:
            outs.append(await client.call("quick", f'{{"tag": "{i}"}}'.encode(), ids=ids(), timeout=5))

        async with anyio.create_task_group() as tg:
            for i in range(50):
                tg.start_soon(one, i)
        assert sorted(text(o).split()[0] for o in outs) == sorted(str(i) for i in range(50))


async def test_a_worker_cut_mid_call_answers_worker_stopped(nc: NATS, fast: Settings) -> None:
    """Serving cut without a drain (a failure, not a stop): each call in flight is canceled and its
    caller hears so at once, instead of waiting for heartbeat loss."""
    from services.tools.worker import Worker

    kv = await ensure_tools_bucket(nc.jetstream(), fast.names)
    w = Worker([work], fast, nc, record_results=False)
    cut = anyio.CancelScope()

    async def serve(*, task_status: TaskStatus[None]) -> None:
        with cut:
            await w._serve(kv, anyio.Event(), task_status)

    outs: list[cl.CallOutcome] = []
    async with cl.ToolClient(nc, fast.names, heartbeat_seconds=0.3) as client:

        async def call() -> None:
            outs.append(await client.call("work", b'{"tag": "cut", "seconds": 5}', ids=ids(), timeout=10))

        with anyio.fail_after(4):
            async with anyio.create_task_group() as tg:
                await tg.start(serve)
                tg.start_soon(call)
                await anyio.sleep(0.5)
                cut.cancel()
    assert outs[0].status == cl.CANCELED and "worker stopped" in outs[0].message, outs


async def test_unexpected_reply_kind_is_a_crash(nc: NATS, fast: Settings) -> None:
    async def cb(msg: object) -> None:
        await nc.publish(msg.reply, b"{}", headers={H_REPLY_KIND: "banana"})  # type: ignore[attr-defined]

    sub = await nc.subscribe(fast.names.tool("odd"), queue=fast.names.tool_queue("odd"), cb=cb)
    async with cl.ToolClient(nc, fast.names) as client:
        out = await client.call("odd", b"{}", ids=ids(), timeout=5)
    await sub.unsubscribe()
    assert out.status == cl.CRASHED and "unexpected reply kind 'banana'" in out.message


async def test_registry_lists_workers_and_forgets_stopped_ones(nc: NATS, fast: Settings) -> None:
    async with ToolRegistry(nc, fast.names) as registry:
        assert registry.live() == [] and registry.get("work") is None
        async with worker(fast, [work, BUILTINS["calculator"]]):
            async with worker(fast, [work]):
                live = await registry.wait_for("work", replicas=2)
                assert live.replicas == 2 and len(live.workers) == 2 and not live.conflict
                assert {t.name: t.replicas for t in registry.live()} == {"calculator": 1, "work": 2}
                assert registry.get("calculator") is not None and registry.get("calc.*") is None
                kv = await ensure_tools_bucket(nc.jetstream(), fast.names)
                entry = await kv.get(f"work.{live.workers[0]}")
                reg = msgspec.json.decode(entry.value or b"", type=Registration)
                assert reg.spec.name == "work" and reg.pid > 0 and reg.host
            await registry.wait_until(lambda r: (t := r.get("work")) is not None and t.replicas == 1)
        await registry.wait_gone("work")
        await registry.wait_gone("calculator")
        assert registry.live() == []


async def test_registry_forgets_registrations_nobody_refreshes(
    nc: NATS, fast: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A SIGKILLed worker's entry expires silently in KV; the registry drops it after the TTL."""
    from services.toolcaller import registry as reg_module
    from services.toolwire.spec import ToolSpec

    monkeypatch.setattr(reg_module, "REGISTRATION_TTL_SECONDS", 0.6)
    monkeypatch.setattr(reg_module, "_SWEEP_SECONDS", 0.1)
    monkeypatch.setattr("services.tools.worker.REFRESH_SECONDS", 0.1)
    kv = await ensure_tools_bucket(nc.jetstream(), fast.names)
    dead = Registration(worker_id="dead", spec=ToolSpec(name="work", version="0"))
    await kv.put("work.dead", msgspec.json.encode(dead))
    async with ToolRegistry(nc, fast.names) as registry:
        assert registry.get("work") is not None
        async with worker(fast, [work]):
            await registry.wait_for("work", replicas=2)
            assert "work" in registry.conflicts(), "the dead v0 entry conflicts with the live worker"
            await registry.wait_until(lambda r: not r.conflicts(), timeout=3)
            live = registry.get("work")
            assert live is not None and live.replicas == 1 and live.version == "1", "the refreshed one stays"
    await kv.delete("work.dead")


async def test_arguments_too_large_to_send_are_an_error_not_an_exception(nc: NATS, fast: Settings) -> None:
    async with cl.ToolClient(nc, fast.names) as client:
        out = await client.call("work", b'"' + b"x" * (nc.max_payload + 10) + b'"', ids=ids(), timeout=5)
    assert out.status == cl.CRASHED and out.message.startswith("could not send the call")


async def test_worker_tool_set_and_health_change_while_serving(nc: NATS, fast: Settings) -> None:
    """The hooks a bridge uses: start with no tools, add and remove tools, mark them (un)healthy,
    and CallFailed from a tool ends the call with that error reply."""
    from services.tools.sdk import CallFailed
    from services.tools.worker import Worker

    with pytest.raises(ValueError, match="no tools"):
        Worker([], fast, nc)

    @tool(name="down", description="its backend is down")
    async def down(args: Work) -> str:
        raise CallFailed("unavailable", "backend restarting")

    w = Worker([], fast, nc, allow_empty=True)
    async with (
        ToolRegistry(nc, fast.names) as reg,
        cl.ToolClient(nc, fast.names) as client,
        anyio.create_task_group() as tg,
    ):
        await tg.start(w.run)
        assert reg.live() == []
        await w.set_tools([work, down])
        await reg.wait_for("down")
        assert text(await client.call("work", b'{"tag": "h"}', ids=ids(), timeout=5)).startswith("done h")
        out = await client.call("down", b"{}", ids=ids(), timeout=5)
        assert out.status == cl.UNAVAILABLE and out.message == "backend restarting" and out.worker_id == w.worker_id
        await w.set_healthy(False)
        await reg.wait_until(lambda r: (t := r.get("work")) is not None and not t.healthy)
        assert not w.taking_calls  # out of the queue groups: NATS routes to healthy replicas only
        none = await client.call("work", b'{"tag": "u"}', ids=ids(), timeout=5)
        assert none.status == cl.UNAVAILABLE and not none.worker_id
        reg.mark_no_workers("work")  # known down: it stays listed
        assert reg.get("work") is not None and "work" in {t.name for t in reg.live()}
        await w.set_tools([work, down])  # while unhealthy: registered, not subscribed
        assert not w.taking_calls
        await w.set_healthy(True)
        await reg.wait_until(lambda r: (t := r.get("work")) is not None and t.healthy)
        assert text(await client.call("work", b'{"tag": "b"}', ids=ids(), timeout=5)).startswith("done b")
        await w.set_tools([down])
        await reg.wait_gone("work")
        gone = await client.call("work", b'{"tag": "g"}', ids=ids(), timeout=5)
        assert gone.status == cl.UNAVAILABLE and not gone.worker_id  # unsubscribed: no responders
        tg.cancel_scope.cancel()
