"""Heartbeats and progress replies of a worker's running calls.

A call that runs longer than ``heartbeat_seconds`` gets a progress reply every ``heartbeat_seconds``:
the heartbeat task is started only then, or at the tool's first progress message, so a short call
costs no task and sends no heartbeat. Running calls without a task yet are watched in one dict,
oldest first, with one timer for the oldest: a call that ends first only leaves the dict.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Final

import anyio

from services.tools.calls import Beats, Call
from services.toolwire import protocol as p
from shared import shaping
from shared.settings import Settings

_PROGRESS_BUFFER: Final = 16

# Sends one reply: (reply subject, reply kind, body).
Send = Callable[[str, str, bytes], Awaitable[None]]


class Heartbeats:
    """The heartbeats of one worker's calls, sent with ``send``."""

    def __init__(self, settings: Settings, send: Send) -> None:
        self.settings = settings
        self._send = send
        self._unbeaten: dict[Call, None] = {}
        self._timer: asyncio.TimerHandle | None = None

    def progress(self, call: Call, message: str) -> None:
        """A tool's progress message (on the event loop): sent by the call's heartbeat task."""
        if not call.running or call.tool.inline:
            return  # the call is over, or holds the event loop until it is (nothing could be sent)
        if call.beats is None:
            self._arm(call, message)
        else:
            # Best effort: dropped while the caller-bound queue is full.
            with contextlib.suppress(asyncio.QueueFull):
                call.beats.progress.put_nowait(message)

    def watch(self, call: Call) -> None:
        """The call started running: it gets heartbeats once it outlives one interval."""
        loop = asyncio.get_running_loop()
        call.watched_since = loop.time()
        self._unbeaten[call] = None
        if self._timer is None:
            self._timer = loop.call_at(call.watched_since + self.settings.heartbeat_seconds, self._due)

    def _due(self) -> None:
        """Arm every watched call that has run for an interval; the timer moves to the next one."""
        self._timer = None
        loop = asyncio.get_running_loop()
        interval = self.settings.heartbeat_seconds
        now = loop.time()
        while self._unbeaten:
            call = next(iter(self._unbeaten))
            due = call.watched_since + interval
            if due > now:
                self._timer = loop.call_at(due, self._due)
                return
            self._arm(call, None)

    def _arm(self, call: Call, first: str | None) -> None:
        """Start the call's heartbeat task: it outlived one interval (``first`` None: a heartbeat is
        due now) or sent its first progress message."""
        self._unbeaten.pop(call, None)
        if call.beats is not None or not call.running:
            return
        queue: asyncio.Queue[str] = asyncio.Queue(_PROGRESS_BUFFER)
        call.beats = Beats(progress=queue, task=asyncio.get_running_loop().create_task(self._beat(call, queue, first)))

    async def stop(self, call: Call) -> None:
        """The call is over: no heartbeat or progress after this (its final reply comes next)."""
        call.running = False
        self._unbeaten.pop(call, None)
        beats = call.beats
        if beats is not None:
            beats.task.cancel()
            # Wait for the task to end, so nothing it sends can follow the final reply.
            with anyio.CancelScope(shield=True):
                await asyncio.wait((beats.task,), timeout=5)

    def close(self) -> None:
        """The worker stopped serving: no timer is left behind."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    async def _beat(self, call: Call, progress: asyncio.Queue[str], first: str | None) -> None:
        interval = self.settings.heartbeat_seconds
        message = first
        while True:
            if message is None:
                message = f"running for {time.monotonic() - call.started:.0f}s"
            body = p.encode(p.ProgressBody(message=shaping.bounded_diagnostic(message), heartbeat_seconds=interval))
            for reply in list(call.replies):
                await self._send(reply, p.REPLY_PROGRESS, body)
            message = None
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(interval):
                    message = await progress.get()
