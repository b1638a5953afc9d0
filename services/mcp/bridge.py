"""One MCP server as a supervised loopwire tool worker (``loopwire serve mcp NAME ...``).

The bridge owns one long-lived MCP session (server state survives between calls) and one
:class:`~services.tools.worker.Worker` that serves every listed MCP tool as ``NAME_<tool>`` in its
queue group, so several bridges with the same NAME are replicas like any other tool worker.

Calls: the loopwire deadline is the MCP request timeout; MCP progress becomes ToolCallProgress (and
so a heartbeat); a loopwire cancel (interrupt, deadline, caller gone) cancels the MCP request, which
makes the SDK send ``notifications/cancelled``; results are mapped by :mod:`services.mcp.mapping`.

Supervision: a ping every ``ping_interval`` seconds notices a server that exited (the ping fails) or
stopped answering (no reply within ``ping_timeout`` while none of its tools runs: a server busy with
a call may answer nothing until it ends, and that call's deadline bounds it), as does a call that
finds the connection closed. The session is
then closed (a stdio child is stopped) and opened again after a backoff (``BACKOFF_FIRST`` doubling
to ``backoff_max``; it starts over once a session stayed up ``STABLE_SECONDS``). While the server is
down its tools stay registered with ``healthy=false`` and answer ``unavailable`` at once; calls in
flight when it died answer ``crashed``. ``notifications/tools/list_changed`` and every reconnect
re-list the tools and update the registrations (added ones appear, removed ones disappear).

A server that cannot be started, or does not answer ``initialize`` within ``init_timeout``, on the
*first* attempt is a start error (:class:`~services.mcp.connect.McpStartError`): nothing is
registered and the bridge ends. Listed tools that cannot be served (invalid name for model APIs,
invalid inputSchema, listed twice, name already served by another source) are refused with a
logged reason; the others are served.
"""

from __future__ import annotations

import logging
import math
import time
import warnings
from collections.abc import Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass
from functools import partial
from typing import Any, Final

import anyio
import mcp_types as mt
import msgspec
import pydantic
from anyio.abc import TaskStatus
from mcp import Client, MCPError
from mcp.client.session import IncomingMessage
from nats.aio.client import Client as NATS

from services.lifecycle import drain_on_cancel
from services.mcp import mapping
from services.mcp.connect import McpStartError, McpTarget, open_client
from services.toolcaller.registry import ToolRegistry
from services.tools.sdk import CallFailed, Tool, ToolContext, error_result
from services.tools.worker import Worker
from services.toolwire import protocol as p
from services.toolwire.spec import ToolSpec
from shared import shaping
from shared.backoff import Backoff
from shared.settings import Settings

log = logging.getLogger("loopwire.mcp")

BACKOFF_FIRST: Final = 0.25
STABLE_SECONDS: Final = 10.0
_LIST_PAGES_MAX: Final = 100


class _Arguments(msgspec.Struct):
    """Placeholder input type: MCP arguments are any JSON object, checked by the server."""


@dataclass(eq=False)
class BridgedTool(Tool):
    """A loopwire tool whose spec comes from an MCP listing and whose calls go to the session."""

    mapped_spec: ToolSpec | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        assert self.mapped_spec is not None
        self.input_schema = self.mapped_spec.input_schema
        self._decoder = msgspec.json.Decoder(dict[str, Any])

    def spec(self, settings: Settings | None = None) -> ToolSpec:
        assert self.mapped_spec is not None
        return self.mapped_spec


