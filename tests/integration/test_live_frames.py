"""Live frames: a loop's events go out together, within a window, in order, split when large."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import AsyncIterator

import anyio
import pytest
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from services.model_step.live import FRAME_MAX_BYTES, DeltaOf, LiveOutbox
from shared import events as ev
from shared.codec import decode_live_frame
from shared.events import new_id
from shared.settings import Settings

pytestmark = pytest.mark.anyio


class Frames:
    """The live frames of one loop as a subscriber receives them: (arrival time, events)."""

    def __init__(self) -> None:
        self.got: list[tuple[float, list[ev.Event]]] = []
        self.sizes: list[int] = []

    async def on(self, msg: Msg) -> None:
        self.sizes.append(len(msg.data))
        self.got.append((anyio.current_time(), decode_live_frame(msg.data)))

    @property
    def events(self) -> list[ev.Event]:
        return [e for _, frame in self.got for e in frame]

    @property
    def chunks(self) -> list[ev.Chunk]:
        return [e.chunk for e in self.events if isinstance(e, ev.TokenDelta)]


async def subscribe(nc: NATS, settings: Settings, loop_id: str) -> Frames:
    frames = Frames()
    await nc.subscribe(settings.names.live(loop_id), cb=frames.on)
    await nc.flush()
    return frames


def delta_of(loop_id: str) -> DeltaOf:
    turn_id, step_id = new_id(), new_id()

    def make(c: ev.Chunk) -> ev.TokenDelta:
        return ev.TokenDelta(loop_id=loop_id, turn_id=turn_id, step_id=step_id, turn_index=1, chunk=c)

    return make


def started(loop_id: str, n: int = 0, summary: str = "17*23") -> ev.ToolCallStarted:
    return ev.ToolCallStarted(
        loop_id=loop_id,
        turn_id=new_id(),
        step_id=new_id(),
        tool_execution_id=new_id(),
        tool_name="calculator",
        tool_use_id=f"call_{n}",
        summary=summary,
    )


@contextlib.asynccontextmanager
async def clocked(nc: NATS, settings: Settings, window: float) -> AsyncIterator[LiveOutbox]:
    """An outbox whose clock runs for the block."""
    box = LiveOutbox(nc, settings.names, window=window)
    async with anyio.create_task_group() as tg:
        await tg.start(box.run)
        yield box
        tg.cancel_scope.cancel()


async def settle(nc: NATS, seconds: float = 0.1) -> None:
    await nc.flush()
    await anyio.sleep(seconds)


async def test_a_step_s_chunks_and_tool_events_go_out_as_one_frame_on_flush(nc: NATS, settings: Settings) -> None:
    loop_id = new_id()
    frames = await subscribe(nc, settings, loop_id)
    box = LiveOutbox(nc, settings.names, window=5.0)  # the window never ends a frame here: the flush does
    make = delta_of(loop_id)
    for kind, text, index, id_, name in [
        ("text", "Comp", 0, "", ""),
        ("text", "uting", 0, "", ""),
        ("tool_use", "", 1, "call_1", "calculator"),
        ("tool_use", '{"expression"', 1, "", ""),
        ("tool_use", ': "1+1"}', 1, "", ""),
    ]:
        box.chunk(loop_id, make, kind, text, index, id_, name)
    await box.publish(started(loop_id, 1))
    await settle(nc)
    assert frames.got == []  # nothing before the flush
    await box.flush(loop_id)
    await box.flush(loop_id)  # nothing left: no empty frame
    await settle(nc)
    assert len(frames.got) == 1
    assert frames.chunks == [
        ev.Chunk(kind="text", text="Computing", index=0),
        ev.Chunk(kind="tool_use", text='{"expression": "1+1"}', index=1, id="call_1", name="calculator"),
    ]
    assert [type(e).__name__ for e in frames.events] == ["TokenDelta", "TokenDelta", "ToolCallStarted"]


@pytest.mark.parametrize(
    "second",
    [
        pytest.param(("thinking", "b", 0, "", ""), id="other-kind"),
        pytest.param(("text", "b", 1, "", ""), id="other-index"),
        pytest.param(("tool_use", "", 0, "call_2", "x"), id="new-tool-use"),
    ],
)
async def test_a_chunk_that_starts_something_new_ends_its_token_delta(
    nc: NATS, settings: Settings, second: tuple[str, str, int, str, str]
) -> None:
    loop_id = new_id()
    frames = await subscribe(nc, settings, loop_id)
    box = LiveOutbox(nc, settings.names)
    make = delta_of(loop_id)
    first = ("tool_use", "a", 0, "call_1", "x") if second[0] == "tool_use" else ("text", "a", 0, "", "")
    box.chunk(loop_id, make, *first)
    box.chunk(loop_id, make, *second)
    await box.flush(loop_id)
    await settle(nc)
    assert [c.text for c in frames.chunks] == ["a", second[1]]


async def test_an_event_ends_the_open_token_delta_and_order_is_kept(nc: NATS, settings: Settings) -> None:
    loop_id = new_id()
    frames = await subscribe(nc, settings, loop_id)
    box = LiveOutbox(nc, settings.names)
    make = delta_of(loop_id)
    box.chunk(loop_id, make, "text", "a", 0, "", "")
    box.add(started(loop_id, 1))
    box.chunk(loop_id, make, "text", "b", 0, "", "")  # continues the block, but after the event
    await box.flush(loop_id)
    await settle(nc)
    kinds = [(type(e).__name__, e.chunk.text if isinstance(e, ev.TokenDelta) else "") for e in frames.events]
    assert kinds == [("TokenDelta", "a"), ("ToolCallStarted", ""), ("TokenDelta", "b")]


async def test_a_frame_goes_out_when_it_is_a_window_old_without_a_flush(nc: NATS, settings: Settings) -> None:
    loop_id = new_id()
    frames = await subscribe(nc, settings, loop_id)
    make = delta_of(loop_id)
    async with clocked(nc, settings, 0.05) as box:
        t0 = anyio.current_time()
        box.chunk(loop_id, make, "text", "a", 0, "", "")
        await anyio.sleep(0.3)  # the model pauses: the open frame must not wait for it
        assert [c.text for c in frames.chunks] == ["a"]
        assert frames.got[0][0] - t0 < 0.2
        box.add(started(loop_id))  # a slow tool: its start is seen while it runs
        await anyio.sleep(0.3)
        assert [type(e).__name__ for e in frames.events] == ["TokenDelta", "ToolCallStarted"]
        assert frames.got[1][0] - frames.got[0][0] < 0.5


async def test_a_steady_stream_goes_out_at_least_every_window(nc: NATS, settings: Settings) -> None:
    loop_id = new_id()
    frames = await subscribe(nc, settings, loop_id)
    make = delta_of(loop_id)
    async with clocked(nc, settings, 0.05) as box:
        for i in range(40):
            box.chunk(loop_id, make, "text", str(i % 10), 0, "", "")
            await anyio.sleep(0.01)
        await box.flush(loop_id)
        await settle(nc)
    assert "".join(c.text for c in frames.chunks) == "".join(str(i % 10) for i in range(40))
    assert 4 <= len(frames.got) <= 20, len(frames.got)  # ~0.4 s of chunks in 50 ms frames
    times = [t for t, _ in frames.got]
    assert max(b - a for a, b in itertools.pairwise(times)) < 0.2


async def test_one_clock_ends_each_loop_s_frame_a_window_after_it_opened(nc: NATS, settings: Settings) -> None:
    loops = [new_id() for _ in range(3)]
    subs = [await subscribe(nc, settings, lid) for lid in loops]
    opened = []
    async with clocked(nc, settings, 0.05) as box:
        for lid in loops:  # opened 30 ms apart: the clock must not wait for the newest one
            opened.append(anyio.current_time())
            box.add(started(lid))
            await anyio.sleep(0.03)
        await anyio.sleep(0.2)
    for t0, frames in zip(opened, subs, strict=True):
        assert len(frames.got) == 1
        assert 0.04 <= frames.got[0][0] - t0 < 0.15


async def test_a_large_burst_is_split_into_frames_under_the_limit_and_none_is_lost(
    nc: NATS, settings: Settings
) -> None:
    loop_id = new_id()
    frames = await subscribe(nc, settings, loop_id)
    sent = [started(loop_id, i, summary="x" * 1000) for i in range(300)]  # ~300 KB of events
    async with clocked(nc, settings, 5.0) as box:
        for e in sent:
            box.add(e)
        await anyio.sleep(0.3)  # a full frame is sent by the clock without waiting for its window
        await settle(nc)
        assert frames.got, "a frame over the size limit waits for its window"
        await box.flush(loop_id)
        await settle(nc)
    assert frames.events == sent
    assert len(frames.got) >= 4 and max(frames.sizes) <= FRAME_MAX_BYTES


async def test_nothing_goes_out_without_events(nc: NATS, settings: Settings) -> None:
    loop_id = new_id()
    frames = await subscribe(nc, settings, loop_id)
    async with clocked(nc, settings, 0.05) as box:
        await box.flush(loop_id)
        await anyio.sleep(0.15)
    await settle(nc)
    assert frames.got == []
