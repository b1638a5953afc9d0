"""The batch executor against a real nats-server with in-process workers."""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import anyio
import msgspec
import pytest
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from services.toolcaller.client import ToolClient
from services.toolcaller.executor import PlannedCall, run_batch
from services.toolcaller.registry import ToolRegistry
from services.tools.sdk import Tool, ToolContext, ToolError, tool
from services.tools.service import ToolService
from services.toolwire.spec import ToolSpec
from shared import shaping
from shared.content import TextBlock, ToolResultMessage
from shared.events import Event, RawToolUse, ToolCallCompleted, ToolCallProgress, ToolCallStarted
from shared.settings import Settings
from shared.subjects import H_REPLY_KIND
from tests import natsfixtures

pytestmark = pytest.mark.anyio

# (what, id, monotonic time) recorded by the in-process probe tools.
TRACE: list[tuple[str, str, float]] = []
CANCELLED: Any = None  # an anyio.Event the probe sets when it is cancelled


class Probe(msgspec.Struct, forbid_unknown_fields=True):
    id: str = ""
    path: str = ""
    delay: float = 0.0
    text: str | None = None
    fail: str = ""
    progress: str = ""


async def _probe(args: Probe, ctx: ToolContext) -> str:
    TRACE.append(("start", args.id, time.monotonic()))
    try:
        if args.progress:
            ctx.progress(args.progress)
        await anyio.sleep(args.delay)
    except anyio.get_cancelled_exc_class():
        TRACE.append(("cancelled", args.id, time.monotonic()))
        if CANCELLED is not None:
            CANCELLED.set()
        raise
    TRACE.append(("end", args.id, time.monotonic()))
    if args.fail:
        raise ToolError(args.fail)
    return f"ok:{args.id}" if args.text is None else args.text


probe = tool(name="probe", write_target="path", description="test probe")(_probe)
seq = tool(name="seq", sequential=True, description="sequential probe")(_probe)
slow = tool(name="slow", timeout=0.3, description="times out")(_probe)


@asynccontextmanager
async def workers(settings: Settings, *groups: Sequence[Tool]) -> AsyncIterator[None]:
    await natsfixtures.create_deployment(settings)
    async with anyio.create_task_group() as tg:
        for tools in groups:
            with anyio.fail_after(10):
                await tg.start(ToolService(tools, settings).run)
        yield
        tg.cancel_scope.cancel()  # each worker drains


@dataclasses.dataclass
class Harness:
    settings: Settings
    nc: NATS
    registry: ToolRegistry
    client: ToolClient
    events: list[Event]
    extra: dict[str, ToolSpec]

    def spec_of(self, name: str) -> Any:
        return self.extra.get(name) or self.registry.get(name)

    async def run(self, planned: Sequence[PlannedCall], **kw: Any) -> list[ToolResultMessage]:
        async def publish(e: Event) -> None:
            self.events.append(e)

        return await run_batch(
            planned,
            loop_id=LOOP,
            turn_id=TURN,
            step_id=STEP,
            spec_of=self.spec_of,
            client=self.client,
            publish=publish,
            on_unavailable=self.registry.mark_no_workers,
            **kw,
        )

    def of(self, cls: type[Event]) -> list[Any]:
        return [e for e in self.events if isinstance(e, cls)]


LOOP, TURN, STEP = (str(uuid.uuid4()) for _ in range(3))


@pytest.fixture
def fast(settings: Settings) -> Settings:
    return dataclasses.replace(settings, heartbeat_seconds=0.3, tool_timeout_seconds=10.0)


@asynccontextmanager
async def harness(fast: Settings, nc: NATS) -> AsyncIterator[Harness]:
    TRACE.clear()
    async with (
        workers(fast, [probe, seq, slow]),
        ToolRegistry(nc, fast.names) as registry,
        ToolClient(nc, fast.names, heartbeat_seconds=fast.heartbeat_seconds) as client,
    ):
        await registry.wait_for("probe")
        yield Harness(fast, nc, registry, client, [], {})


_n = 0


def call(name: str, args: object | str, *, approve: bool = True, tool_id: str | None = None) -> PlannedCall:
    global _n
    _n += 1
    raw = args if isinstance(args, str) else msgspec.json.encode(args).decode()
    use = RawToolUse(id=tool_id or f"toolu_{_n}", name=name, input=raw)
    exec_id = str(uuid.uuid4())
    return PlannedCall.approved(use, exec_id) if approve else PlannedCall.of(use, exec_id)