class Bridge:
    """Serve ``target``'s tools until :meth:`run` is cancelled (then drain, then close the session)."""

    def __init__(
        self,
        target: McpTarget,
        settings: Settings,
        nc: NATS,
        *,
        timeout_seconds: float | None = None,
        init_timeout: float = 10.0,
        ping_interval: float = 1.0,
        ping_timeout: float = 10.0,
        backoff_max: float = 30.0,
    ) -> None:
        if not mapping.valid_server_name(target.name):
            raise ValueError(f"invalid MCP server name {target.name!r}: use 1-40 of [A-Za-z0-9-] (no '_')")
        self.target = target
        self.settings = settings
        self.nc = nc
        self.timeout_seconds = timeout_seconds if timeout_seconds is not None else settings.tool_timeout_seconds
        self.init_timeout = init_timeout
        self.ping_interval = ping_interval
        self.ping_timeout = ping_timeout
        self.backoff_max = backoff_max
        self.worker = Worker([], settings, nc, allow_empty=True)
        self.source = mapping.source_of(target.name)
        self.start_error: McpStartError | None = None
        self.rejected: list[mapping.McpToolRejected] = []
        self.restarts = 0
        self._registry = ToolRegistry(nc, settings.names, replicas=settings.replicas)
        self._client: Client | None = None
        self._wake = anyio.Event()
        self._list_changed = False
        self._lost = False
        self._inflight = 0
        self._ever_up = False
        self._logged: set[str] = set()

    # --- life cycle --------------------------------------------------------------------------------

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled: then drain (calls in flight finish on the live session), then close
        the session. Started once the first session is up; raises :class:`McpStartError` when it
        never came up."""
        await drain_on_cancel(self._serve, task_status=task_status)
        if self.start_error is not None:
            raise self.start_error

    async def _serve(self, stop: anyio.Event, task_status: TaskStatus[None]) -> None:
        up, over, moved = anyio.Event(), anyio.Event(), anyio.Event()
        worker_done = anyio.Event()
        worker, supervisor = anyio.CancelScope(), anyio.CancelScope()

        def end() -> None:
            over.set()
            moved.set()

        async def run_worker(*, task_status: TaskStatus[None]) -> None:
            try:
                with worker:
                    await self.worker.run(task_status=task_status)
            finally:
                worker_done.set()
                end()

        async def supervise() -> None:
            try:
                with supervisor:
                    await self._supervise(up)
            except McpStartError as e:
                self.start_error = e
            finally:
                end()

        async def on_up() -> None:
            await up.wait()
            moved.set()

        async def on_stop() -> None:
            await stop.wait()
            end()

        async with anyio.create_task_group() as tg:
            await tg.start(run_worker)
            await self._registry.start()
            try:
                tg.start_soon(supervise)
                tg.start_soon(on_up)
                tg.start_soon(on_stop)
                await moved.wait()
                if up.is_set():
                    task_status.started()
                await over.wait()
                # Drain first (calls in flight finish on the live session), then close the session.
                worker.cancel()
                await worker_done.wait()
                supervisor.cancel()
                tg.cancel_scope.cancel()
            finally:
                with anyio.CancelScope(shield=True):
                    await self._registry.stop()

    def _wake_up(self) -> None:
        self._wake.set()
        self._wake = anyio.Event()

    async def _supervise(self, up: anyio.Event) -> None:
        backoff = self._backoff()
        while True:
            began = time.monotonic()
            try:
                await self._session(up)
            except McpStartError as e:
                if not self._ever_up:
                    raise
                log.warning("MCP server %s: %s", self.target.name, e)
            except Exception as e:  # any failure of one session ends it; the next one starts afresh
                leaf = _leaf(e)
                if not self._ever_up:
                    raise McpStartError(f"MCP server {self.target.name} failed: {type(leaf).__name__}: {leaf}") from e
                log.warning("MCP server %s: session failed: %s: %s", self.target.name, type(leaf).__name__, leaf)
            self._client = None
            await self.worker.set_healthy(False)
            if time.monotonic() - began >= STABLE_SECONDS:
                backoff = self._backoff()  # it stayed up: start over
            log.warning("MCP server %s is down; restarting in %.2fs", self.target.name, backoff.delay)
            await backoff.sleep()
            self.restarts += 1

    def _backoff(self) -> Backoff:
        return Backoff(min(BACKOFF_FIRST, self.backoff_max), self.backoff_max)

    async def _session(self, up: anyio.Event) -> None:
        """One session, from start to loss. Returns when the server exited or stopped answering."""
        self._lost = self._list_changed = False
        what = self.target.describe()
        with anyio.CancelScope(deadline=anyio.current_time() + self.init_timeout) as handshake:
            async with AsyncExitStack() as stack:
                try:
                    client = await stack.enter_async_context(open_client(self.target, self._on_message))
                except Exception as e:
                    raise _start_error(what, e) from None
                handshake.deadline = math.inf
                with anyio.fail_after(self.init_timeout):
                    await self._relist(client)
                self._client = client
                await self.worker.set_healthy(True)
                log.info("MCP server %s up (%s)", self.target.name, what)
                self._ever_up = True  # from now on, failures are restarts, not start errors
                up.set()
                await self._watch(client)
                self._client = None
                await self.worker.set_healthy(False)
        if handshake.cancelled_caught:
            raise McpStartError(f"MCP server {what!r} did not answer initialize within {self.init_timeout:g}s")

    async def _watch(self, client: Client) -> None:
        while True:
            with anyio.move_on_after(self.ping_interval):
                await self._wake.wait()
            if self._lost:
                log.warning("MCP server %s: connection lost", self.target.name)
                return
            if self._list_changed:
                self._list_changed = False
                try:
                    with anyio.fail_after(self.ping_timeout):
                        await self._relist(client)
                except (MCPError, TimeoutError) as e:
                    log.warning("MCP server %s: re-list failed: %s", self.target.name, e)
                    return
                continue
            busy = self._inflight > 0
            try:
                with anyio.fail_after(self.ping_timeout), warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # ping is deprecated in 2026 revisions, fine on handshake sessions
                    await client.session.send_ping()
            except TimeoutError:
                # A server may not answer while one of its tools runs (one request at a time): that
                # call's deadline bounds it. Silence with no call running means it hangs.
                if busy or self._inflight > 0:
                    continue
                log.warning(
                    "MCP server %s stopped answering (no ping reply in %gs)", self.target.name, self.ping_timeout
                )
                return
            except MCPError as e:
                log.warning("MCP server %s: ping failed: %s", self.target.name, e.error.message)
                return

    async def _on_message(self, message: IncomingMessage) -> None:
        if isinstance(message, mt.ToolListChangedNotification):
            self._list_changed = True
            self._wake_up()

    # --- tools -------------------------------------------------------------------------------------

    async def _relist(self, client: Client) -> None:
        tools: list[mt.Tool] = []
        cursor: str | None = None
        for _ in range(_LIST_PAGES_MAX):
            page = await client.list_tools(cursor=cursor, cache_mode="bypass")
            tools.extend(page.tools)
            cursor = page.next_cursor
            if cursor is None:
                break
        mapped, rejected = mapping.map_tools(self.target.name, tools, timeout_seconds=self.timeout_seconds)
        mapped, collided = self._without_collisions(mapped)
        self.rejected = rejected + collided
        for r in self.rejected:
            if str(r) not in self._logged:  # each reason once, not on every re-list
                self._logged.add(str(r))
                log.error("MCP server %s: %s", self.target.name, r)
        await self.worker.set_tools([self._tool(m) for m in mapped])
        log.info(
            "MCP server %s: serving %d tool(s)%s",
            self.target.name,
            len(mapped),
            f", refused {len(self.rejected)}" if self.rejected else "",
        )

    def _without_collisions(
        self, mapped: Sequence[mapping.MappedTool]
    ) -> tuple[list[mapping.MappedTool], list[mapping.McpToolRejected]]:
        kept, refused = [], []
        for m in mapped:
            live = self._registry.get(m.spec.name)
            if live is not None and live.source != self.source:
                owner = live.source or "a loopwire tool worker"
                reason = f"the name {m.spec.name!r} is already served by {owner}"
                refused.append(mapping.McpToolRejected(m.mcp_name, reason))
            else:
                kept.append(m)
        return kept, refused

    def _tool(self, m: mapping.MappedTool) -> BridgedTool:
        return BridgedTool(
            fn=partial(self._call, m.mcp_name),
            input_type=_Arguments,
            name=m.spec.name,
            description=m.spec.description,
            takes_context=True,
            is_async=True,
            mapped_spec=m.spec,
        )

    async def _call(self, mcp_name: str, args: dict[str, Any], ctx: ToolContext) -> p.ResultBody:
        client = self._client
        if client is None:
            raise CallFailed(p.ERROR_UNAVAILABLE, f"{self.source} is down, restarting")  # as the executor says

        async def on_progress(progress: float, total: float | None, message: str | None) -> None:
            ctx.progress(mapping.progress_text(progress, total, message))

        self._inflight += 1
        try:
            result = await client.call_tool(
                mcp_name, args, read_timeout_seconds=ctx.remaining(), progress_callback=on_progress
            )
        except MCPError as e:
            if e.code == mt.CONNECTION_CLOSED:
                self._connection_lost(client)
                raise CallFailed(p.ERROR_CRASHED, f"MCP server {self.target.name} went away during the call") from None
            if e.code == mt.REQUEST_TIMEOUT:
                raise CallFailed(p.ERROR_TIMEOUT, "deadline passed (MCP request timed out)") from None
            return error_result(shaping.tool_error(f"MCP error {e.code}: {e.error.message}"))
        except pydantic.ValidationError as e:
            return error_result(
                shaping.tool_error(f"the MCP server sent an invalid result: {e.error_count()} error(s)")
            )
        finally:
            self._inflight -= 1
        return mapping.result_of(result)

    def _connection_lost(self, client: Client) -> None:
        if client is self._client:  # not a late failure of an earlier session
            self._client = None
            self._lost = True
            self._wake_up()


def _leaf(e: BaseException) -> BaseException:
    """The first real error inside (nested) exception groups of the SDK's task groups."""
    while isinstance(e, BaseExceptionGroup) and e.exceptions:
        e = e.exceptions[0]
    return e


def _start_error(what: str, e: Exception) -> McpStartError:
    leaf = _leaf(e)
    if isinstance(leaf, MCPError):
        return McpStartError(f"{what!r} is not an MCP server or failed during initialize: {leaf.error.message}")
    if isinstance(leaf, OSError | ValueError):
        return McpStartError(f"cannot start MCP server {what!r}: {leaf}")
    return McpStartError(f"MCP server {what!r} failed during initialize: {type(leaf).__name__}: {leaf}")
