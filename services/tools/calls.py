"""The calls a worker runs or ran lately: its running calls, idempotent repeats, and early cancels.

Idempotency of concurrent duplicates: within one worker process, a request whose
``Lw-Idempotency-Key`` and argument bytes equal those of a call that is running, or that finished
less than :data:`IDEMPOTENCY_TTL_SECONDS` ago (at most :data:`IDEMPOTENCY_MAX_ENTRIES` remembered,
least recently used evicted first), does not run the tool again: it gets the same final reply
(while running: the same heartbeats too). Only tool results are remembered: a call that ended with
an ``error`` reply (canceled — also before it started —, timed out, failed on the worker) is
forgotten, so such a reply is never served to another attempt and a retry runs the tool again.
A duplicate routed to a *different* replica runs again; callers never re-send a call a worker
has accepted, so this only matters for callers that retry.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Final

import anyio

from services.tools.sdk import Tool, ToolContext
from services.toolwire.spec import ToolSpec

IDEMPOTENCY_TTL_SECONDS: Final = 60.0
IDEMPOTENCY_MAX_ENTRIES: Final = 1024
_CANCELLED_EARLY_MAX: Final = 1024
EARLY_CANCEL_SECONDS: Final = 1.0  # how long a cancel that arrived before its request is remembered


@dataclass(eq=False, slots=True)
class Call:
    tool: Tool
    spec: ToolSpec  # the tool's spec (made once per tool, see Worker._served)
    digest: str
    replies: list[str]
    started: float
    scope: anyio.CancelScope | None = None
    ctx: ToolContext | None = None
    canceled: bool = False
    done: bool = False
    finished_at: float = 0.0
    final_kind: str = ""
    final_body: bytes = b""
    # Heartbeats: watched (see services.tools.heartbeats) until the call outlives one interval or
    # reports progress, then a task of its own.
    running: bool = False  # the tool is running: progress and heartbeats are wanted
    watched_since: float = 0.0  # event-loop time it started being watched
    beats: Beats | None = None


@dataclass(eq=False, slots=True)
class Beats:
    """The heartbeat task of one call and its queue of progress messages.

    Plain asyncio: it is started from a timer or a progress callback, where no task is current
    (anyio's primitives cannot be made there). It lives no longer than its call (see Heartbeats.stop).
    """

    progress: asyncio.Queue[str]
    task: asyncio.Task[None]


class CallTable:
    """A worker's calls: the running ones by execution id, the recent ones by idempotency key, and
    the cancels that arrived before their request."""

    def __init__(self) -> None:
        self.running: dict[str, Call] = {}  # execution id -> call
        self._idem: OrderedDict[tuple[str, str], Call] = OrderedDict()
        # (execution id, attempt) → when its cancel arrived before the request did.
        self._cancelled_early: OrderedDict[tuple[str, str], float] = OrderedDict()

    def same(self, key: tuple[str, str], digest: str) -> Call | None:
        """The running or recent call a request with ``key`` and argument ``digest`` repeats, if any."""
        now = time.monotonic()
        while self._idem:
            oldest = next(iter(self._idem.values()))
            if oldest.done and now - oldest.finished_at > IDEMPOTENCY_TTL_SECONDS:
                self._idem.popitem(last=False)
            else:
                break
        call = self._idem.get(key)
        if call is None or call.digest != digest or call.canceled:
            return None  # a canceled call is being torn down: a repeat runs afresh
        if call.done and now - call.finished_at > IDEMPOTENCY_TTL_SECONDS:
            return None
        self._idem.move_to_end(key)
        return call

    def remember(self, key: tuple[str, str], call: Call) -> None:
        self._idem[key] = call
        while len(self._idem) > IDEMPOTENCY_MAX_ENTRIES:
            self._idem.popitem(last=False)

    def forget(self, key: tuple[str, str], call: Call) -> None:
        """That reply belongs to this attempt alone: a later attempt with the same key runs the tool again."""
        if self._idem.get(key) is call:
            del self._idem[key]

    def cancel(self, execution_id: str, attempt: str) -> None:
        """A cancel of ``attempt`` (its caller's reply subject; "" = any attempt) of a call."""
        call = self.running.get(execution_id)
        if call is None:
            # The cancel may overtake the request: remember it briefly.
            self._cancelled_early[(execution_id, attempt)] = time.monotonic()
            while len(self._cancelled_early) > _CANCELLED_EARLY_MAX:
                self._cancelled_early.popitem(last=False)
            return
        if attempt:
            if attempt not in call.replies:
                return  # another attempt's cancel
            if len(call.replies) > 1:
                call.replies.remove(attempt)  # another attempt still waits for this (idempotent) call
                return
        call.canceled = True
        if call.ctx is not None:
            call.ctx.cancel()
        if call.scope is not None:
            call.scope.cancel()

    def canceled_before_start(self, execution_id: str, attempt: str) -> bool:
        """Whether a cancel of this attempt (or of any) just overtook its request."""
        if not execution_id:
            return False
        early = self._cancelled_early.pop((execution_id, attempt), None)
        if early is None:
            early = self._cancelled_early.pop((execution_id, ""), None)
        # Only a cancel that just overtook this request counts: execution ids are derived from the step,
        # so a step re-run after a crash or restart reuses them, and the old run's cancel (seen by every
        # worker) must not refuse the new run's call.
        return early is not None and time.monotonic() - early <= EARLY_CANCEL_SECONDS
