"""Live token frames: a model's stream chunks coalesced into TokenDelta events of at most ~50 ms.

A provider streams a few characters per chunk; publishing each as its own event costs a message per
chunk in every process that carries it. A chunk that continues the one before it (same kind and
block index, no new tool-use id or name) is appended to it, and the frame is published when the
next chunk starts something else, when it is ``FRAME_SECONDS`` old, or when the stream ends — so a
live reader still sees every chunk's text, in order, at most one frame late, and always before
the step that holds it is committed (the driver flushes before it folds the step into a commit).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Final

import anyio
from anyio.abc import TaskGroup

from shared import events as ev

# The longest a chunk waits for the chunks that continue it.
FRAME_SECONDS: Final = 0.05

Publish = Callable[[ev.Chunk], Awaitable[None]]


class TokenFrames:
    """Coalesces chunks into frames; ``tg`` runs the timer that ends a frame no chunk ends."""

    def __init__(self, publish: Publish, tg: TaskGroup, window: float = FRAME_SECONDS) -> None:
        self._publish = publish
        self._tg = tg
        self._window = window
        self._kind = ""
        self._index = 0
        self._id = ""
        self._name = ""
        self._parts: list[str] = []
        self._open = False
        self._opened = 0.0  # when the open frame's first chunk came
        self._timing = False

    async def add(self, kind: str, text: str, index: int, id: str, name: str) -> None:
        if self._open and (kind != self._kind or index != self._index or id or name):
            await self.flush()
        if not self._open:
            self._open = True
            self._kind, self._index, self._id, self._name = kind, index, id, name
            self._opened = anyio.current_time()
            if not self._timing:
                self._timing = True
                self._tg.start_soon(self._timer)
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
        await self._publish(chunk)

    async def _timer(self) -> None:
        """Ends each open frame when it is a window old; returns when no frame is open."""
        try:
            while self._open:
                due = self._opened + self._window
                if anyio.current_time() >= due:
                    await self.flush()
                else:
                    await anyio.sleep(due - anyio.current_time())
        finally:
            self._timing = False
