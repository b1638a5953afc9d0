"""A loop's live events, sent in frames: one message holds at most ~50 ms of a loop's events.

A step makes several live events: its model's token chunks, ``ToolCallStarted``, any
``ToolCallProgress`` and ``ToolCallCompleted`` for each call. Sent one per message they cost a
message (and a socket write, a route and a delivery) each, in every process that carries them. The
:class:`LiveOutbox` gathers a loop's events and sends them as one **live frame** on
``<prefix>.live.<loop_id>`` (a JSON array, oldest first; ``shared.codec.encode_live_frame``):

* when the oldest of them is ``FRAME_SECONDS`` old (one clock task per process watches them all),
* before the loop's next commit (the driver flushes first, so a live reader sees a step's events
  before the step is committed), and
* when they reach ``FRAME_MAX_BYTES``.

Token chunks are coalesced on the way in: a chunk that continues the one before it (same kind and
block index, no new tool-use id or name) joins its ``TokenDelta``; anything else ends it. A reader
sees every chunk's text, in order, at most ~50 ms late. A model that answers at once and a quick
tool make one frame per step: the step's token frames and both tool events.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Final

import anyio
from anyio.abc import TaskStatus
from nats.aio.client import Client as NATS

from shared import events as ev
from shared.codec import encode_live, encode_live_frame
from shared.subjects import Names

log = logging.getLogger("loopwire.model_step")

# The longest an event waits for the events that follow it.
FRAME_SECONDS: Final = 0.05
# A frame this big goes out at once (far below NATS' default 1 MB payload limit).
FRAME_MAX_BYTES: Final = 64 * 1024

DeltaOf = Callable[[ev.Chunk], ev.TokenDelta]
"""The step's TokenDelta around a chunk (the step's ids and turn index)."""


class _Pending:
    """One loop's events not sent yet, and its open token chunk (``parts`` is None when none is open)."""

    __slots__ = ("delta_of", "due", "events", "id", "index", "kind", "name", "parts", "size")

    def __init__(self, due: float) -> None:
        self.due = due
        self.events: list[bytes] = []
        self.size = 0
        self.parts: list[str] | None = None
        self.kind = ""
        self.index = 0
        self.id = ""
        self.name = ""
        self.delta_of: DeltaOf | None = None

    def append(self, encoded: bytes) -> None:
        self.events.append(encoded)
        self.size += len(encoded) + 1

    def end_chunk(self) -> None:
        if self.parts is None:
            return
        assert self.delta_of is not None
        chunk = ev.Chunk(
            kind=self.kind,  # type: ignore[arg-type]  # a model chunk kind, checked by is_delta
            text="".join(self.parts),
            index=self.index,
            id=self.id,
            name=self.name,
        )
        self.parts = None
        self.append(encode_live(self.delta_of(chunk)))


class LiveOutbox:
    """The live frames of one process's loops; :meth:`run` is its clock (one task)."""

    def __init__(self, nc: NATS, names: Names, window: float = FRAME_SECONDS) -> None:
        self.window = window
        self.running = False
        self._nc = nc
        self._names = names
        self._pending: dict[str, _Pending] = {}
        self._seen = False  # a frame was opened since the clock last looked
        self._wake: anyio.Event | None = None

    def _open(self, loop_id: str) -> _Pending:
        p = self._pending.get(loop_id)
        if p is None:
            # (time.monotonic is the clock asyncio's loop.time() reads, without anyio's backend lookup)
            p = self._pending[loop_id] = _Pending(time.monotonic() + self.window)
            self._nudge()
        return p

    def _nudge(self) -> None:
        """A frame opened or fell due: the clock must look again (and wake, if it waits idle)."""
        self._seen = True
        if self._wake is not None:
            self._wake.set()
            self._wake = None

    def chunk(self, loop_id: str, delta_of: DeltaOf, kind: str, text: str, index: int, id: str, name: str) -> None:
        """A model's stream chunk, to join the open TokenDelta if it continues it."""
        p = self._open(loop_id)
        if p.parts is not None and (kind != p.kind or index != p.index or id or name):
            p.end_chunk()
        if p.parts is None:
            p.parts = []
            p.kind, p.index, p.id, p.name, p.delta_of = kind, index, id, name, delta_of
        p.parts.append(text)
        self._if_full(p)

    def add(self, event: ev.Event) -> None:
        """An ephemeral event of ``event.loop_id``, after everything added before it."""
        p = self._open(event.loop_id)
        p.end_chunk()
        p.append(encode_live(event))
        self._if_full(p)

    async def publish(self, event: ev.Event) -> None:
        """:meth:`add`, as the executor's publisher."""
        self.add(event)

    def _if_full(self, p: _Pending) -> None:
        if p.size >= FRAME_MAX_BYTES and p.due > 0:
            p.due = 0.0  # the clock's next look sends it
            self._nudge()

    async def flush(self, loop_id: str) -> None:
        """Send ``loop_id``'s pending events now (live events are best effort: a failure is logged)."""
        p = self._pending.pop(loop_id, None)
        if p is None:
            return
        p.end_chunk()
        if not p.events:
            return
        subject = self._names.live(loop_id)
        try:
            if p.size + 1 <= FRAME_MAX_BYTES:  # the usual case: all of it in one frame
                await self._nc.publish(subject, encode_live_frame(p.events))
                return
            start = 0
            while start < len(p.events):
                # A frame's bytes: its events, a comma between two, and the brackets.
                end, size = start + 1, len(p.events[start]) + 2
                while end < len(p.events) and size + 1 + len(p.events[end]) <= FRAME_MAX_BYTES:
                    size += 1 + len(p.events[end])
                    end += 1
                await self._nc.publish(subject, encode_live_frame(p.events[start:end]))
                start = end
        except Exception:
            log.warning(
                "could not publish the live events of loop %s", loop_id, exc_info=True, extra={"loop_id": loop_id}
            )

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Send each loop's frame when it is a window old; idle (nothing pending) it waits for one."""
        self.running = True
        task_status.started()
        try:
            while True:
                if not self._pending and not self._seen:
                    self._wake = anyio.Event()
                    await self._wake.wait()
                self._seen = False
                now = time.monotonic()
                for loop_id in [lid for lid, p in self._pending.items() if p.due <= now]:
                    await self.flush(loop_id)
                now = time.monotonic()
                due = min((p.due for p in self._pending.values()), default=now + self.window)
                await anyio.sleep(max(0.0, due - now))
        finally:
            self.running = False
