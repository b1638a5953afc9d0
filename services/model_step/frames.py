"""Live token frames: a model's stream chunks coalesced into TokenDelta events of at most ~50 ms.

A provider streams a few characters per chunk; publishing each as its own event costs a message per
chunk in every process that carries it. A chunk that continues the one before it (same kind and
block index, no new tool-use id or name) is appended to it, and the frame is published when the
next chunk starts something else, when it is ``FRAME_SECONDS`` old, or when the stream ends — so a
live reader still sees every chunk's text, in order, at most one frame late, and always before
the step that holds it is committed (the driver flushes before it folds the step into a commit).

One :class:`FrameClock` per process ends the frames no chunk ends: a step only registers its open
frame with it, so a model that answers at once costs no timer task, task group or cancellation.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Final

import anyio
from anyio.abc import TaskStatus

from shared import events as ev

# The longest a chunk waits for the chunks that continue it.
FRAME_SECONDS: Final = 0.05

Publish = Callable[[ev.Chunk], Awaitable[None]]


class FrameClock:
    """Ends each registered frame when it is a window old; :meth:`run` is its one task.

    Idle (no frame registered since it last looked) it waits for a registration; busy, it looks
    once a window, and sleeps no longer than the oldest open frame's due time.
    """

    def __init__(self, window: float = FRAME_SECONDS) -> None:
        self.window = window
        self.running = False
        self._due: dict[TokenFrames, float] = {}
        self._seen = False  # a frame was registered since the clock last looked
        self._wake: anyio.Event | None = None

    def watch(self, frames: TokenFrames) -> None:
        """``frames`` just opened a frame: end it a window from now unless it ends sooner."""
        # (time.monotonic is the clock asyncio's loop.time() reads, without anyio's backend lookup)
        self._due[frames] = time.monotonic() + self.window
        self._seen = True
        if self._wake is not None:
            self._wake.set()
            self._wake = None

    def forget(self, frames: TokenFrames) -> None:
        self._due.pop(frames, None)

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        self.running = True
        task_status.started()
        try:
            while True:
                if not self._due and not self._seen:
                    self._wake = anyio.Event()
                    await self._wake.wait()
                self._seen = False
                now = time.monotonic()
                for frames, due in list(self._due.items()):
                    if due <= now:
                        await frames.flush()
                now = time.monotonic()
                await anyio.sleep(max(0.0, min(self._due.values(), default=now + self.window) - now))
        finally:
            self.running = False


class TokenFrames:
    """Coalesces one step's chunks into frames; ``clock`` ends a frame no chunk ends."""

    def __init__(self, publish: Publish, clock: FrameClock) -> None:
        self._publish = publish
        self._clock = clock
        self._kind = ""
        self._index = 0
        self._id = ""
        self._name = ""
        self._parts: list[str] = []
        self._open = False

    async def add(self, kind: str, text: str, index: int, id: str, name: str) -> None:
        if self._open and (kind != self._kind or index != self._index or id or name):
            await self.flush()
        if not self._open:
            self._open = True
            self._kind, self._index, self._id, self._name = kind, index, id, name
            self._clock.watch(self)
        self._parts.append(text)

    async def flush(self) -> None:
        if not self._open:
            return
        chunk = ev.Chunk(
            kind=self._kind,  # type: ignore[arg-type]  # a model chunk kind, checked by is_delta
            text="".join(self._parts),
            index=self._index,
            id=self._id,
            name=self._name,
        )
        self._open = False
        self._parts = []
        self._clock.forget(self)
        await self._publish(chunk)