def text(r: ToolResultMessage) -> str:
    assert r.blocks is not None and len(r.blocks) == 1 and isinstance(r.blocks[0], TextBlock)
    return r.blocks[0].text


def spans(ids: Sequence[str]) -> dict[str, tuple[float, float]]:
    start = {i: t for what, i, t in TRACE if what == "start"}
    end = {i: t for what, i, t in TRACE if what == "end"}
    return {i: (start[i], end[i]) for i in ids}


# --- TestRunBatch_* ports --------------------------------------------------------------------------


async def test_all_started_before_any_completed(fast: Settings, nc: NATS) -> None:
    async with harness(fast, nc) as h:
        planned = [
            call("probe", Probe(id="a", delay=0.1)),
            call("nope", {}),
            call("probe", Probe(id="b")),
            call("probe", "{not json"),
            call("seq", Probe(id="s", delay=0.05)),
        ]
        results = await h.run(planned)
    kinds = [type(e) for e in h.events if isinstance(e, ToolCallStarted | ToolCallCompleted)]
    last_started = max(i for i, k in enumerate(kinds) if k is ToolCallStarted)
    first_completed = min(i for i, k in enumerate(kinds) if k is ToolCallCompleted)
    assert last_started < first_completed
    started, completed = h.of(ToolCallStarted), h.of(ToolCallCompleted)
    assert [e.tool_execution_id for e in started] == [p.execution_id for p in planned]
    assert sorted(e.tool_execution_id for e in completed) == sorted(p.execution_id for p in planned)
    for e in [*started, *completed]:
        assert (e.loop_id, e.turn_id, e.step_id) == (LOOP, TURN, STEP)
    assert started[0].summary == shaping.summary_for_call("probe", planned[0].call.input)
    assert len(results) == len(planned)


async def test_sequential_drains_first(fast: Settings, nc: NATS) -> None:
    async with harness(fast, nc) as h:
        await h.run(
            [
                call("probe", Probe(id="p1", delay=0.05)),
                call("seq", Probe(id="s1", delay=0.1)),
                call("probe", Probe(id="p2", delay=0.05)),
                call("seq", Probe(id="s2", delay=0.1)),
            ]
        )
    sp = spans(["s1", "s2", "p1", "p2"])
    assert sp["s1"][1] <= sp["s2"][0], "sequential calls run one at a time in call order"
    assert max(sp["s1"][1], sp["s2"][1]) <= min(sp["p1"][0], sp["p2"][0]), "sequential calls drain first"
    assert sp["p1"][0] < sp["p2"][1] and sp["p2"][0] < sp["p1"][1], "the rest runs concurrently"


async def test_same_write_target_serializes(fast: Settings, nc: NATS) -> None:
    async with harness(fast, nc) as h:
        await h.run(
            [
                call("probe", Probe(id="x1", path="x", delay=0.15)),
                call("probe", Probe(id="y1", path="y", delay=0.15)),
                call("probe", Probe(id="x2", path="x", delay=0.15)),
                call("probe", Probe(id="x3", path="x", delay=0.05)),
            ]
        )
    sp = spans(["x1", "x2", "x3", "y1"])
    assert sp["x1"][1] <= sp["x2"][0] and sp["x2"][1] <= sp["x3"][0], "same target: one after another, in order"
    assert sp["y1"][0] < sp["x1"][1], "another target runs alongside"


async def test_result_order_matches_calls(fast: Settings, nc: NATS) -> None:
    async with harness(fast, nc) as h:
        planned = [call("probe", Probe(id=f"r{i}", delay=0.05 * (4 - i))) for i in range(4)]
        results = await h.run(planned)
    assert [r.tool_use_id for r in results] == [p.call.id for p in planned]
    assert [text(r) for r in results] == [f"ok:r{i}" for i in range(4)]
    assert all(not r.is_error for r in results)
    done_order = [i for what, i, _ in TRACE if what == "end"]
    assert done_order == ["r3", "r2", "r1", "r0"], "completion order differs from call order"


