"""The console's HTTP handlers: :class:`ConsoleApi`, one method per route (see :mod:`services.console.routes`).

Reading is served from the console's index of every loop and from JetStream; every action goes
through the loop API with the command id the page sent (one per click, so a retried request is
applied once).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, Final, cast

import anyio
import msgspec
import nats.errors
from nats.aio.client import Client as NATS
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response, StreamingResponse

from services.console import rules
from services.console.bodies import AnswerBody, CommandBody, ForkBody, InputBody, StartBody, read_body
from services.console.errors import ApiError, invalid
from services.console.guard import TOKEN_HEADER, Handler
from services.console.index import LoopIndex
from services.console.pages import error_page, page_response
from services.console.params import int_param, integer, loop_id_of
from services.console.sse import HEARTBEAT, frame, loop_feed, record_json, retry_frame
from shared import shards
from shared.client import LoopClient
from shared.errors import ErrorKind
from shared.jserrors import JetStreamError, JetStreamUnavailableError
from shared.loopstate import STATES
from shared.protocol import RemoteError
from shared.settings import Settings
from shared.streamreads import direct_get_batch, get_msg
from shared.validate import is_uuid
from shared.verify import verify_loop
from shared.wiretypes import AnswerAction

if TYPE_CHECKING:
    from services.toolcaller.registry import ToolRegistry

EVENTS_PAGE: Final = 200
MAX_EVENTS_PAGE: Final = 1000
MAX_QUERY_CHARS: Final = 200
CHANGE_INTERVAL: Final = 0.25  # at most this often a "changed" notice per page
SSE_HEADERS: Final = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}


def _ok(**doc: Any) -> JSONResponse:
    return JSONResponse({"ok": True, **doc})


class ConsoleApi:
    """The console's routes and what they share: the NATS connection, the index, the tool registry
    (all three set while the app runs) and the token."""

    def __init__(self, settings: Settings, *, token: str = "") -> None:
        self.settings = settings
        self.token = token
        self.nc: NATS | None = None
        self.index: LoopIndex | None = None
        self.registry: ToolRegistry | None = None

    @property
    def client(self) -> LoopClient:
        return LoopClient(self._nc(), self.settings.names)

    def _nc(self) -> NATS:
        assert self.nc is not None
        return self.nc

    def loops_index(self) -> LoopIndex:
        if self.index is None or not self.index.following:
            streams = [h.stream for h in shards.history_streams(self.settings.names)]
            what = f"stream {streams[0]}" if len(streams) == 1 else f"streams {', '.join(streams)}"
            raise ApiError(ErrorKind.UNAVAILABLE, f"waiting for the history {what} (is a committer running?)")
        return self.index

    async def summary_of(self, loop_id: str) -> rules.LoopSummary:
        s = await self.loops_index().find(loop_id)
        if s is None:
            raise ApiError(ErrorKind.NOT_FOUND, f"no loop {loop_id}")
        return s

    def agent_children(self, loop_id: str) -> list[rules.LoopSummary]:
        """The child loops of ``loop_id``'s agent calls, theirs, and so on."""
        every = self.loops_index().loops
        found: dict[str, rules.LoopSummary] = {}
        todo = [loop_id]
        while todo:
            parent = todo.pop()
            for c in every.values():
                if c.agent_parent == parent and c.loop_id not in found and c.loop_id != loop_id:
                    found[c.loop_id] = c
                    todo.append(c.loop_id)
        return list(found.values())

    # --- pages

    def page(self, name: str) -> Handler:
        async def serve(request: Request) -> Response:
            return await self.loop_page(request) if name == "loop" else page_response(name)

        return serve

    async def loop_page(self, request: Request) -> HTMLResponse:
        loop_id = str(request.path_params["loop_id"])
        if not is_uuid(loop_id):
            return error_page(404, "No such loop", f"{loop_id!r} is not a loop id (a lowercase UUID).")
        if not rules.token_ok(self.token, request.headers.get(TOKEN_HEADER)):
            # Without the token, the same page for every id: its own API calls (which carry the
            # token) say whether the loop exists. A lookup here would tell anyone which ids do.
            return page_response("loop")
        index = self.index
        if index is None or not index.following:
            return error_page(503, "Not ready", "The console is waiting for the loops' history stream.")
        try:
            found = await index.find(loop_id)
        except (JetStreamUnavailableError, JetStreamError, nats.errors.Error) as e:
            return error_page(503, "NATS unavailable", str(e))
        if found is None:
            return error_page(404, "No such loop", f"There is no loop {loop_id}.")
        return page_response("loop")

    # --- reading

    async def whoami(self, request: Request) -> Response:
        return _ok(prefix=self.settings.prefix, token_required=bool(self.token))

    async def list_loops(self, request: Request) -> Response:
        index = self.loops_index()
        state = request.query_params.get("state", "")
        if state and state not in STATES:
            raise invalid("state", f"state must be one of {', '.join(STATES)}")
        text = request.query_params.get("q", "")[:MAX_QUERY_CHARS]
        page_no = int_param(request, "page", 1, low=1)
        size = int_param(request, "size", rules.PAGE_SIZE, low=1, high=rules.MAX_PAGE_SIZE)
        all_loops = list(index.loops.values())
        p = rules.select(all_loops, state=state, text=text, page=page_no, size=size)
        return _ok(
            loops=[s.to_json() for s in p.items],
            total=p.total,
            page=p.page,
            pages=p.pages,
            counts=rules.count_states(all_loops),
            version=index.version,
        )

    async def get_loop(self, request: Request) -> Response:
        s = await self.summary_of(loop_id_of(request))
        doc = s.to_json()
        # A sub-agent's gates wait in its parent's inbox: the open gates of the loop's child loops too.
        doc["open_gates"] += [rules.gate_json(g) for c in self.agent_children(s.loop_id) for g in c.open_gates]
        return _ok(loop=doc)

    async def verify(self, request: Request) -> Response:
        """The loop's history checked against its digest chain (the page's verified mark; shared.verify)."""
        s = await self.summary_of(loop_id_of(request))
        try:
            report = await verify_loop(self._nc(), self.settings.names, s.loop_id)
        except (JetStreamUnavailableError, JetStreamError, nats.errors.Error) as e:
            raise ApiError(ErrorKind.UNAVAILABLE, f"cannot read the loop's history: {e}") from None
        check = report.loops.get(s.loop_id)
        summary = report.summary()
        return _ok(
            loop_id=s.loop_id,
            verified=summary["ok"],
            records=summary["records"],
            chained=check.chained if check is not None else 0,
            unchained=summary["unchained"],
            problems=[p.to_json() for p in report.problems],
        )

    async def loop_events(self, request: Request) -> Response:
        loop_id = loop_id_of(request)
        s = await self.summary_of(loop_id)
        before = int_param(request, "before", 0)
        limit = int_param(request, "limit", EVENTS_PAGE, low=1, high=MAX_EVENTS_PAGE)
        seqs = s.seqs_before(before, limit)
        records: list[dict[str, Any]] = []
        home = await shards.home_of(self._nc(), self.settings.names, loop_id)
        start = seqs[0] if seqs else 0
        while seqs and start <= seqs[-1]:
            # A batch stops early at its byte limit (large records): ask again from where it stopped.
            batch = await direct_get_batch(
                self._nc(), home.stream, home.subject, start_seq=start, batch=len(seqs) - len(records)
            )
            got = [m for m in batch.messages if m.seq <= seqs[-1]]
            if not got:
                break
            records += [record_json(m.seq, m.data) for m in got]
            start = got[-1].seq + 1
        first = s.seqs[0] if s.seqs else 0
        return _ok(events=records, more=bool(seqs) and seqs[0] > first, last_seq=s.last_seq)

    async def loop_event(self, request: Request) -> Response:
        loop_id = loop_id_of(request)
        seq = int(request.path_params["seq"])
        if not 1 <= seq < 2**63:
            raise ApiError(ErrorKind.NOT_FOUND, f"loop {loop_id} has no record at sequence {seq}")
        home = await shards.home_of(self._nc(), self.settings.names, loop_id)
        m = await get_msg(self._nc(), home.stream, seq=seq)
        if m is None or m.subject != home.subject:
            raise ApiError(ErrorKind.NOT_FOUND, f"loop {loop_id} has no record at sequence {seq}")
        return _ok(seq=seq, event=msgspec.json.decode(m.data))

    async def list_gates(self, request: Request) -> Response:
        index = self.loops_index()
        loops = list(index.loops.values())
        return _ok(
            gates=[rules.gate_json(g) for g in rules.open_gates(loops)],
            resolved=[rules.gate_json(g) for g in rules.resolved_gates(loops)],
            version=index.version,
        )

    async def list_tools(self, request: Request) -> Response:
        registry = self.registry
        if registry is None:
            raise ApiError(ErrorKind.UNAVAILABLE, "the tool registry is not loaded yet")
        tools = [msgspec.to_builtins(t) for t in registry.live()]
        conflicts = {name: [msgspec.to_builtins(s) for s in specs] for name, specs in registry.conflicts().items()}
        return _ok(tools=tools, conflicts=conflicts)

    async def lineage(self, request: Request) -> Response:
        loop_id = loop_id_of(request)
        s = await self.summary_of(loop_id)
        loops = self.loops_index().loops.values()
        forks = [
            {"loop_id": c.loop_id, "link": "fork", "at": c.forked_at, "title": c.title, "state": c.state}
            for c in loops
            if c.parent == loop_id
        ]
        agents = [
            {
                "loop_id": c.loop_id,
                "link": "child",
                "at": 0,
                "tool": c.agent_tool,
                "call": c.agent_call,
                "title": c.title,
                "state": c.state,
            }
            for c in loops
            if c.agent_parent == loop_id
        ]
        return _ok(
            loop_id=loop_id,
            parent=s.parent or None,
            forked_at=s.forked_at or None,
            agent_parent=s.agent_parent or None,
            agent_tool=s.agent_tool or None,
            children=sorted(forks + agents, key=lambda c: (c["at"], c["loop_id"])),
            points=s.fork_points.points,
        )

    # --- live

    async def index_stream(self, request: Request) -> Response:
        index = self.loops_index()

        async def frames() -> AsyncIterator[bytes]:
            yield retry_frame()
            version = -1
            while True:
                new = await index.wait_changed(version, 15.0)
                if new == version:
                    yield HEARTBEAT
                    continue
                version = new
                loops = list(index.loops.values())
                gates = sum(len(s.open_gates) for s in loops)
                yield frame("changed", {"version": version, "gates": gates, "counts": rules.count_states(loops)})
                await anyio.sleep(CHANGE_INTERVAL)

        return StreamingResponse(frames(), media_type="text/event-stream", headers=SSE_HEADERS)

    async def loop_stream(self, request: Request) -> Response:
        loop_id = loop_id_of(request)
        await self.summary_of(loop_id)
        resume = request.headers.get("last-event-id")
        after = integer(resume, "Last-Event-ID") if resume else int_param(request, "after", 0)
        feed = loop_feed(self._nc(), self.settings.names, loop_id, after)
        return StreamingResponse(feed, media_type="text/event-stream", headers=SSE_HEADERS)

    # --- actions

    async def start_loop(self, request: Request) -> Response:
        body = await read_body(request, StartBody)
        cid = body.command_id
        res = await self.client.start(
            body.loop_id,
            model=body.model or None,
            system=body.system or None,
            tools=body.tool_names(),
            policy=body.policy_rules(),
            default_policy=body.default_policy or None,
            limits=body.limits(),
            command_id=cid,
        )
        seq = res.seq
        if body.input.strip():
            # The first input's command id derives from the start's: a retried request sends it once.
            input_cid = str(uuid.uuid5(uuid.UUID(cid), "input"))
            seq = (await self.client.input(res.loop_id, body.input, command_id=input_cid)).seq
        return _ok(loop_id=res.loop_id, seq=seq, command_id=cid)

    async def fork_loop(self, request: Request) -> Response:
        loop_id = loop_id_of(request)
        body = await read_body(request, ForkBody)
        cid = body.command_id
        await self.summary_of(loop_id)
        # The new loop's id derives from the command's: a retried request makes one fork.
        res = await self.client.fork(
            loop_id,
            at=body.at_seq(),
            input=body.input if body.input.strip() else None,
            loop_id=str(uuid.uuid5(uuid.UUID(cid), "fork")),
            command_id=cid,
        )
        return _ok(loop_id=res.loop_id, source=loop_id, seq=res.seq, command_id=cid)

    async def send_input(self, request: Request) -> Response:
        loop_id = loop_id_of(request)
        body = await read_body(request, InputBody)
        await self.summary_of(loop_id)
        res = await self.client.input(loop_id, body.text, command_id=body.command_id)
        return _ok(loop_id=loop_id, seq=res.seq, command_id=body.command_id)

    async def answer_gate(self, request: Request) -> Response:
        loop_id = loop_id_of(request)
        body = await read_body(request, AnswerBody)
        gate_id = body.gate_id
        s = await self.summary_of(loop_id)
        if gate_id not in s.gates:
            raise ApiError(ErrorKind.NOT_FOUND, f"loop {loop_id} has no gate {gate_id}")
        try:
            res = await self.client.answer(
                loop_id,
                gate_id,
                cast("AnswerAction", body.action),  # checked by the loop API
                text=body.text,
                reason=body.reason,
                resolver=body.operator,
                command_id=body.command_id,
            )
        except RemoteError as e:
            if e.body.kind != ErrorKind.CLOSED:
                raise
            raise await self._already_answered(s, gate_id) from None
        return _ok(loop_id=loop_id, gate_id=gate_id, seq=res.seq, command_id=body.command_id)

    async def _already_answered(self, s: rules.LoopSummary, gate_id: str) -> ApiError:
        """Someone answered first: say who and when (the index may be a moment behind the committer)."""
        gv = s.gates[gate_id]
        with anyio.move_on_after(2):
            while not gv.resolved and s.open_turn == gv.turn_id:
                await self.loops_index().wait_changed(self.loops_index().version, 0.1)
        return ApiError("already_answered", rules.already_answered(gv), gate=rules.gate_json(gv))

    async def interrupt(self, request: Request) -> Response:
        return await self._loop_command(request, "interrupt")

    async def close(self, request: Request) -> Response:
        return await self._loop_command(request, "close")

    async def _loop_command(self, request: Request, verb: str) -> Response:
        loop_id = loop_id_of(request)
        body = await read_body(request, CommandBody)
        await self.summary_of(loop_id)
        client = self.client
        res = await (client.interrupt if verb == "interrupt" else client.close)(loop_id, command_id=body.command_id)
        return _ok(loop_id=loop_id, seq=res.seq, command_id=body.command_id)
