"""The caller's side of the tool-call protocol (see :mod:`services.toolwire.protocol`).

One wildcard inbox subscription per client; each call publishes the request with its own reply
subject and waits for the final reply, reading progress replies on the way. It does not use
``nc.request`` because a call gets several replies.

Outcomes, decided without waiting for the deadline wherever possible:

* ``ok`` — the worker's final result (tool errors included);
* ``unavailable`` — no worker subscribed (NATS "no responders", immediate), or the worker's backend
  is down (its ``unavailable`` error reply, with the reason as message);
* ``timeout`` — the worker reported the deadline passed, or nothing came until deadline + grace;
* ``crashed`` — no reply or heartbeat for ``loss_factor`` heartbeat intervals (worker killed, hung or
  stopped), an unreadable reply, a worker-internal failure, or the request could not be sent;
* ``canceled`` — the call was cancelled on the worker (toolctl);
* ``not_started`` — the request reached the worker after its ``start_by_ms`` and was not started.

Cancelling :meth:`ToolClient.call` (an anyio cancel scope around the batch) publishes
``<prefix>.toolctl.<execution_id>`` so the worker stops the call, then propagates. The client
publishes the same cancel when it gives up on a silent worker (heartbeat loss, deadline), so a
worker that resumes (SIGCONT, healed partition) drops the orphaned call.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Final, Literal

import anyio
import msgspec
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from services.toolwire import protocol as p
from shared.connection import subscribe_quick
from shared.subjects import H_REPLY_KIND, H_STATUS, H_WORKER_ID, Names

log = logging.getLogger("loopwire.tools.client")

# A call's outcome: its result, or how it failed (the caller's view of the tool protocol's error kinds).
CallStatus = Literal["ok", "unavailable", "timeout", "crashed", "canceled", "not_started", "refused"]
OK: Final[CallStatus] = "ok"
UNAVAILABLE: Final[CallStatus] = "unavailable"
TIMEOUT: Final[CallStatus] = "timeout"
CRASHED: Final[CallStatus] = "crashed"
CANCELED: Final[CallStatus] = "canceled"
NOT_STARTED: Final[CallStatus] = "not_started"
REFUSED: Final[CallStatus] = "refused"

_NO_RESPONDERS: Final = "503"
DEFAULT_LOSS_FACTOR: Final = 3.0
DEFAULT_GRACE_SECONDS: Final = 1.0

ProgressFn = Callable[[str], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class CallOutcome:
    status: CallStatus
    result: p.ResultBody | None = None
    message: str = ""
    worker_id: str = ""


_ERROR_STATUS: Final[dict[str, CallStatus]] = {
    p.ERROR_TIMEOUT: TIMEOUT,
    p.ERROR_CANCELED: CANCELED,
    p.ERROR_NOT_STARTED: NOT_STARTED,
    p.ERROR_REFUSED: REFUSED,
    p.ERROR_UNAVAILABLE: UNAVAILABLE,
}


def outcome_of(kind: str, body: bytes, worker: str = "") -> CallOutcome:
    """A final reply (``result`` or ``error``, live or recorded) as a call outcome."""
    try:
        if kind == p.REPLY_RESULT:
            return CallOutcome(OK, result=p.decode_result(body), worker_id=worker)
        if kind == p.REPLY_ERROR:
            err = p.decode_error(body)
            return CallOutcome(_ERROR_STATUS.get(err.kind, CRASHED), message=err.message or err.kind, worker_id=worker)
    except (msgspec.ValidationError, msgspec.DecodeError) as e:
        return CallOutcome(CRASHED, message=f"unreadable {kind} reply: {e}", worker_id=worker)
    return CallOutcome(CRASHED, message=f"unexpected reply kind {kind!r}", worker_id=worker)


class _Replies:
    """The replies of one call in flight: the inbox callback adds them, the caller takes them in order.

    A deque and a future rather than a memory object stream: a call waits for one or two replies,
    and the stream's per-receive checkpoint and waiter objects cost more than the rest of the wait.
    """

    __slots__ = ("_msgs", "_waiter")

    def __init__(self) -> None:
        self._msgs: deque[Msg] = deque()
        self._waiter: asyncio.Future[None] | None = None

    def put(self, msg: Msg) -> None:
        self._msgs.append(msg)
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def get(self, timeout: float) -> Msg | None:
        """The next reply, or None when none comes within ``timeout`` seconds."""
        if not self._msgs:
            loop = asyncio.get_running_loop()
            waiter = self._waiter = loop.create_future()
            timer = loop.call_later(timeout, _wake, waiter)  # one timer: cheaper than wait_for
            try:
                await waiter
            finally:
                timer.cancel()
                self._waiter = None
            if not self._msgs:
                return None
        return self._msgs.popleft()


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class ToolClient:
    """Calls tools over NATS. ``heartbeat_seconds`` should match the workers' ``LW_HEARTBEAT_SECONDS``
    (a worker announces its own interval in every heartbeat, and the larger one is used)."""

    def __init__(
        self,
        nc: NATS,
        names: Names,
        *,
        heartbeat_seconds: float = 1.0,
        loss_factor: float = DEFAULT_LOSS_FACTOR,
        grace_seconds: float = DEFAULT_GRACE_SECONDS,
    ) -> None:
        self.nc = nc
        self.names = names
        self.heartbeat_seconds = heartbeat_seconds
        self.loss_factor = loss_factor
        self.grace_seconds = grace_seconds
        self._inbox = ""
        self._sub: Subscription | None = None
        self._pending: dict[str, _Replies] = {}
        self._calls = 0  # reply tokens: unique under this client's own inbox
        self._lock = anyio.Lock()

    async def start(self) -> None:
        if self._sub is not None:  # already started: skip the lock (an anyio.Lock yields even when free)
            return
        async with self._lock:
            if self._sub is None:
                self._inbox = self.nc.new_inbox()
                self._sub = await subscribe_quick(self.nc, f"{self._inbox}.*", self._on_reply)

    async def close(self) -> None:
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()
            self._sub = None

    async def __aenter__(self) -> ToolClient:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _on_reply(self, msg: Msg) -> None:
        token = msg.subject.rsplit(".", 1)[-1]
        replies = self._pending.get(token)
        if replies is not None:
            replies.put(msg)

    async def cancel(self, execution_id: str, attempt: str = "") -> None:
        """Ask whichever worker runs ``execution_id`` to stop it; ``attempt`` (the call's reply
        subject) limits the cancel to that attempt, never a later re-run with the same id."""
        if execution_id:
            await self.nc.publish(self.names.toolctl(execution_id), attempt.encode())

    async def call(
        self,
        name: str,
        args: bytes,
        *,
        ids: p.CallIds,
        timeout: float,
        on_progress: ProgressFn | None = None,
        start_by_ms: int | None = None,
        first_send: bool = False,
        no_record: bool = False,
    ) -> CallOutcome:
        """Run one call to completion; never raises for a worker's behaviour (only on cancellation).

        ``start_by_ms``: the worker must not start the call after this time (unix ms; the caller's
        lease ends then), so a request delayed past it — e.g. its sender was stopped — never runs.
        ``first_send``: no earlier attempt of this execution id can exist (see ``Lw-First-Send``).
        ``no_record``: nobody will read this call's record (see ``Lw-No-Record``).
        """
        if self._sub is None:
            await self.start()
        self._calls += 1
        token = str(self._calls)
        reply = f"{self._inbox}.{token}"
        replies = self._pending[token] = _Replies()
        deadline = time.time() + timeout
        hard_end = time.monotonic() + timeout + self.grace_seconds
        interval = self.heartbeat_seconds
        worker = ""
        try:
            try:
                await self.nc.publish(
                    self.names.tool(name),
                    args,
                    reply=reply,
                    headers=p.request_headers(
                        ids, int(deadline * 1000), start_by_ms, first_send=first_send, no_record=no_record
                    ),
                )
            except Exception as e:  # closed connection, full reconnect buffer, oversized arguments
                return CallOutcome(CRASHED, message=f"could not send the call ({type(e).__name__}: {e})")
            while True:
                wait = min(interval * self.loss_factor, hard_end - time.monotonic())
                if wait <= 0:
                    await self.cancel(ids.execution_id, reply)
                    return CallOutcome(TIMEOUT, message="no reply before the deadline", worker_id=worker)
                msg = await replies.get(wait)
                if msg is None:
                    # Giving up: tell a worker that may come back (SIGSTOP, partition) to drop the call.
                    await self.cancel(ids.execution_id, reply)
                    if time.monotonic() >= hard_end:
                        return CallOutcome(TIMEOUT, message="no reply before the deadline", worker_id=worker)
                    return CallOutcome(CRASHED, message="worker stopped responding", worker_id=worker)
                headers = msg.headers or {}
                if headers.get(H_STATUS) == _NO_RESPONDERS:
                    return CallOutcome(UNAVAILABLE, message="no live workers")
                worker = headers.get(H_WORKER_ID, worker)
                kind = headers.get(H_REPLY_KIND, "")
                if kind == p.REPLY_PROGRESS:
                    try:
                        progress = p.decode_progress(msg.data)
                    except (msgspec.ValidationError, msgspec.DecodeError) as e:
                        return CallOutcome(CRASHED, message=f"unreadable {kind} reply: {e}", worker_id=worker)
                    if progress.heartbeat_seconds > 0:
                        interval = max(self.heartbeat_seconds, progress.heartbeat_seconds)
                    if progress.message and on_progress is not None:
                        await on_progress(progress.message)
                    continue
                return outcome_of(kind, msg.data, worker)
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True), anyio.move_on_after(1):
                await self.cancel(ids.execution_id, reply)
            raise
        finally:
            self._pending.pop(token, None)