async def test_max_parallel_caps_concurrency(fast: Settings, nc: NATS) -> None:
    async with harness(fast, nc) as h:
        await h.run([call("probe", Probe(id=f"c{i}", delay=0.1)) for i in range(6)], max_parallel=2)
    points = sorted([(t, +1) for w, _, t in TRACE if w == "start"] + [(t, -1) for w, _, t in TRACE if w == "end"])
    running = peak = 0
    for _, d in points:
        running += d
        peak = max(peak, running)
    assert peak == 2


async def test_result_preview_capped(fast: Settings, nc: NATS) -> None:
    big = "é" * 3000  # 6000 bytes
    lines = "\n".join(f"line {i}" for i in range(40))
    async with harness(fast, nc) as h:
        results = await h.run(
            [
                call("probe", Probe(id="big", text=big), tool_id="u_big"),
                call("probe", Probe(id="lines", text=lines), tool_id="u_lines"),
            ]
        )
        capped = await h.run([call("probe", Probe(id="cap", text=big))], max_result_bytes=256)
    by_use = {e.tool_use_id: e.result_preview for e in h.of(ToolCallCompleted)}  # (they complete in any order)
    previews = [by_use["u_big"], by_use["u_lines"]]
    assert previews[0] == shaping.result_preview(big) and len(previews[0].encode()) <= 2048
    assert previews[0].endswith(shaping.TRUNCATED_MARKER)
    assert previews[1].count("\n") < 20 and previews[1].endswith(shaping.TRUNCATED_MARKER)
    assert text(results[0]) == big and text(results[1]) == lines, "the stored result is unbounded by default"
    assert len(text(capped[0]).encode()) <= 256 and "[tool output truncated: omitted" in text(capped[0])


# --- failure visibility: each case is one IsError result, one Started, one Completed{is_error} ------


async def _garbage_responder(nc: NATS, settings: Settings, name: str, body: bytes | None) -> Any:
    async def cb(msg: Msg) -> None:
        if body is not None:
            await nc.publish(msg.reply, body, headers={H_REPLY_KIND: "result"})

    return await nc.subscribe(settings.names.tool(name), queue=settings.names.tool_queue(name), cb=cb)


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("unknown tool", "error: unknown tool: nope"),
        ("invalid JSON", shaping.INVALID_JSON_ARGUMENTS),
        ("empty input", shaping.INVALID_JSON_ARGUMENTS),
        ("duplicate keys", shaping.INVALID_JSON_ARGUMENTS),
        ("denied", "error: permission denied: policy denies probe"),
        ("no decision", "error: permission denied"),
        ("minted id", shaping.INVALID_TOOL_CALL_ID),
        ("invalid arguments", "error: invalid tool arguments: "),
        ("tool error", "error: boom"),
        ("empty result", shaping.EMPTY_RESULT),
        ("timeout", "error: tool timed out after 0.3s"),
        ("garbage reply", "error: tool crashed: unreadable result reply"),
        ("worker silent", "error: tool crashed: worker stopped responding"),
        ("no live workers", "error: tool unavailable: ghost (no live workers)"),
    ],
)
async def test_failure_visibility(fast: Settings, nc: NATS, case: str, expected: str) -> None:
    async with harness(fast, nc) as h:
        h.extra["ghost"] = ToolSpec(name="ghost")
        h.extra["garbage"] = ToolSpec(name="garbage")
        h.extra["silent"] = ToolSpec(name="silent")
        sub = None
        if case == "garbage reply":
            sub = await _garbage_responder(nc, fast, "garbage", b"\xff not json")
        if case == "worker silent":
            sub = await _garbage_responder(nc, fast, "silent", None)
        pc = {
            "unknown tool": lambda: call("nope", {}),
            "invalid JSON": lambda: call("probe", '{"id": '),
            "empty input": lambda: call("probe", ""),
            "duplicate keys": lambda: call("probe", '{"id": "a", "id": "b"}'),
            "denied": lambda: PlannedCall.denied(
                RawToolUse(id="t1", name="probe", input="{}"),
                str(uuid.uuid4()),
                "error: permission denied: policy denies probe",
            ),
            "no decision": lambda: call("probe", {}, approve=False),
            "minted id": lambda: PlannedCall.approved(
                RawToolUse(id=shaping.mint_tool_use_id(), name="probe", input="{}", minted_id=True), str(uuid.uuid4())
            ),
            "invalid arguments": lambda: call("probe", {"id": 5}),
            "tool error": lambda: call("probe", Probe(id="e", fail="boom")),
            "empty result": lambda: call("probe", Probe(id="e", text="")),
            "timeout": lambda: call("slow", Probe(id="t", delay=5)),
            "garbage reply": lambda: call("garbage", {}),
            "worker silent": lambda: call("silent", {}),
            "no live workers": lambda: call("ghost", {}),
        }[case]()
        t0 = time.monotonic()
        results = await h.run([pc])
        elapsed = time.monotonic() - t0
        if sub is not None:
            await sub.unsubscribe()
    assert len(results) == 1 and results[0].is_error
    assert results[0].tool_use_id == pc.call.id
    assert text(results[0]).startswith(expected), text(results[0])
    started, completed = h.of(ToolCallStarted), h.of(ToolCallCompleted)
    assert len(started) == 1 and len(completed) == 1 and completed[0].is_error
    assert completed[0].result_preview == shaping.result_preview(text(results[0]))
    if case == "worker silent":
        assert elapsed < 3.0, "heartbeat loss (3 x 0.3 s) is detected long before the 10 s deadline"
    if case == "no live workers":
        assert elapsed < 1.0


