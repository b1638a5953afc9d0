"""Live token frames: continuation chunks coalesce; anything new, the window and the end publish."""

from __future__ import annotations

import itertools

import anyio
import pytest

from services.model_step.frames import FrameClock, TokenFrames
from shared import events as ev

pytestmark = pytest.mark.anyio


class Sink:
    def __init__(self) -> None:
        self.frames: list[tuple[float, ev.Chunk]] = []

    async def __call__(self, c: ev.Chunk) -> None:
        self.frames.append((anyio.current_time(), c))

    @property
    def chunks(self) -> list[ev.Chunk]:
        return [c for _, c in self.frames]


async def feed(chunks: list[tuple[str, str, int, str, str]], *, gap: float = 0.0, window: float = 0.05) -> Sink:
    sink = Sink()
    async with anyio.create_task_group() as tg:
        clock = FrameClock(window)
        await tg.start(clock.run)
        frames = TokenFrames(sink, clock)
        for kind, text, index, id_, name in chunks:
            await frames.add(kind, text, index, id_, name)
            if gap:
                await anyio.sleep(gap)
        await frames.flush()
        tg.cancel_scope.cancel()
    return sink


async def test_continuations_coalesce_into_one_frame_per_block() -> None:
    sink = await feed(
        [
            ("text", "Comp", 0, "", ""),
            ("text", "uting", 0, "", ""),
            ("tool_use", "", 1, "call_1", "calculator"),
            ("tool_use", '{"expression"', 1, "", ""),
            ("tool_use", ': "1+1"}', 1, "", ""),
        ]
    )
    assert sink.chunks == [
        ev.Chunk(kind="text", text="Computing", index=0),
        ev.Chunk(kind="tool_use", text='{"expression": "1+1"}', index=1, id="call_1", name="calculator"),
    ]


@pytest.mark.parametrize(
    "second",
    [
        pytest.param(("thinking", "b", 0, "", ""), id="other-kind"),
        pytest.param(("text", "b", 1, "", ""), id="other-index"),
        pytest.param(("tool_use", "", 0, "call_2", "x"), id="new-tool-use"),
    ],
)
async def test_a_chunk_that_starts_something_new_ends_the_frame(second: tuple[str, str, int, str, str]) -> None:
    first = ("tool_use", "a", 0, "call_1", "x") if second[0] == "tool_use" else ("text", "a", 0, "", "")
    sink = await feed([first, second])
    assert [c.text for c in sink.chunks] == ["a", second[1]]


async def test_a_frame_is_published_when_it_is_a_window_old_even_if_no_chunk_follows() -> None:
    sink = Sink()
    async with anyio.create_task_group() as tg:
        clock = FrameClock(0.05)
        await tg.start(clock.run)
        frames = TokenFrames(sink, clock)
        t0 = anyio.current_time()
        await frames.add("text", "a", 0, "", "")
        await anyio.sleep(0.3)  # the model pauses: the open frame must not wait for it
        assert [c.text for c in sink.chunks] == ["a"]
        assert sink.frames[0][0] - t0 < 0.2
        await frames.add("text", "b", 0, "", "")
        await frames.flush()
        tg.cancel_scope.cancel()
    assert [c.text for c in sink.chunks] == ["a", "b"]


async def test_a_steady_stream_publishes_at_least_every_window() -> None:
    sink = await feed([("text", str(i % 10), 0, "", "") for i in range(40)], gap=0.01, window=0.05)
    assert "".join(c.text for c in sink.chunks) == "".join(str(i % 10) for i in range(40))
    assert 4 <= len(sink.frames) <= 20, len(sink.frames)  # ~0.4 s of chunks in 50 ms frames
    times = [t for t, _ in sink.frames]
    assert max(b - a for a, b in itertools.pairwise(times)) < 0.2


async def test_nothing_is_published_without_chunks() -> None:
    assert (await feed([])).frames == []


async def test_one_clock_ends_each_of_many_open_frames_a_window_after_it_opened() -> None:
    sinks = [Sink() for _ in range(3)]
    async with anyio.create_task_group() as tg:
        clock = FrameClock(0.05)
        await tg.start(clock.run)
        opened = []
        for sink in sinks:  # opened 30 ms apart: the clock must not wait for the newest one
            opened.append(anyio.current_time())
            await TokenFrames(sink, clock).add("text", "x", 0, "", "")
            await anyio.sleep(0.03)
        await anyio.sleep(0.2)
        tg.cancel_scope.cancel()
    for t0, sink in zip(opened, sinks, strict=True):
        assert len(sink.frames) == 1
        assert 0.04 <= sink.frames[0][0] - t0 < 0.15
