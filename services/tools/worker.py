"""Serve tools as NATS workers: queue-group subscriptions, heartbeats, deadlines, cancel, drain.

One :class:`Worker` serves any number of tools over one connection. Each call runs as its own task
(nats-py runs a subscription's callback sequentially, so the callback only spawns) — except a call
of an ``inline`` tool that needs no result record before it runs: it never waits, so it runs to its
reply in the callback itself. A call that runs longer than ``heartbeat_seconds`` gets a progress
reply every ``heartbeat_seconds`` (the heartbeat task is started only then, or at the tool's first
progress message, so a short call costs no task and sends no heartbeat); the worker cancels the
call at the request's deadline (``error`` reply ``timeout``) or on ``<prefix>.toolctl.<execution_id>``
(``error`` reply ``canceled``).

Graceful stop (:meth:`Worker.run` cancelled, e.g. on SIGTERM): drain the subscriptions (no new calls are taken;
calls already delivered to this process still run), delete the registrations, wait for every
in-flight call to answer, then return.

Durable results (see :mod:`shared.results`): a request whose execution id has a ``done`` record
with the same argument digest is answered with the recorded reply and does not run; one recorded with
other arguments is refused (``error`` reply ``refused``). A tool that is neither read-only nor
idempotent gets a ``started`` record before it begins; every result is recorded as ``done`` before the
reply is sent — a read-only tool's right after the reply, its ack checked in a callback (running it
again is harmless; an unacknowledged write is written again, the awaited way). A call cut
by its deadline, canceled or failed on the worker has no ``done`` record: its effects are unknown (the
``started`` record says it may have run).

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
import contextlib
import logging
import os
import socket
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from typing import Final, TypeVar

import anyio
import msgspec
import nats.errors
from anyio.abc import TaskGroup, TaskStatus
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js.kv import KeyValue

from services.lifecycle import drain_on_cancel
from services.tools.sdk import CallFailed, Tool, ToolContext, invoke
from services.toolwire import protocol as p
from services.toolwire import tracing as tool_tracing
from services.toolwire.bucket import REFRESH_SECONDS, ensure_tools_bucket, registration_key
from services.toolwire.spec import Registration, ToolSpec
from shared import logfmt, shaping
from shared.backoff import retry
from shared.bus import ensure_kv
from shared.content import TextBlock
from shared.results import DONE, STARTED, CallRecord, ResultStore, args_digest, now_ms
from shared.settings import Settings
from shared.subjects import H_EXECUTION_ID, H_REPLY_KIND, H_WORKER_ID

log = logging.getLogger("loopwire.tools.worker")

T = TypeVar("T")

IDEMPOTENCY_TTL_SECONDS: Final = 60.0
IDEMPOTENCY_MAX_ENTRIES: Final = 1024
START_RETRY_SECONDS: Final = 30.0
# How often a drain waiting for calls in flight looks whether its connection was closed meanwhile.
_CLOSED_CHECK_SECONDS: Final = 0.1
_CANCELLED_EARLY_MAX: Final = 1024
EARLY_CANCEL_SECONDS: Final = 1.0  # how long a cancel that arrived before its request is remembered
_PROGRESS_BUFFER: Final = 16
_REPLY_MARGIN_BYTES: Final = 4096
_ACK_SWEEP_SECONDS: Final = 0.5  # how often overdue record acks are looked for


@dataclass(eq=False, slots=True)
class _Call:
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
    # Heartbeats: watched (Worker._unbeaten) until the call outlives one interval or reports
    # progress, then a task of its own.
    running: bool = False  # the tool is running: progress and heartbeats are wanted
    watched_since: float = 0.0  # event-loop time it started being watched
    beats: _Beats | None = None


@dataclass(eq=False, slots=True)
class _Beats:
    """The heartbeat task of one call and its queue of progress messages.

    Plain asyncio: it is started from a timer or a progress callback, where no task is current
    (anyio's primitives cannot be made there). It lives no longer than its call (see _stop_beats).
    """

    progress: asyncio.Queue[str]
    task: asyncio.Task[None]


class Worker:
    """Serve ``tools`` on ``nc`` until :meth:`run` is cancelled (then drain)."""

    def __init__(
        self,
        tools: Sequence[Tool],
        settings: Settings,
        nc: NATS,
        *,
        worker_id: str | None = None,
        max_concurrency: int = 64,
        record_results: bool = True,
        allow_empty: bool = False,
    ) -> None:
        _check_unique(tools)
        if not tools and not allow_empty:  # a bridge may start with none and add them (set_tools)
            raise ValueError("no tools to serve")
        self.tools = list(tools)
        self.settings = settings
        self._served = self._index(self.tools)
        self.names = settings.names
        self.nc = nc
        self.worker_id = worker_id or uuid.uuid4().hex[:16]
        self._limiter = anyio.CapacityLimiter(max_concurrency)
        self._running: dict[str, _Call] = {}  # execution id -> call
        self._idem: OrderedDict[tuple[str, str], _Call] = OrderedDict()
        # (execution id, attempt) → when its cancel arrived before the request did.
        self._cancelled_early: OrderedDict[tuple[str, str], float] = OrderedDict()
        # The tasks of the calls in flight (None: not serving). Plain asyncio tasks: a task group's
        # spawn costs more than the rest of a short call; _serve joins or cancels them itself.
        self._calls: set[asyncio.Task[None]] | None = None
        self._background_tg: TaskGroup | None = None  # registration refresh, record rewrites
        self._rewrites = 0  # records being written again (their first write was not acknowledged)
        # Running calls without a heartbeat task yet, oldest first, and the one timer for the oldest:
        # a call that ends first only leaves the dict (no timer per call).
        self._unbeaten: dict[_Call, None] = {}
        self._beat_timer: asyncio.TimerHandle | None = None
        self._subs: dict[str, Subscription] = {}  # tool name -> its queue-group subscription
        self._kv: KeyValue | None = None
        self._healthy = True
        self._registered = False
        self.results = ResultStore(nc, self.names) if record_results else None
        self._started_at = datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")

    # --- life cycle --------------------------------------------------------------------------------

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled, then drain (see the module's docstring); started once registered."""
        kv = await self._retrying(
            "tools bucket", partial(ensure_tools_bucket, self.nc.jetstream(), self.names, self.settings.replicas)
        )
        if self.results is not None:
            await self._retrying(
                "results bucket",
                partial(
                    ensure_kv,
                    self.nc.jetstream(),
                    self.names.results_bucket,
                    replicas=self.settings.replicas,
                    ttl=self.settings.results_ttl_seconds,
                ),
            )
        await drain_on_cancel(partial(self._serve, kv), task_status=task_status)

    async def _serve(self, kv: KeyValue, stop: anyio.Event, task_status: TaskStatus[None]) -> None:
        subs = self._subs
        ctl: Subscription | None = None
        alive: Subscription | None = None
        try:
            async with anyio.create_task_group() as outer:
                self._background_tg = outer
                if self.results is not None:
                    await self.results.open_acks(self._not_acked)
                    outer.start_soon(self._sweep_acks, self.results)
                self._calls = set()
                ctl = await self.nc.subscribe(self.names.toolctl("*"), cb=self._on_ctl)
                alive = await self.nc.subscribe(self.names.tool_worker(self.worker_id), cb=self._on_alive)
                for t in self.tools:
                    await self._subscribe(t)
                await self.nc.flush(timeout=5)
                # Register only once subscribed, so every listed tool is callable.
                await self._retrying("registration", partial(self._register, kv))
                self._kv = kv
                refresher = anyio.CancelScope()
                outer.start_soon(self._refresh, kv, refresher)
                log.info(
                    "worker %s serving %s", self.worker_id, ", ".join(t.name for t in self.tools) or "no tools yet"
                )
                task_status.started()
                await stop.wait()
                log.info("worker %s draining", self.worker_id)
                refresher.cancel()
                # Stop taking calls first (UNSUB + round trip; already delivered ones still run),
                # then stop advertising: a registry that lists the tool meanwhile gets "no responders".
                self._kv = None  # set_tools after this point changes nothing
                for sub in subs.values():
                    if self.nc.is_closed:  # its server is gone: nothing is delivered any more
                        break
                    try:
                        await sub.drain()  # type: ignore[no-untyped-call]
                    except nats.errors.Error as e:
                        log.warning("worker %s: drain: %r", self.worker_id, e)
                subs.clear()
                await self._deregister(kv)
                # Every in-flight call answers (each bounded by its deadline). Once the connection is
                # closed (its server is gone) no answer could leave: the calls left are cut below.
                while self._calls and not self.nc.is_closed:
                    await asyncio.wait(set(self._calls), timeout=_CLOSED_CHECK_SECONDS)
                await self._settle_records()
                outer.cancel_scope.cancel()
        finally:
            self._background_tg = None  # a record not acknowledged from here on is only logged
            calls, self._calls = self._calls or set(), None
            for task in calls:  # a hard stop: each call answers "worker stopped"
                task.cancel()
            with anyio.CancelScope(shield=True), anyio.move_on_after(5):
                if calls:
                    await asyncio.wait(calls, timeout=2)
                if self._registered:  # failed while serving: still deregister
                    await self._deregister(kv)
                for sub in subs.values():
                    await _quietly_unsubscribe(sub)
                subs.clear()
                if ctl is not None:
                    await _quietly_unsubscribe(ctl)
                if alive is not None:
                    await _quietly_unsubscribe(alive)
                if self.results is not None:
                    await self.results.close_acks()
            self._kv = None
            if self._beat_timer is not None:
                self._beat_timer.cancel()
                self._beat_timer = None
        log.info("worker %s stopped", self.worker_id)

    async def _retrying(self, what: str, fn: Callable[[], Awaitable[T]]) -> T:
        """Start-up steps on JetStream: it may still be electing leaders, so retry for a while."""
        return await retry(
            fn,
            on=Exception,
            first=0.2,
            cap=2.0,
            within=START_RETRY_SECONDS,
            before_wait=lambda _: log.warning("worker %s: %s failed, retrying", self.worker_id, what, exc_info=True),
        )

    async def _subscribe(self, t: Tool) -> None:
        subject, queue = self.names.tool(t.name), self.names.tool_queue(t.name)
        self._subs[t.name] = await self.nc.subscribe(subject, queue=queue, cb=partial(self._on_msg, t.name))

    def _index(self, tools: Sequence[Tool]) -> dict[str, tuple[Tool, ToolSpec]]:
        """Each tool and its spec by name: looked up per call, built once."""
        return {t.name: (t, t.spec(self.settings)) for t in tools}

    async def set_tools(self, tools: Sequence[Tool]) -> None:
        """Serve ``tools`` from now on: new ones are subscribed, then registered; removed ones are
        unsubscribed and deregistered (their calls in flight still answer). Before :meth:`run`
        subscribed (or after it began draining) only the list is replaced."""
        _check_unique(tools)
        old = {t.name for t in self.tools}
        self.tools = list(tools)
        self._served = self._index(self.tools)
        kv = self._kv
        if kv is None or self._calls is None:
            return
        for t in self.tools:
            if t.name not in self._subs and self._healthy:  # an unhealthy worker takes no calls
                await self._subscribe(t)
        for name in old - {t.name for t in self.tools}:
            sub = self._subs.pop(name, None)
            if sub is not None:
                await _quietly_unsubscribe(sub)
            with contextlib.suppress(Exception):  # the TTL removes it anyway
                await kv.delete(registration_key(name, self.worker_id))
        await self.nc.flush(timeout=5)
        await self._register(kv)

    @property
    def taking_calls(self) -> bool:
        """Whether any tool is subscribed (in its queue group) right now."""
        return bool(self._subs)

    async def set_healthy(self, healthy: bool) -> None:
        """Mark every tool (un)healthy (e.g. its MCP server went down or came back).

        Unhealthy: the registrations say so first, then the tools leave their queue groups, so NATS
        routes calls to healthy replicas only (with none, callers get "no responders" at once, and
        the registry keeps the tool listed as down). Healthy again: subscribe, then register.
        """
        if healthy == self._healthy:
            return
        self._healthy = healthy
        kv = self._kv
        if kv is None or self._calls is None:
            return
        if healthy:
            for t in self.tools:
                if t.name not in self._subs:
                    await self._subscribe(t)
            await self.nc.flush(timeout=5)
        try:
            await self._register(kv)
        except Exception:  # the refresh writes it again
            log.warning("worker %s: could not publish health", self.worker_id, exc_info=True)
        if not healthy:
            for name in list(self._subs):
                await _quietly_unsubscribe(self._subs.pop(name))

    async def _register(self, kv: KeyValue) -> None:
        for t in list(self.tools):
            if t not in self.tools:  # removed by set_tools meanwhile: never re-register it
                continue
            spec = t.spec(self.settings)
            if not self._healthy:
                spec = msgspec.structs.replace(spec, healthy=False)
            reg = Registration(
                worker_id=self.worker_id,
                spec=spec,
                host=socket.gethostname(),
                pid=os.getpid(),
                started_at=self._started_at,
            )
            await kv.put(registration_key(t.name, self.worker_id), p.encode(reg))
        self._registered = True

    async def _deregister(self, kv: KeyValue) -> None:
        self._registered = False
        for t in self.tools:
            try:
                await kv.delete(registration_key(t.name, self.worker_id))
            except nats.errors.ConnectionClosedError:  # its server is gone: every delete fails so
                log.warning("worker %s: not deregistered (connection closed); the TTL removes it", self.worker_id)
                return
            except nats.errors.Error as e:  # the TTL removes it anyway
                log.warning("worker %s: could not deregister %s: %r", self.worker_id, t.name, e)
            except Exception:
                log.warning("worker %s: could not deregister %s", self.worker_id, t.name, exc_info=True)

    async def _refresh(self, kv: KeyValue, scope: anyio.CancelScope) -> None:
        with scope:
            while True:
                await anyio.sleep(REFRESH_SECONDS)
                try:
                    await self._register(kv)
                except nats.errors.Error as e:  # the broker is away: one line a refresh, no traceback
                    log.warning("worker %s: registration refresh failed: %r", self.worker_id, e)
                except Exception:
                    log.warning("worker %s: registration refresh failed", self.worker_id, exc_info=True)

    # --- incoming ----------------------------------------------------------------------------------

    async def _on_msg(self, name: str, msg: Msg) -> None:
        calls = self._calls
        if calls is None:
            return
        served = self._served.get(name)
        if served is None:  # removed by set_tools while the request was on its way
            if msg.reply:
                gone = p.ToolErrorBody(kind=p.ERROR_UNAVAILABLE, message="no longer served by this worker")
                await self._send(msg.reply, p.REPLY_ERROR, p.encode(gone))
            return
        t, spec = served
        if t.inline and not self._records_first(spec, msg.headers):
            # Nothing to wait for before the reply: answered here, without a task of its own.
            await self._handle(t, spec, msg)
        else:
            task = asyncio.get_running_loop().create_task(self._handle(t, spec, msg))
            calls.add(task)
            task.add_done_callback(calls.discard)

    def _records_first(self, spec: ToolSpec, headers: dict[str, str] | None) -> bool:
        """Whether a call waits on the result records before it answers: a possible re-send reads
        them, a tool that is not rerun-safe is recorded ``started``, and only a read-only tool's
        ``done`` record is written alongside the reply."""
        if self.results is None or not headers or not headers.get(H_EXECUTION_ID):
            return False
        return not (spec.read_only and p.first_send(headers))

    async def _on_alive(self, msg: Msg) -> None:
        # Callers that find a call of ours started but unfinished ask whether we still exist.
        if msg.reply:
            with contextlib.suppress(Exception):
                await msg.respond(b"")

    async def _on_ctl(self, msg: Msg) -> None:
        execution_id = msg.subject.rsplit(".", 1)[-1]
        # The body names the attempt (the caller's reply subject): execution ids are derived from the
        # step, so a step re-run after a crash or restart reuses them, and the old attempt's cancel
        # (seen by every worker) must never stop the new attempt. An empty body cancels any attempt.
        attempt = msg.data.decode(errors="replace")
        call = self._running.get(execution_id)
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

    def _idem_lookup(self, key: tuple[str, str], digest: str) -> _Call | None:
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

    async def _handle(self, t: Tool, spec: ToolSpec, msg: Msg) -> None:
        reply = msg.reply
        if not reply:
            log.warning("worker %s: %s request without a reply subject dropped", self.worker_id, t.name)
            return
        ids, key, deadline_ms = p.ids_from_headers(msg.headers)
        start_by = p.start_by_from_headers(msg.headers)
        if start_by is not None and p.now_ms() > start_by:
            # The caller's lease ended before the request got here (its sender was stopped, or the
            # request was delayed): another replica may own the step now, so never start it.
            stale = p.ToolErrorBody(kind=p.ERROR_NOT_STARTED, message="arrived after its Lw-Start-By; not started")
            await self._send(reply, p.REPLY_ERROR, p.encode(stale))
            return
        digest = args_digest(msg.data)
        eid = ids.execution_id
        if eid and self.results is not None and not p.first_send(msg.headers):
            try:
                rec = await self.results.call(t.name, eid)
            except Exception as e:
                log.warning("worker %s: results of %s unreadable", self.worker_id, t.name, exc_info=True)
                why = p.ToolErrorBody(kind=p.ERROR_INTERNAL, message=f"result records unavailable ({type(e).__name__})")
                await self._send(reply, p.REPLY_ERROR, p.encode(why))
                return
            if rec is not None and rec.args_digest != digest:
                refused = p.ToolErrorBody(
                    kind=p.ERROR_REFUSED, message=f"execution {eid} was recorded with other arguments; not run"
                )
                await self._send(reply, p.REPLY_ERROR, p.encode(refused))
                return
            if rec is not None and rec.state == DONE:
                await self._send(reply, rec.reply_kind, bytes(rec.reply))  # ran before: its recorded reply
                return
        if key:
            same = self._idem_lookup((t.name, key), digest)
            if same is not None:
                if same.done:
                    await self._send(reply, same.final_kind, same.final_body)
                else:
                    same.replies.append(reply)  # the running call answers every waiter
                return
        call = _Call(tool=t, spec=spec, digest=digest, replies=[reply], started=time.monotonic())
        after_reply: CallRecord | None = None
        if key:
            self._idem[(t.name, key)] = call
            while len(self._idem) > IDEMPOTENCY_MAX_ENTRIES:
                self._idem.popitem(last=False)
        if eid:
            self._running[eid] = call
        try:
            started = tool_tracing.now()
            bind = logfmt.bind(loop_id=ids.loop_id, turn_id=ids.turn_id, step_id=ids.step_id, tool_execution_id=eid)
            with bind, tool_tracing.call(t.name, tool_tracing.WORKER, ids.tool_use_id, eid, msg.headers or {}) as span:
                kind, body = await self._execute(t, msg.data, ids, key, deadline_ms, call)
                outcome = tool_tracing.worker_outcome(kind, body)
                tool_tracing.finished(span, t.name, tool_tracing.WORKER, outcome, tool_tracing.now() - started)
            if eid and self.results is not None and kind == p.REPLY_RESULT:
                if call.spec.read_only:
                    # Nothing to protect (running it again is harmless): written after the reply,
                    # and not at all when the caller says nobody will read it.
                    if not p.no_record(msg.headers):
                        after_reply = self._call_record(t, eid, call, DONE, p.REPLY_RESULT, body)
                else:
                    await self._record_done(t, eid, call, body)
        except Exception as e:  # a bug here must cost one call, never the worker
            log.exception("worker %s: call of %s failed", self.worker_id, t.name)
            kind, body = p.REPLY_ERROR, p.encode(p.ToolErrorBody(kind=p.ERROR_INTERNAL, message=type(e).__name__))
        except BaseException:
            # The worker itself is being cancelled (hard stop): tell the caller, then propagate.
            call.canceled = True
            with anyio.CancelScope(shield=True), anyio.move_on_after(1):
                stopped = p.ToolErrorBody(kind=p.ERROR_CANCELED, message="worker stopped")
                await self._finish(call, p.REPLY_ERROR, p.encode(stopped), (t.name, key) if key else None)
            raise
        finally:
            if eid:
                self._running.pop(eid, None)
        await self._finish(call, kind, body, (t.name, key) if key else None)
        if after_reply is not None and self.results is not None:
            await self.results.record_call_nowait(after_reply)

    async def _finish(self, call: _Call, kind: str, body: bytes, key: tuple[str, str] | None = None) -> None:
        call.done = True
        call.finished_at = time.monotonic()
        call.final_kind, call.final_body = kind, body
        if key is not None and (call.canceled or kind == p.REPLY_ERROR) and self._idem.get(key) is call:
            # Canceled, timed out or failed on the worker: that reply belongs to this attempt alone;
            # a later attempt with the same key runs the tool again.
            del self._idem[key]
        for reply in call.replies:
            await self._send(reply, kind, body)

    async def _execute(
        self, t: Tool, raw: bytes, ids: p.CallIds, key: str, deadline_ms: int | None, call: _Call
    ) -> tuple[str, bytes]:
        timeout = call.spec.timeout_seconds
        deadline = deadline_ms / 1000 if deadline_ms is not None else time.time() + timeout
        attempt = call.replies[0] if call.replies else ""
        early = self._cancelled_early.pop((ids.execution_id, attempt), None) if ids.execution_id else None
        if early is None and ids.execution_id:
            early = self._cancelled_early.pop((ids.execution_id, ""), None)
        # Only a cancel that just overtook this request counts: execution ids are derived from the step,
        # so a step re-run after a crash or restart reuses them, and the old run's cancel (seen by every
        # worker) must not refuse the new run's call.
        if early is not None and time.monotonic() - early <= EARLY_CANCEL_SECONDS:
            call.canceled = True  # this attempt's reply only: _finish forgets it, a later attempt runs
            return p.REPLY_ERROR, p.encode(p.ToolErrorBody(kind=p.ERROR_CANCELED, message="canceled before it started"))
        if ids.execution_id and self.results is not None and not call.spec.rerun_safe:
            # Known as possibly run from here on: a re-run step never runs it again blindly.
            await self._record(t, ids.execution_id, call, STARTED)
        # An inline tool that takes no context could use none (nothing cancels it once started).
        ctx = (
            None
            if t.inline and not t.takes_context
            else ToolContext(
                ids=ids,
                idempotency_key=key,
                deadline=deadline,
                nc=self.nc,
                settings=self.settings,
                worker_id=self.worker_id,
                progress_sink=partial(self._progress, call),
            )
        )
        call.ctx = ctx
        result: p.ResultBody | None = None
        failed: CallFailed | None = None
        remaining = deadline - time.time()
        call.running = True
        try:
            if t.inline:
                # Runs to its end without yielding: nothing can cancel it once started, and a
                # heartbeat could not be sent meanwhile anyway.
                if remaining > 0 and not call.canceled:
                    try:
                        result = await invoke(t, raw, ctx)
                    except CallFailed as e:
                        failed = e
            else:
                # Heartbeats only for a call that outlives one interval: no task for a short one.
                self._watch(call)
                with anyio.CancelScope(deadline=anyio.current_time() + max(0.0, remaining)) as scope:
                    call.scope = scope
                    if not call.canceled and remaining > 0:
                        await self._acquire()
                        try:
                            result = await invoke(t, raw, ctx)
                        except CallFailed as e:
                            failed = e
                        finally:
                            self._limiter.release()
        finally:
            await self._stop_beats(call)
        if failed is not None:
            return p.REPLY_ERROR, p.encode(p.ToolErrorBody(kind=failed.kind, message=failed.message))
        if result is not None:
            return p.REPLY_RESULT, self._fit(result)
        if ctx is not None:
            ctx.cancel()
        if call.canceled:
            return p.REPLY_ERROR, p.encode(p.ToolErrorBody(kind=p.ERROR_CANCELED, message="canceled"))
        return p.REPLY_ERROR, p.encode(
            p.ToolErrorBody(kind=p.ERROR_TIMEOUT, message=f"deadline passed after {timeout:g}s")
        )

    async def _acquire(self) -> None:
        """A slot of ``max_concurrency``: taken without a yield to the event loop when one is free
        (``async with limiter`` always yields), else waited for (cancellable)."""
        try:
            self._limiter.acquire_nowait()
        except anyio.WouldBlock:
            await self._limiter.acquire()

    async def _record(self, t: Tool, eid: str, call: _Call, state: str, kind: str = "", body: bytes = b"") -> None:
        assert self.results is not None
        await self.results.record_call(self._call_record(t, eid, call, state, kind, body))

    def _call_record(self, t: Tool, eid: str, call: _Call, state: str, kind: str = "", body: bytes = b"") -> CallRecord:
        rec = CallRecord(
            tool=t.name,
            execution_id=eid,
            args_digest=call.digest,
            state=state,
            worker_id=self.worker_id,
            started_ms=now_ms(),
        )
        if state == DONE:
            rec.reply_kind, rec.reply = kind, msgspec.Raw(body)
        return rec

    async def _record_done(self, t: Tool, eid: str, call: _Call, body: bytes) -> None:
        try:
            await self._record(t, eid, call, DONE, p.REPLY_RESULT, body)
        except Exception:  # it ran: the caller still gets the answer (a re-run may not see it)
            log.warning("worker %s: result of %s not recorded", self.worker_id, t.name, exc_info=True)

    def _not_acked(self, rec: CallRecord) -> None:
        """A record written without waiting was not acknowledged: write it again, the awaited way."""
        tg = self._background_tg
        if tg is None:  # stopped meanwhile
            log.warning("worker %s: result of %s not recorded", self.worker_id, rec.tool)
            return
        self._rewrites += 1
        tg.start_soon(self._rewrite, rec)

    async def _rewrite(self, rec: CallRecord) -> None:
        assert self.results is not None
        try:
            await self.results.record_call(rec)
        except Exception:  # it ran: the caller has the answer (a re-run may not see it)
            log.warning("worker %s: result of %s not recorded", self.worker_id, rec.tool, exc_info=True)
        finally:
            self._rewrites -= 1

    async def _sweep_acks(self, results: ResultStore) -> None:
        while True:
            await anyio.sleep(_ACK_SWEEP_SECONDS)
            results.expire_unacked(time.monotonic())

    async def _settle_records(self) -> None:
        """Drain: every call has answered; wait until its records are acknowledged or written again."""
        # Polled: acks settle in the store's callback, and this runs once, at the end of a drain.
        # A closed connection acknowledges nothing more (the writes are logged as not recorded).
        while self.results is not None and (self.results.unacked or self._rewrites):
            if self.nc.is_closed:
                return
            await anyio.sleep(0.02)

    def _fit(self, result: p.ResultBody) -> bytes:
        """Encode a result; one too big for a NATS message becomes head+tail truncated text."""
        limit = max(1024, int(self.nc.max_payload or 1024 * 1024) - _REPLY_MARGIN_BYTES)
        try:
            body = p.encode(result)
        except (UnicodeEncodeError, TypeError, ValueError):  # e.g. lone surrogates from file names
            body = b""
        if body and len(body) <= limit:
            return body
        # Too big or not encodable: one text block (images noted as left out), UTF-8 cleaned and cut to fit.
        text, _ = shaping.result_content(result.blocks, omit_images_why="the result was too large for a NATS message")
        text = shaping.truncate_result(text, limit // 2)
        return p.encode(p.ResultBody(blocks=[TextBlock(text=text)], is_error=result.is_error))

    def _progress(self, call: _Call, message: str) -> None:
        """A tool's progress message (on the event loop): sent by the call's heartbeat task."""
        if not call.running or call.tool.inline:
            return  # the call is over, or holds the event loop until it is (nothing could be sent)
        if call.beats is None:
            self._arm(call, message)
        else:
            # Best effort: dropped while the caller-bound queue is full.
            with contextlib.suppress(asyncio.QueueFull):
                call.beats.progress.put_nowait(message)

    def _watch(self, call: _Call) -> None:
        loop = asyncio.get_running_loop()
        call.watched_since = loop.time()
        self._unbeaten[call] = None
        if self._beat_timer is None:
            self._beat_timer = loop.call_at(call.watched_since + self.settings.heartbeat_seconds, self._due)

    def _due(self) -> None:
        """Arm every watched call that has run for an interval; the timer moves to the next one."""
        self._beat_timer = None
        loop = asyncio.get_running_loop()
        interval = self.settings.heartbeat_seconds
        now = loop.time()
        while self._unbeaten:
            call = next(iter(self._unbeaten))
            due = call.watched_since + interval
            if due > now:
                self._beat_timer = loop.call_at(due, self._due)
                return
            self._arm(call, None)

    def _arm(self, call: _Call, first: str | None) -> None:
        """Start the call's heartbeat task: it outlived one interval (``first`` None: a heartbeat is
        due now) or sent its first progress message."""
        self._unbeaten.pop(call, None)
        if call.beats is not None or not call.running:
            return
        queue: asyncio.Queue[str] = asyncio.Queue(_PROGRESS_BUFFER)
        call.beats = _Beats(progress=queue, task=asyncio.get_running_loop().create_task(self._beat(call, queue, first)))

    async def _stop_beats(self, call: _Call) -> None:
        """The call is over: no heartbeat or progress after this (its final reply comes next)."""
        call.running = False
        self._unbeaten.pop(call, None)
        beats = call.beats
        if beats is not None:
            beats.task.cancel()
            # Wait for the task to end, so nothing it sends can follow the final reply.
            with anyio.CancelScope(shield=True):
                await asyncio.wait((beats.task,), timeout=5)

    async def _beat(self, call: _Call, progress: asyncio.Queue[str], first: str | None) -> None:
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

    async def _send(self, reply: str, kind: str, body: bytes) -> None:
        try:
            await self.nc.publish(reply, body, headers={H_REPLY_KIND: kind, H_WORKER_ID: self.worker_id})
        except nats.errors.ConnectionClosedError:  # stopped without its server; the caller learns by heartbeat loss
            log.warning("worker %s: reply to %s not sent: connection closed", self.worker_id, reply)
        except Exception:  # the caller learns by heartbeat loss; never crash the worker
            log.warning("worker %s: reply to %s failed", self.worker_id, reply, exc_info=True)


def _check_unique(tools: Sequence[Tool]) -> None:
    seen: set[str] = set()
    for t in tools:
        if t.name in seen:
            raise ValueError(f"tool {t.name!r} given twice")
        seen.add(t.name)


async def _quietly_unsubscribe(sub: Subscription) -> None:
    with contextlib.suppress(Exception):
        await sub.unsubscribe()