async def test_failures_do_not_stop_the_rest_and_keep_order(fast: Settings, nc: NATS) -> None:
    async with harness(fast, nc) as h:
        planned = [
            call("nope", {}),
            call("probe", Probe(id="good")),
            call("probe", "nope"),
            PlannedCall.replied(
                RawToolUse(id="ask1", name="ask_user", input='{"question":"?"}'), str(uuid.uuid4()), "blue"
            ),
        ]
        results = await h.run(planned)
    assert [r.is_error for r in results] == [True, False, True, False]
    assert [text(r) for r in results] == [
        "error: unknown tool: nope",
        "ok:good",
        shaping.INVALID_JSON_ARGUMENTS,
        "blue",
    ]


async def test_progress_is_surfaced(fast: Settings, nc: NATS) -> None:
    async with harness(fast, nc) as h:
        await h.run([call("probe", Probe(id="p", delay=0.5, progress="halfway"))])
    messages = [e.message for e in h.of(ToolCallProgress)]
    assert "halfway" in messages
    assert any(m.startswith("running for") for m in messages), "heartbeats surface as progress"
    completed = h.of(ToolCallCompleted)[0]
    assert completed.duration_ms >= 450


async def test_conflicting_versions_are_reported_not_mixed(fast: Settings, nc: NATS) -> None:
    class V(msgspec.Struct):
        x: int = 0

    def make(version: str, fields: type[msgspec.Struct]) -> Tool:
        def dup(args: Any) -> str:
            return version

        return tool(name="dup", version=version, input=fields)(dup)

    class V2(msgspec.Struct):
        y: str = ""

    async with harness(fast, nc) as h, workers(fast, [make("1", V)]):
        await h.registry.wait_for("dup")
        assert [t.name for t in h.registry.live()] == ["dup", "probe", "seq", "slow"]
        async with workers(fast, [make("2", V2)]):
            await h.registry.wait_for("dup", replicas=2)
            assert "dup" in h.registry.conflicts()
            assert "dup" not in [t.name for t in h.registry.live()]
            results = await h.run([call("dup", {})])
            assert results[0].is_error
            assert text(results[0]).startswith("error: tool unavailable: dup (conflicting versions live:")
        # The v2 worker deregistered on its graceful stop: no conflict any more.
        await h.registry.wait_until(lambda r: not r.conflicts())
        results = await h.run([call("dup", {})])
        assert text(results[0]) == "1" and not results[0].is_error


async def test_cancelling_the_batch_cancels_in_flight_calls(fast: Settings, nc: NATS) -> None:
    global CANCELLED
    CANCELLED = anyio.Event()
    async with harness(fast, nc) as h:
        planned = [call("probe", Probe(id="long", delay=30))]
        with anyio.move_on_after(0.5) as scope:
            await h.run(planned)
        assert scope.cancelled_caught
        with anyio.fail_after(3):
            await CANCELLED.wait()
    assert ("cancelled", "long") in [(w, i) for w, i, _ in TRACE]
    assert not h.of(ToolCallCompleted), "a cancelled batch completes nothing"
    assert len(h.of(ToolCallStarted)) == 1
