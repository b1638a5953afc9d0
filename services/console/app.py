"""The operator console: a Starlette app that talks to NATS on the server side only.

Pages (static HTML + one script, served from the package) read JSON from ``/api/...`` and follow
server-sent events: ``/api/stream`` (the index changed: loops and gates pages refresh) and
``/api/loops/<id>/stream`` (a loop's committed records, ids = stream sequences, plus its live
events). Every action goes through the loop API with a command id (the page mints one per click,
so a retried request is applied once).

Checks on every ``/api`` request: the token (``LW_CONSOLE_TOKEN``, header ``X-Loopwire-Token``)
when one is configured, and for state-changing requests an origin that is this console's own.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import re
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from html import escape
from importlib import resources
from pathlib import Path
from typing import Any, Final, cast
from urllib.parse import parse_qsl

import anyio
import msgspec
import nats.errors
from nats.aio.client import Client as NATS
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from services.console import rules
from services.console.index import LoopIndex
from services.console.sse import HEARTBEAT, frame, loop_feed, record_json, retry_frame
from services.model_step.policy import parse_policy as policy_rules
from shared.bus import JetStreamError, JetStreamUnavailableError, connect, direct_get_batch, get_msg
from shared.client import LoopClient
from shared.errors import ErrorKind, LoopwireError
from shared.events import POLICY_EFFECTS, Limits
from shared.protocol import RemoteError
from shared.settings import Settings, split_list
from shared.validate import is_uuid
from shared.wiretypes import AnswerAction, PolicyEffect

log = logging.getLogger("loopwire.console")

TOKEN_HEADER: Final = "x-loopwire-token"
EVENTS_PAGE: Final = 200
MAX_EVENTS_PAGE: Final = 1000
MAX_BODY_BYTES: Final = 256 * 1024
MAX_TEXT_CHARS: Final = 100_000
MAX_OPERATOR_CHARS: Final = 64
# An integer as the API takes it: ASCII digits only (str.isdigit() and int() also take other
# scripts' digits, and int() not all that isdigit() takes), short enough that int() never refuses it.
_INTEGER: Final = re.compile(r"-?[0-9]{1,19}")
CHANGE_INTERVAL: Final = 0.25  # at most this often a "changed" notice per page
# How long the console waits at start-up for its index to catch up before it serves anyway.
INDEX_WAIT_SECONDS: Final = 3.0

STATUS: Final[dict[str, int]] = {
    ErrorKind.INVALID: 400,
    ErrorKind.NOT_FOUND: 404,
    ErrorKind.CLOSED: 409,
    ErrorKind.CONFLICT: 409,
    ErrorKind.TOO_LARGE: 413,
    ErrorKind.UNAVAILABLE: 503,
    "already_answered": 409,
    "unauthorized": 401,
    "forbidden": 403,
    "internal": 500,
}


class ApiError(LoopwireError):
    """A request the console refuses; becomes ``{"ok": false, "error": {...}}`` (or an error page)."""

    # An ErrorKind or one of the console's own kinds (see STATUS): the JSON error's kind.
    kind: str  # type: ignore[assignment]

    def __init__(self, kind: str, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.extra = extra

    @property
    def status(self) -> int:
        return STATUS.get(self.kind, 400)


def static_dir() -> Path:
    return Path(str(resources.files("services.console") / "static"))


def error_json(e: ApiError) -> JSONResponse:
    return JSONResponse({"ok": False, "error": {"kind": e.kind, "message": e.message, **e.extra}}, status_code=e.status)


# name → (title, the navigation entry it belongs to)
PAGES: Final = {
    "loops": ("Loops", "loops"),
    "loop": ("Loop", "loops"),
    "gates": ("Gates", "gates"),
    "tools": ("Tools", "tools"),
}


@functools.cache
def _layout() -> str:
    return (static_dir() / "layout.html").read_text(encoding="utf-8")


def render_page(page: str, title: str, body: str, nav: str = "") -> str:
    """A page: the shared layout (header, navigation, token bar) around ``body``."""
    out = _layout()
    for key, value in {"title": escape(title), "page": page, "body": body}.items():
        out = out.replace("{{" + key + "}}", value)
    for section in ("loops", "gates", "tools"):
        out = out.replace("{{nav_" + section + "}}", "active" if section == nav else "")
    return out


@functools.cache
def page_html(name: str) -> str:
    title, nav = PAGES[name]
    return render_page(name, title, (static_dir() / "pages" / f"{name}.html").read_text(encoding="utf-8"), nav)


def error_page(status: int, title: str, message: str) -> HTMLResponse:
    body = (
        f'<div class="error-page"><h1>{escape(title)}</h1><p id="error-message">{escape(message)}</p>'
        '<p><a href="/">back to the loops</a></p></div>\n'
    )
    return HTMLResponse(render_page("error", title, body), status_code=status)


@dataclass
class Console:
    """Everything the routes share: the NATS connection, the index, the tool registry, the token."""

    settings: Settings
    token: str = ""
    nc: NATS | None = None
    index: LoopIndex | None = None
    registry: Any = None

    @property
    def client(self) -> LoopClient:
        assert self.nc is not None
        return LoopClient(self.nc, self.settings.names)

    def loops_index(self) -> LoopIndex:
        if self.index is None or not self.index.following:
            stream = self.settings.names.history_stream
            raise ApiError(ErrorKind.UNAVAILABLE, f"waiting for the history stream {stream} (is a committer running?)")
        return self.index


# --- request helpers ------------------------------------------------------------------------------


async def body_of(request: Request) -> dict[str, str]:
    """A JSON object or a urlencoded form, as strings; anything else is a clear ``invalid``."""
    raw = await request.body()
    if len(raw) > MAX_BODY_BYTES:
        raise ApiError("too_large", f"request body over {MAX_BODY_BYTES} bytes")
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if not raw.strip():
        return {}
    if ctype == "application/json":
        try:
            doc = msgspec.json.decode(raw)
        except msgspec.DecodeError as e:
            raise ApiError(ErrorKind.INVALID, f"the body is not valid JSON: {e}") from None
        if not isinstance(doc, dict):
            raise ApiError(ErrorKind.INVALID, "the body must be a JSON object")
        out: dict[str, str] = {}
        for k, v in doc.items():
            if v is None:
                continue
            if not isinstance(v, str | int | float | bool):
                raise ApiError(ErrorKind.INVALID, f"field {k!r} must be a string", field=k)
            out[k] = str(v) if not isinstance(v, bool) else ("true" if v else "false")
        return out
    if ctype == "application/x-www-form-urlencoded":
        try:
            pairs = parse_qsl(raw.decode("utf-8"), keep_blank_values=True, strict_parsing=True)
        except (UnicodeDecodeError, ValueError) as e:
            raise ApiError(ErrorKind.INVALID, f"the form is malformed: {e}") from None
        return dict(pairs)
    raise ApiError(ErrorKind.INVALID, "send application/json or application/x-www-form-urlencoded")


def text_field(body: dict[str, str], name: str, *, required: bool = False, limit: int = MAX_TEXT_CHARS) -> str:
    value = body.get(name, "")
    if required and not value.strip():
        raise ApiError(ErrorKind.INVALID, f"{name} is required", field=name)
    if len(value) > limit:
        raise ApiError(ErrorKind.INVALID, f"{name} is longer than {limit} characters", field=name)
    return value


def command_id_of(body: dict[str, str]) -> str:
    cid = body.get("command_id", "")
    if not cid:
        return str(uuid.uuid4())
    if not is_uuid(cid):
        raise ApiError(ErrorKind.INVALID, "command_id must be a lowercase UUID", field="command_id")
    return cid


def loop_id_of(request: Request) -> str:
    loop_id = str(request.path_params["loop_id"])
    if not is_uuid(loop_id):
        raise ApiError(ErrorKind.INVALID, f"loop id {loop_id!r} is not a lowercase UUID", field="loop_id")
    return loop_id


def integer(raw: str, name: str, *, low: int = 0, high: int = 2**63 - 1) -> int:
    """``raw`` as an integer in ``[low, high]``; anything else is an ``invalid`` naming ``name``."""
    if not _INTEGER.fullmatch(raw):
        raise ApiError(ErrorKind.INVALID, f"{name} must be an integer (ASCII digits)", field=name)
    value = int(raw)
    if not low <= value <= high:
        raise ApiError(ErrorKind.INVALID, f"{name} must be between {low} and {high}", field=name)
    return value


def int_param(request: Request, name: str, default: int, *, low: int = 0, high: int = 2**63 - 1) -> int:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    return integer(raw, name, low=low, high=high)


def parse_policy(text: str) -> dict[str, PolicyEffect]:
    try:
        return policy_rules(line for line in text.replace(",", "\n").splitlines() if line.strip())
    except ValueError as e:
        raise ApiError(ErrorKind.INVALID, f"policy wants {e}", field="policy") from None


# --- guards ---------------------------------------------------------------------------------------

Handler = Callable[[Request], Awaitable[Response]]


def api(console: Console, handler: Handler, *, mutating: bool = False) -> Handler:
    """Wrap an API handler: token and origin checks, typed errors as JSON, no stack trace ever."""

    async def wrapped(request: Request) -> Response:
        try:
            if not rules.token_ok(console.token, request.headers.get(TOKEN_HEADER)):
                given = request.headers.get(TOKEN_HEADER)
                why = "missing" if not given else "incorrect"
                raise ApiError("unauthorized", f"the console token is {why} (header X-Loopwire-Token)")
            if not rules.host_allowed(request.headers.get("host"), console.token):
                raise ApiError("forbidden", "this console (no token) answers only to 127.0.0.1 or localhost")
            if mutating and not rules.same_origin(
                request.headers.get("origin"), request.headers.get("host"), request.headers.get("sec-fetch-site")
            ):
                raise ApiError("forbidden", "cross-site requests may not change anything")
            return await handler(request)
        except ApiError as e:
            return error_json(e)
        except RemoteError as e:
            return error_json(ApiError(e.body.kind, e.body.message))
        except (JetStreamUnavailableError, JetStreamError, nats.errors.Error) as e:
            return error_json(ApiError(ErrorKind.UNAVAILABLE, f"NATS: {e}"))
        except LoopwireError as e:
            return error_json(ApiError(e.kind.value, str(e)))

    return wrapped


# --- the app --------------------------------------------------------------------------------------


def build_app(settings: Settings, *, token: str = "") -> Starlette:
    console = Console(settings=settings, token=token)
    static = static_dir()

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        from services.toolcaller.registry import ToolRegistry

        nc = await connect(settings, name="loopwire-console", max_reconnect_attempts=-1, reconnect_time_wait=0.5)
        console.nc = nc
        index = console.index = LoopIndex(nc, settings)
        registry = ToolRegistry(nc, settings.names, replicas=settings.replicas)

        async def load_registry() -> None:
            while True:
                try:
                    await registry.start()
                except (LoopwireError, nats.errors.Error, TimeoutError) as e:
                    log.warning("tool registry not available yet (%s); retrying", e)
                    await anyio.sleep(1)
                else:
                    console.registry = registry
                    return

        try:
            # The index and the registry follow as soon as JetStream has them. The console serves
            # once its index has caught up with the stored history, so a console that says it is
            # up answers (with a committer running that takes milliseconds); with no history stream
            # yet it serves after INDEX_WAIT_SECONDS anyway and says what it waits for.
            async with anyio.create_task_group() as tg:
                tg.start_soon(index.start)
                tg.start_soon(load_registry)
                with anyio.move_on_after(INDEX_WAIT_SECONDS):
                    await index.ready.wait()
                yield
                tg.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True), anyio.move_on_after(3):
                with contextlib.suppress(Exception):
                    await registry.stop()
                await index.stop()
                with contextlib.suppress(Exception):
                    await nc.close()

    # --- pages

    def page(name: str) -> Callable[[Request], Awaitable[Response]]:
        async def serve(request: Request) -> Response:
            if name == "loop":
                loop_id = str(request.path_params["loop_id"])
                if not is_uuid(loop_id):
                    return error_page(404, "No such loop", f"{loop_id!r} is not a loop id (a lowercase UUID).")
                if not rules.token_ok(console.token, request.headers.get(TOKEN_HEADER)):
                    # Without the token, the same page for every id: its own API calls (which carry the
                    # token) say whether the loop exists. A lookup here would tell anyone which ids do.
                    return HTMLResponse(page_html(name), headers={"Cache-Control": "no-store"})
                index = console.index
                if index is None or not index.following:
                    return error_page(503, "Not ready", "The console is waiting for the loops' history stream.")
                try:
                    found = await index.find(loop_id)
                except (JetStreamUnavailableError, JetStreamError, nats.errors.Error) as e:
                    return error_page(503, "NATS unavailable", str(e))
                if found is None:
                    return error_page(404, "No such loop", f"There is no loop {loop_id}.")
            return HTMLResponse(page_html(name), headers={"Cache-Control": "no-store"})

        return serve

    # --- reading

    async def list_loops(request: Request) -> Response:
        index = console.loops_index()
        state = request.query_params.get("state", "")
        if state and state not in rules.STATES:
            raise ApiError(ErrorKind.INVALID, f"state must be one of {', '.join(rules.STATES)}", field="state")
        text = request.query_params.get("q", "")[:200]
        page_no = int_param(request, "page", 1, low=1)
        size = int_param(request, "size", rules.PAGE_SIZE, low=1, high=rules.MAX_PAGE_SIZE)
        all_loops = list(index.loops.values())
        p = rules.select(all_loops, state=state, text=text, page=page_no, size=size)
        return JSONResponse(
            {
                "ok": True,
                "loops": [s.to_json() for s in p.items],
                "total": p.total,
                "page": p.page,
                "pages": p.pages,
                "counts": rules.count_states(all_loops),
                "version": index.version,
            }
        )

    async def summary_of(loop_id: str) -> rules.LoopSummary:
        s = await console.loops_index().find(loop_id)
        if s is None:
            raise ApiError(ErrorKind.NOT_FOUND, f"no loop {loop_id}")
        return s

    async def get_loop(request: Request) -> Response:
        s = await summary_of(loop_id_of(request))
        doc = s.to_json()
        # A sub-agent's gates wait in its parent's inbox: the open gates of the loop's child loops too.
        doc["open_gates"] += [rules.gate_json(g) for c in _agent_children(s.loop_id) for g in c.open_gates]
        return JSONResponse({"ok": True, "loop": doc})

    def _agent_children(loop_id: str) -> list[rules.LoopSummary]:
        """The child loops of ``loop_id``'s agent calls, theirs, and so on."""
        every = console.loops_index().loops
        found: dict[str, rules.LoopSummary] = {}
        todo = [loop_id]
        while todo:
            parent = todo.pop()
            for c in every.values():
                if c.agent_parent == parent and c.loop_id not in found and c.loop_id != loop_id:
                    found[c.loop_id] = c
                    todo.append(c.loop_id)
        return list(found.values())

    async def loop_events(request: Request) -> Response:
        loop_id = loop_id_of(request)
        s = await summary_of(loop_id)
        before = int_param(request, "before", 0)
        limit = int_param(request, "limit", EVENTS_PAGE, low=1, high=MAX_EVENTS_PAGE)
        seqs = s.seqs_before(before, limit)
        records: list[dict[str, Any]] = []
        assert console.nc is not None
        names = settings.names
        start = seqs[0] if seqs else 0
        while seqs and start <= seqs[-1]:
            # A batch stops early at its byte limit (large records): ask again from where it stopped.
            batch = await direct_get_batch(
                console.nc, names.history_stream, names.hist(loop_id), start_seq=start, batch=len(seqs) - len(records)
            )
            got = [m for m in batch.messages if m.seq <= seqs[-1]]
            if not got:
                break
            records += [record_json(m.seq, m.data) for m in got]
            start = got[-1].seq + 1
        first = s.seqs[0] if s.seqs else 0
        return JSONResponse(
            {"ok": True, "events": records, "more": bool(seqs) and seqs[0] > first, "last_seq": s.last_seq}
        )

    async def loop_event(request: Request) -> Response:
        loop_id = loop_id_of(request)
        seq = int(request.path_params["seq"])
        if not 1 <= seq < 2**63:
            raise ApiError(ErrorKind.NOT_FOUND, f"loop {loop_id} has no record at sequence {seq}")
        assert console.nc is not None
        m = await get_msg(console.nc, settings.names.history_stream, seq=seq)
        if m is None or m.subject != settings.names.hist(loop_id):
            raise ApiError(ErrorKind.NOT_FOUND, f"loop {loop_id} has no record at sequence {seq}")
        return JSONResponse({"ok": True, "seq": seq, "event": msgspec.json.decode(m.data)})

    async def list_gates(request: Request) -> Response:
        index = console.loops_index()
        loops = list(index.loops.values())
        return JSONResponse(
            {
                "ok": True,
                "gates": [rules.gate_json(g) for g in rules.open_gates(loops)],
                "resolved": [rules.gate_json(g) for g in rules.resolved_gates(loops)],
                "version": index.version,
            }
        )

    async def list_tools(request: Request) -> Response:
        registry = console.registry
        if registry is None:
            raise ApiError(ErrorKind.UNAVAILABLE, "the tool registry is not loaded yet")
        tools = [msgspec.to_builtins(t) for t in registry.live()]
        conflicts = {name: [msgspec.to_builtins(s) for s in specs] for name, specs in registry.conflicts().items()}
        return JSONResponse({"ok": True, "tools": tools, "conflicts": conflicts})

    # --- live

    async def index_stream(request: Request) -> Response:
        index = console.loops_index()

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

        return StreamingResponse(frames(), media_type="text/event-stream", headers=_SSE_HEADERS)

    async def loop_stream(request: Request) -> Response:
        loop_id = loop_id_of(request)
        await summary_of(loop_id)
        resume = request.headers.get("last-event-id")
        after = integer(resume, "Last-Event-ID") if resume else int_param(request, "after", 0)
        assert console.nc is not None
        feed = loop_feed(console.nc, settings.names, loop_id, after)
        return StreamingResponse(feed, media_type="text/event-stream", headers=_SSE_HEADERS)

    # --- actions

    async def start_loop(request: Request) -> Response:
        body = await body_of(request)
        cid = command_id_of(body)
        loop_id = body.get("loop_id") or str(uuid.uuid4())
        if not is_uuid(loop_id):
            raise ApiError(ErrorKind.INVALID, "loop_id must be a lowercase UUID", field="loop_id")
        tools_text = body.get("tools")
        tools = list(split_list(tools_text)) if tools_text else None
        default_policy = body.get("default_policy") or None
        if default_policy is not None and default_policy not in POLICY_EFFECTS:
            raise ApiError(
                ErrorKind.INVALID, f"default_policy must be one of {', '.join(POLICY_EFFECTS)}", field="default_policy"
            )
        max_iterations = body.get("max_iterations", "")
        limits = None
        if max_iterations:
            limits = Limits(max_iterations=integer(max_iterations, "max_iterations", low=1, high=1_000_000))
        res = await console.client.start(
            loop_id,
            model=body.get("model") or None,
            system=text_field(body, "system") or None,
            tools=tools,
            policy=parse_policy(body.get("policy", "")) or None,
            default_policy=cast("PolicyEffect | None", default_policy),
            limits=limits,
            command_id=cid,
        )
        seq = res.seq
        text = text_field(body, "input")
        if text.strip():
            # The first input's command id derives from the start's: a retried request sends it once.
            input_cid = str(uuid.uuid5(uuid.UUID(cid), "input"))
            seq = (await console.client.input(res.loop_id, text, command_id=input_cid)).seq
        return JSONResponse({"ok": True, "loop_id": res.loop_id, "seq": seq, "command_id": cid})

    async def fork_loop(request: Request) -> Response:
        loop_id = loop_id_of(request)
        body = await body_of(request)
        cid = command_id_of(body)
        at_text = body.get("at", "")
        at = integer(at_text, "at") if at_text else None
        text = text_field(body, "input")
        await summary_of(loop_id)
        # The new loop's id derives from the command's: a retried request makes one fork.
        res = await console.client.fork(
            loop_id,
            at=at,
            input=text if text.strip() else None,
            loop_id=str(uuid.uuid5(uuid.UUID(cid), "fork")),
            command_id=cid,
        )
        return JSONResponse({"ok": True, "loop_id": res.loop_id, "source": loop_id, "seq": res.seq, "command_id": cid})

    async def lineage(request: Request) -> Response:
        loop_id = loop_id_of(request)
        s = await summary_of(loop_id)
        children = [
            {"loop_id": c.loop_id, "link": "fork", "at": c.forked_at, "title": c.title, "state": c.state}
            for c in console.loops_index().loops.values()
            if c.parent == loop_id
        ] + [
            {
                "loop_id": c.loop_id,
                "link": "child",
                "at": 0,
                "tool": c.agent_tool,
                "call": c.agent_call,
                "title": c.title,
                "state": c.state,
            }
            for c in console.loops_index().loops.values()
            if c.agent_parent == loop_id
        ]
        return JSONResponse(
            {
                "ok": True,
                "loop_id": loop_id,
                "parent": s.parent or None,
                "forked_at": s.forked_at or None,
                "agent_parent": s.agent_parent or None,
                "agent_tool": s.agent_tool or None,
                "children": sorted(children, key=lambda c: (c["at"], c["loop_id"])),
                "points": s.fork_points.points,
            }
        )

    async def send_input(request: Request) -> Response:
        loop_id = loop_id_of(request)
        body = await body_of(request)
        cid = command_id_of(body)
        text = text_field(body, "text", required=True)
        await summary_of(loop_id)
        res = await console.client.input(loop_id, text, command_id=cid)
        return JSONResponse({"ok": True, "loop_id": loop_id, "seq": res.seq, "command_id": cid})

    async def answer_gate(request: Request) -> Response:
        loop_id = loop_id_of(request)
        body = await body_of(request)
        cid = command_id_of(body)
        gate_id = text_field(body, "gate_id", required=True)
        if not is_uuid(gate_id):
            raise ApiError(ErrorKind.INVALID, f"gate id {gate_id!r} is not a lowercase UUID", field="gate_id")
        action = text_field(body, "action", required=True)
        operator = text_field(body, "operator", limit=MAX_OPERATOR_CHARS).strip()
        s = await summary_of(loop_id)
        if gate_id not in s.gates:
            raise ApiError(ErrorKind.NOT_FOUND, f"loop {loop_id} has no gate {gate_id}")
        try:
            res = await console.client.answer(
                loop_id,
                gate_id,
                cast("AnswerAction", action),  # checked by the loop API
                text=text_field(body, "text"),
                reason=text_field(body, "reason"),
                resolver=operator,
                command_id=cid,
            )
        except RemoteError as e:
            if e.body.kind != ErrorKind.CLOSED:
                raise
            # Someone answered first: say who and when (the index may be a moment behind the committer).
            gv = s.gates[gate_id]
            with anyio.move_on_after(2):
                while not gv.resolved and s.open_turn == gv.turn_id:
                    await console.loops_index().wait_changed(console.loops_index().version, 0.1)
            raise ApiError(
                "already_answered",
                rules.already_answered(gv),
                gate=rules.gate_json(gv),
            ) from None
        return JSONResponse({"ok": True, "loop_id": loop_id, "gate_id": gate_id, "seq": res.seq, "command_id": cid})

    def loop_verb(verb: str) -> Handler:
        async def run(request: Request) -> Response:
            loop_id = loop_id_of(request)
            body = await body_of(request)
            cid = command_id_of(body)
            await summary_of(loop_id)
            client = console.client
            res = await (client.interrupt if verb == "interrupt" else client.close)(loop_id, command_id=cid)
            return JSONResponse({"ok": True, "loop_id": loop_id, "seq": res.seq, "command_id": cid})

        return run

    async def whoami(request: Request) -> Response:
        return JSONResponse({"ok": True, "prefix": settings.prefix, "token_required": bool(console.token)})

    def r(path: str, handler: Handler, methods: list[str] | None = None, *, mutating: bool = False) -> Route:
        return Route(path, api(console, handler, mutating=mutating), methods=methods or ["GET"])

    routes = [
        Route("/", page("loops")),
        Route("/loops/{loop_id}", page("loop")),
        Route("/gates", page("gates")),
        Route("/tools", page("tools")),
        r("/api/info", whoami),
        r("/api/loops", list_loops),
        r("/api/loops", start_loop, ["POST"], mutating=True),
        r("/api/stream", index_stream),
        r("/api/gates", list_gates),
        r("/api/tools", list_tools),
        r("/api/loops/{loop_id}", get_loop),
        r("/api/loops/{loop_id}/events", loop_events),
        r("/api/loops/{loop_id}/events/{seq:int}", loop_event),
        r("/api/loops/{loop_id}/stream", loop_stream),
        r("/api/loops/{loop_id}/input", send_input, ["POST"], mutating=True),
        r("/api/loops/{loop_id}/answer", answer_gate, ["POST"], mutating=True),
        r("/api/loops/{loop_id}/interrupt", loop_verb("interrupt"), ["POST"], mutating=True),
        r("/api/loops/{loop_id}/close", loop_verb("close"), ["POST"], mutating=True),
        r("/api/loops/{loop_id}/fork", fork_loop, ["POST"], mutating=True),
        r("/api/loops/{loop_id}/lineage", lineage),
        Mount("/static", app=StaticFiles(directory=static), name="static"),
    ]

    async def http_error(request: Request, exc: Exception) -> Response:
        status = exc.status_code if isinstance(exc, HTTPException) else 500
        if status == 500:
            log.error("unexpected error on %s %s", request.method, request.url.path, exc_info=exc)
        message = {404: "no such page", 405: "method not allowed"}.get(status, "the console failed to answer")
        if request.url.path.startswith("/api/"):
            kind = {404: ErrorKind.NOT_FOUND.value, 500: "internal"}.get(status, ErrorKind.INVALID.value)
            return JSONResponse({"ok": False, "error": {"kind": kind, "message": message}}, status_code=status)
        return error_page(status, message.capitalize(), f"{request.method} {request.url.path}: {message}.")

    return Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={HTTPException: http_error, Exception: http_error},
    )


_SSE_HEADERS: Final = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
