"""Serve tools as NATS workers: queue-group subscriptions, deadlines, cancel, drain.

One :class:`Worker` serves any number of tools over one connection. Each call runs as its own task
(nats-py runs a subscription's callback sequentially, so the callback only spawns) — except a call
of an ``inline`` tool that needs no result record before it runs: it never waits, so it runs to its
reply in the callback itself. A call that runs longer than ``heartbeat_seconds`` gets heartbeats
(:mod:`services.tools.heartbeats`); the worker cancels the call at the request's deadline (``error``
reply ``timeout``) or on ``<prefix>.toolctl.<execution_id>`` (``error`` reply ``canceled``).

Graceful stop (:meth:`Worker.run` cancelled, e.g. on SIGTERM): drain the subscriptions (no new calls are taken;
calls already delivered to this process still run), delete the registrations, wait for every
in-flight call to answer, then return.

Durable results: :mod:`services.tools.callrecords`; idempotency of concurrent duplicates (one
worker process answers a repeated call once): :mod:`services.tools.calls`; the tools bucket's entries:
:mod:`services.tools.registration`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import Final, TypeVar

import anyio
import nats.errors
from anyio.abc import TaskStatus
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js.kv import KeyValue

from services.lifecycle import drain_on_cancel
from services.tools.callrecords import CallRecords
from services.tools.calls import Call, CallTable
from services.tools.heartbeats import Heartbeats
from services.tools.registration import Registrations
from services.tools.sdk import CallFailed, Tool, ToolContext, invoke
from services.toolwire import protocol as p
from services.toolwire import tracing as tool_tracing
from services.toolwire.bucket import REFRESH_SECONDS, ensure_tools_bucket
from services.toolwire.spec import ToolSpec
from shared import logfmt, shaping
from shared.backoff import retry
from shared.content import TextBlock
from shared.results import DONE, STARTED, CallRecord, ResultStore, args_digest
from shared.settings import Settings
from shared.streams import ensure_kv
from shared.subjects import H_EXECUTION_ID, H_REPLY_KIND, H_WORKER_ID

log = logging.getLogger("loopwire.tools.worker")

T = TypeVar("T")

START_RETRY_SECONDS: Final = 30.0
# How often a drain waiting for calls in flight looks whether its connection was closed meanwhile.
_CLOSED_CHECK_SECONDS: Final = 0.1
_REPLY_MARGIN_BYTES: Final = 4096


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
        self._table = CallTable()
        # The tasks of the calls in flight (None: not serving). Plain asyncio tasks: a task group's
        # spawn costs more than the rest of a short call; _serve joins or cancels them itself.
        self._calls: set[asyncio.Task[None]] | None = None
        self._beats = Heartbeats(settings, self._send)
        self._subs: dict[str, Subscription] = {}  # tool name -> its queue-group subscription
        self._kv: KeyValue | None = None
        self._healthy = True
        self._registrations = Registrations(settings, self.worker_id)
        self.results = ResultStore(nc, self.names) if record_results else None
        self._records = CallRecords(self.results, nc, self.worker_id) if self.results is not None else None

    # --- life cycle --------------------------------------------------------------------------------

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled, then drain (see the module's docstring); started once registered."""
        kv = await self._retrying(
            "tools bucket", partial(ensure_tools_bucket, self.nc.jetstream(), self.names, self.settings.replicas)
        )
        if self.results is not None:
            for shard in self.names.shard_ids:  # a worker serves the loops of every shard
                await self._retrying(
                    "results bucket",
                    partial(
                        ensure_kv,
                        self.nc.jetstream(),
                        self.names.results_bucket_of(shard),
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
                if self._records is not None:
                    await self._records.open(outer)
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
                if self._records is not None:
                    await self._records.settle()
                outer.cancel_scope.cancel()
        finally:
            if self._records is not None:
                self._records.detach()  # a record not acknowledged from here on is only logged
            calls, self._calls = self._calls or set(), None
            for task in calls:  # a hard stop: each call answers "worker stopped"
                task.cancel()
            with anyio.CancelScope(shield=True), anyio.move_on_after(5):
                if calls:
                    await asyncio.wait(calls, timeout=2)
                if self._registrations.registered:  # failed while serving: still deregister
                    await self._deregister(kv)
                for sub in subs.values():
                    await _quietly_unsubscribe(sub)
                subs.clear()
                if ctl is not None:
                    await _quietly_unsubscribe(ctl)
                if alive is not None:
                    await _quietly_unsubscribe(alive)
                if self._records is not None:
                    await self._records.close()
            self._kv = None
            self._beats.close()
        log.info("worker %s stopped", self.worker_id)

    async def _retrying(self, what: str, fn: Callable[[], Awaitable[T]]) -> T:
        """Start-up steps on JetStream: it may still be electing leaders, so retry for a while."""
        return await retry(
            fn,
            # NATS not answering yet; a typed refusal (an incompatible bucket, say) is final.
            on=(nats.errors.Error, TimeoutError, OSError),
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
            await self._registrations.forget(kv, name)
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
        await self._registrations.register(kv, lambda: self.tools, healthy=self._healthy)

    async def _deregister(self, kv: KeyValue) -> None:
        await self._registrations.deregister(kv, self.tools)

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
        self._table.cancel(execution_id, msg.data.decode(errors="replace"))

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
                rec = await self.results.call(t.name, eid, loop_id=ids.loop_id)
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
            same = self._table.same((t.name, key), digest)
            if same is not None:
                if same.done:
                    await self._send(reply, same.final_kind, same.final_body)
                else:
                    same.replies.append(reply)  # the running call answers every waiter
                return
        call = Call(tool=t, spec=spec, digest=digest, replies=[reply], started=time.monotonic())
        after_reply: CallRecord | None = None
        if key:
            self._table.remember((t.name, key), call)
        if eid:
            self._table.running[eid] = call
        try:
            started = tool_tracing.now()
            bind = logfmt.bind(loop_id=ids.loop_id, turn_id=ids.turn_id, step_id=ids.step_id, tool_execution_id=eid)
            with bind, tool_tracing.call(t.name, tool_tracing.WORKER, ids.tool_use_id, eid, msg.headers or {}) as span:
                kind, body = await self._execute(t, msg.data, ids, key, deadline_ms, call)
                outcome = tool_tracing.worker_outcome(kind, body)
                tool_tracing.finished(span, t.name, tool_tracing.WORKER, outcome, tool_tracing.now() - started)
            if eid and self._records is not None and kind == p.REPLY_RESULT:
                if call.spec.read_only:
                    # Nothing to protect (running it again is harmless): written after the reply,
                    # and not at all when the caller says nobody will read it.
                    if not p.no_record(msg.headers):
                        after_reply = self._records.record_of(t.name, eid, call, DONE, p.REPLY_RESULT, body)
                else:
                    await self._records.record_done(ids.loop_id, t.name, eid, call, body)
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
                self._table.running.pop(eid, None)
        await self._finish(call, kind, body, (t.name, key) if key else None)
        if after_reply is not None and self._records is not None:
            await self._records.record_nowait(ids.loop_id, after_reply)

    async def _finish(self, call: Call, kind: str, body: bytes, key: tuple[str, str] | None = None) -> None:
        call.done = True
        call.finished_at = time.monotonic()
        call.final_kind, call.final_body = kind, body
        if key is not None and (call.canceled or kind == p.REPLY_ERROR):
            self._table.forget(key, call)  # canceled, timed out or failed on the worker
        for reply in call.replies:
            await self._send(reply, kind, body)

    async def _execute(
        self, t: Tool, raw: bytes, ids: p.CallIds, key: str, deadline_ms: int | None, call: Call
    ) -> tuple[str, bytes]:
        timeout = call.spec.timeout_seconds
        deadline = deadline_ms / 1000 if deadline_ms is not None else time.time() + timeout
        attempt = call.replies[0] if call.replies else ""
        if self._table.canceled_before_start(ids.execution_id, attempt):
            call.canceled = True  # this attempt's reply only: _finish forgets it, a later attempt runs
            return p.REPLY_ERROR, p.encode(p.ToolErrorBody(kind=p.ERROR_CANCELED, message="canceled before it started"))
        if ids.execution_id and self._records is not None and not call.spec.rerun_safe:
            # Known as possibly run from here on: a re-run step never runs it again blindly.
            await self._records.record(ids.loop_id, t.name, ids.execution_id, call, STARTED)
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
                progress_sink=partial(self._beats.progress, call),
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
                self._beats.watch(call)
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
            await self._beats.stop(call)
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
