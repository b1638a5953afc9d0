"""The committer service: streams and buckets at start, then the commit and loop-API subscriptions.

Every request is handled in its own task, started straight from the connection's read loop
(``shared.connection.subscribe_quick``), at most ``MAX_IN_FLIGHT`` at once: past that requests wait
in a queue of their own (up to ``MAX_WAITING``; more are dropped, like a slow consumer's, and their
clients' retries repeat them) instead of piling up as tasks. A handler failure is logged and
answered; it never ends a subscription. A cancellation drains: no new requests are taken, in-flight
ones finish.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Final

import anyio
import nats.errors
from anyio.abc import TaskStatus
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from services.lifecycle import let_go
from shared import telemetry
from shared.connect import connect
from shared.connection import subscribe_quick
from shared.errors import ErrorKind
from shared.protocol import ApiReply as _Reply
from shared.protocol import ErrorBody, encode
from shared.settings import Settings
from shared.streams import ensure_all
from shared.subjects import COMMITTER_QUEUE

from .api import LoopApi
from .appender import Appender
from .commit import CommitHandler

log = logging.getLogger("loopwire.committer")

MAX_IN_FLIGHT: Final = 512
MAX_WAITING: Final = 65_536
DRAIN_SECONDS: Final = 30.0
# Room for the commit request's own wrapping and the stored message's headers.
_REQUEST_OVERHEAD: Final = 1024

Handler = Callable[[str, bytes], Awaitable[bytes]]


class _InFlight:
    """Counts running handlers; ``wait_idle`` returns once none runs."""

    def __init__(self) -> None:
        self.count = 0
        self._idle = anyio.Event()
        self._idle.set()

    def enter(self) -> None:
        if self.count == 0:
            self._idle = anyio.Event()
        self.count += 1

    def leave(self) -> None:
        self.count -= 1
        if self.count == 0:
            self._idle.set()

    async def wait_idle(self) -> None:
        await self._idle.wait()


class CommitterService:
    """One committer: streams and buckets at start, then the commit and loop-API subscriptions."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.names = settings.names
        # Plain asyncio tasks started from the read loop, so a burst of requests is dispatched at once
        # and the replies leave in few writes; a cancellation of :meth:`run` does not reach them: the
        # stop drains them.
        self._tasks: set[asyncio.Task[None]] = set()
        self._inflight = _InFlight()
        self._waiting: deque[tuple[NATS, Handler, Msg]] = deque()

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled, then drain: no new requests are taken, in-flight ones finish.

        Started once the streams and buckets exist and both subscriptions are live.
        """
        settings, names = self.settings, self.names
        # no_echo: its own chain tips are not sent back to it (nothing else it publishes is for itself).
        nc = await connect(settings, name="loopwire-committer", no_echo=True)
        try:
            await ensure_all(nc.jetstream(timeout=5), settings)  # a refusal is the runner's one line
            # A record must fit in one message with its headers, whatever LW_MAX_RECORD_BYTES says.
            max_record = min(settings.max_record_bytes, nc.max_payload - _REQUEST_OVERHEAD)
            appender = Appender(nc, names, retry_seconds=settings.commit_retry_seconds)
            api = LoopApi(nc, settings, appender)
            commits = CommitHandler(
                appender, max_input_bytes=settings.max_record_bytes, max_record_bytes=max_record, work=api.loops.work
            )
            subs = [
                await subscribe_quick(
                    nc, names.commit_all, self._dispatcher(nc, commits.handle), queue=COMMITTER_QUEUE
                ),
                await subscribe_quick(nc, names.api_all, self._dispatcher(nc, api.handle), queue=COMMITTER_QUEUE),
                await appender.listen(),
            ]
            await nc.flush()
            log.info("committer serving %s and %s (replicas=%d)", names.commit_all, names.api_all, settings.replicas)
            try:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(api.loops.work.run)
                    task_status.started()
                    await anyio.sleep_forever()
            finally:
                with anyio.CancelScope(shield=True):
                    await self._drain(subs)
        finally:
            with anyio.CancelScope(shield=True):
                with anyio.move_on_after(2):
                    for task in list(self._tasks):
                        task.cancel()
                    if self._tasks:
                        await asyncio.gather(*self._tasks, return_exceptions=True)
                await let_go(nc)

    async def _drain(self, subs: list[Subscription]) -> None:
        log.info("draining (%d in flight)", self._inflight.count)
        for sub in subs:
            try:
                await sub.drain()  # type: ignore[no-untyped-call]
            except nats.errors.Error as e:
                log.warning("drain: %r", e)
        with anyio.move_on_after(DRAIN_SECONDS):
            await self._inflight.wait_idle()

    def _dispatcher(self, nc: NATS, handler: Handler) -> Callable[[Msg], None]:
        def on_msg(msg: Msg) -> None:
            if self._inflight.count < MAX_IN_FLIGHT:
                self._start(nc, handler, msg)
            elif len(self._waiting) < MAX_WAITING:
                self._waiting.append((nc, handler, msg))
            else:
                log.warning("%d requests waiting: %s dropped (its client's retry repeats it)", MAX_WAITING, msg.subject)

        return on_msg

    def _start(self, nc: NATS, handler: Handler, msg: Msg) -> None:
        self._inflight.enter()
        task = asyncio.get_running_loop().create_task(self._handle(nc, handler, msg))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _handle(self, nc: NATS, handler: Handler, msg: Msg) -> None:
        try:
            try:
                with telemetry.attached(msg.headers):
                    reply = await handler(msg.subject, msg.data)
            except Exception as e:  # a bug, not bad input: answer, log, keep serving
                log.exception("handler failed on %s", msg.subject)
                body = ErrorBody(kind=ErrorKind.UNAVAILABLE, message=f"internal error: {e!r}")
                reply = encode(_Reply(ok=False, error=body))
            if msg.reply:
                try:
                    await nc.publish(msg.reply, reply)
                except nats.errors.Error as e:
                    log.warning("could not reply on %s: %r", msg.subject, e)
        finally:
            self._inflight.leave()
            if self._waiting:
                self._start(*self._waiting.popleft())
