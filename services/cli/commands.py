"""The client commands of ``loopwire``: each one connects, does its work over NATS and prints.

Every command raises :class:`CliError` for anything the user should read as a one-line reason;
``services.cli.app`` prints it as ``error: ...`` and exits 1.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Final

import anyio
import msgspec
import nats.errors
import nats.js.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import api
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from services.cli.budgets import budget_from_args, budget_gate_text, budget_json
from services.cli.contextopts import context_from_args
from services.cli.errors import CliError
from services.cli.render import clip, clock_of, describe, event_json, json_line, short
from services.lifecycle import close_quietly, raise_single
from services.model_step.policy import parse_policy as policy_rules
from services.toolwire.spec import ToolSpec, valid_tool_name
from shared.bus import JetStreamError, JetStreamUnavailableError, connect
from shared.client import LoopClient
from shared.codec import decode_event, decode_live_frame
from shared.errors import LoopwireError
from shared.events import (
    Event,
    Limits,
    PermissionRequested,
    RetryPolicy,
    TokenDelta,
    TurnDone,
    TurnFailed,
    UserInputRequested,
)
from shared.forking import descendants, origins
from shared.history import LoopHistory, loops, replay
from shared.modelspec import model_id, spec_problem
from shared.protocol import RemoteError
from shared.settings import Settings, split_list
from shared.subjects import Names
from shared.turns import TurnTracker, follow, wait_for_turn
from shared.validate import is_uuid
from shared.wiretypes import AnswerAction, PolicyEffect

__all__ = ["CliError", "TurnTracker", "open_nats", "session", "wait_for_turn"]

CONNECT_ATTEMPTS: Final = 2
DEFAULT_WAIT_SECONDS: Final = 300.0


# --- connecting and running ---------------------------------------------------------------------


NO_DEPLOYMENT_HINT: Final = "`loopwire up` starts a deployment and prints the URL to set as LW_NATS_URL"


def _reason(e: BaseException | None) -> str:
    if e is None:
        return "no server answered"
    if isinstance(e, ConnectionRefusedError):
        return "connection refused"
    if isinstance(e, nats.errors.AuthorizationError) or "authorization" in str(e).lower():
        return "authorization violation: check LW_NATS_USER / LW_NATS_PASSWORD / LW_NATS_CREDS"
    if isinstance(e, TimeoutError | nats.errors.TimeoutError):
        return "timed out"
    text = str(e) or type(e).__name__
    return clip(text, 120)


async def open_nats(settings: Settings, *, name: str = "loopwire-cli") -> NATS:
    """Connect, or raise ``CliError("cannot connect to NATS at <url> (<why>)")`` within a few seconds."""
    seen: list[BaseException] = []

    async def on_error(e: Exception) -> None:
        seen.append(e)

    try:
        return await connect(
            settings,
            name=name,
            max_reconnect_attempts=CONNECT_ATTEMPTS - 1,
            reconnect_time_wait=0.2,
            error_cb=on_error,
        )
    except (OSError, nats.errors.Error, TimeoutError) as e:
        cause = next((x for x in reversed(seen) if not isinstance(x, nats.errors.NoServersError)), e)
        where = ",".join(settings.nats_urls)
        raise CliError(f"cannot connect to NATS at {where} ({_reason(cause)}); {NO_DEPLOYMENT_HINT}") from None


@contextlib.asynccontextmanager
async def session(settings: Settings) -> AsyncIterator[NATS]:
    """A connection for one command; remote and JetStream failures become :class:`CliError`."""
    nc = await open_nats(settings)
    try:
        try:
            await _require_deployment(nc, settings)
            yield nc
        except BaseExceptionGroup as group:
            raise_single(group)  # one failure of a command's tasks reads as itself
    except CliError:
        raise  # already one line; the LoopwireError clause below would wrap it again
    except RemoteError as e:
        raise CliError(f"{e.body.kind}: {e.body.message}") from None
    except (JetStreamUnavailableError, JetStreamError) as e:
        raise CliError(f"cannot read from JetStream: {e}") from None
    except LoopwireError as e:
        raise CliError(str(e)) from None
    except nats.errors.Error as e:
        raise CliError(f"NATS: {_reason(e)}") from None
    finally:
        await close_quietly(nc, within=2)


async def _require_deployment(nc: NATS, settings: Settings) -> None:
    """A clear error when the server holds no loopwire deployment (no history stream, or no JetStream
    at all), instead of "no loops yet" or a failed read. Anything else (say, no permission to ask)
    leaves the command to go on and report what it meets."""
    stream = settings.names.history_stream
    where = ",".join(settings.nats_urls)
    try:
        await nc.jetstream(timeout=5).stream_info(stream)
    except nats.js.errors.NotFoundError:
        why = f"no stream {stream}; another LW_PREFIX?"
    except (nats.js.errors.ServiceUnavailableError, nats.errors.NoRespondersError):
        why = "JetStream is not enabled on that server"
    except (nats.errors.Error, TimeoutError):
        return
    else:
        return
    raise CliError(f"no loopwire deployment at {where} ({why}); {NO_DEPLOYMENT_HINT}")


def require_uuid(value: str, what: str) -> str:
    """``value`` as a canonical (lowercase) UUID; any case is taken, as ids are copied from anywhere."""
    lowered = value.strip().lower()
    if not is_uuid(lowered):
        raise CliError(f"{what} must be a UUID, got {value!r}")
    return lowered


_ID_PREFIX: Final = re.compile(r"[0-9a-f][0-9a-f-]{3,35}")


def loop_ref(value: str, what: str) -> str:
    """A loop id as the user gave it, checked: a UUID or a unique prefix of one (at least 4 characters,
    as tables show the first 8), any case. :func:`resolve_loop` finds the loop a prefix names."""
    lowered = value.strip().lower()
    if is_uuid(lowered) or _ID_PREFIX.fullmatch(lowered):
        return lowered
    raise CliError(f"{what} must be a loop id or the start of one (4+ of 0-9 a-f), got {value!r}")


async def resolve_loop(nc: NATS, settings: Settings, ref: str, what: str = "LOOP") -> str:
    """The loop id ``ref`` names: itself when whole, else the one loop whose id starts with it."""
    if is_uuid(ref):
        return ref
    found = [loop_id for loop_id in await loops(nc, settings.names) if loop_id.startswith(ref)]
    if not found:
        raise CliError(f"{what}: no loop id starts with {ref!r} (loopwire loops lists them)")
    if len(found) > 1:
        some = ", ".join(short(x) for x in found[:4]) + (", ..." if len(found) > 4 else "")
        raise CliError(f"{what}: {len(found)} loop ids start with {ref!r} ({some}): give more of it")
    return found[0]


def make_console() -> Console:
    # Off a terminal rich assumes 80 columns; history tables read better wider.
    wide = not sys.stdout.isatty() and not os.environ.get("COLUMNS")
    return Console(highlight=False, soft_wrap=False, width=120 if wide else None)


def _cells(*values: str) -> list[Text]:
    """Table cells as plain text: never parsed as rich markup (model text contains [brackets])."""
    return [Text(v) for v in values]


def out(line: str) -> None:
    print(line, flush=True)


# --- reading loops ------------------------------------------------------------------------------


@dataclass
class GateInfo:
    loop_id: str
    gate_id: str
    kind: str
    tool_name: str
    text: str = ""
    choices: list[str] = field(default_factory=list)
    opened_seq: int = 0
    parent: str = ""  # a sub-agent's child loop: the parent loop it runs for


async def fold_loop(nc: NATS, names: Names, loop_id: str) -> tuple[LoopHistory, dict[str, tuple[str, list[str]]]]:
    """The fold of a loop plus, per gate id, its summary/question and choices."""
    h = LoopHistory(loop_id=loop_id)
    texts: dict[str, tuple[str, list[str]]] = {}
    async for seq, e in replay(nc, loop_id, names=names):
        h.apply(e, seq)
        if isinstance(e, PermissionRequested):
            texts[e.request.gate_id] = (e.request.summary, [])
        elif isinstance(e, UserInputRequested):
            texts[e.gate_id] = (e.question, list(e.choices))
    return h, texts


def gates_of(h: LoopHistory, texts: dict[str, tuple[str, list[str]]]) -> list[GateInfo]:
    out_: list[GateInfo] = []
    for g in h.open_gates:
        text, choices = texts.get(g.gate.id, ("", []))
        if g.gate.kind == "budget":
            text = budget_gate_text(h)
        out_.append(
            GateInfo(
                loop_id=h.loop_id,
                gate_id=g.gate.id,
                kind=g.gate.kind,
                tool_name=g.gate.tool_name,
                text=text,
                choices=choices,
                opened_seq=g.opened_seq,
                parent=h.config.parent.loop_id if h.config is not None and h.config.parent is not None else "",
            )
        )
    return out_


def loop_state(h: LoopHistory) -> str:
    if h.forming:
        return "forming (repeat the fork to finish)"
    if h.closed:
        return "closed"
    if h.open_gates:
        return f"waiting at {len(h.open_gates)} gate(s)"
    if h.open_turn is not None:
        return f"turn {h.open_turn.turn_index} running"
    if h.pending_inputs:
        return "input pending"
    return "idle"


async def find_gate_loop(nc: NATS, names: Names, gate_id: str) -> str:
    """The loop that has gate ``gate_id`` (open ones first)."""
    resolved_in = ""
    for loop_id in await loops(nc, names):
        h, _ = await fold_loop(nc, names, loop_id)
        if h.gate_is_open(gate_id):
            return loop_id
        if gate_id in h.gates:
            resolved_in = loop_id
    if resolved_in:
        return resolved_in  # the committer answers that the gate is closed
    raise CliError(f"no loop has a gate {gate_id} (give --loop if it is new)")


# --- commands -----------------------------------------------------------------------------------


def parse_policy(items: list[str]) -> dict[str, PolicyEffect]:
    try:
        return policy_rules(items)
    except ValueError as e:
        raise CliError(f"--policy wants {e}") from None


def safety_of(spec: ToolSpec) -> str:
    """The safety annotations as shown by ``loopwire tools`` (unannotated: may have side effects)."""
    marks = [
        label
        for label, on in (
            ("read-only", spec.read_only),
            ("idempotent", spec.idempotent),
            ("destructive", spec.destructive),
            ("open-world", spec.open_world),
        )
        if on
    ]
    return ", ".join(marks) or "-"


def parse_retries(items: list[str]) -> dict[str, RetryPolicy]:
    """``TOOL=N[:INITIAL[:MAX]]`` → per-tool retry policies (attempts, backoff seconds)."""
    out: dict[str, RetryPolicy] = {}
    for item in items:
        tool_name, sep, spec = item.partition("=")
        parts = spec.split(":")
        try:
            if not sep or not valid_tool_name(tool_name) or not 1 <= len(parts) <= 3:
                raise ValueError
            attempts = int(parts[0])
            initial = float(parts[1]) if len(parts) > 1 else RetryPolicy().initial_backoff_seconds
            biggest = float(parts[2]) if len(parts) > 2 else max(initial, RetryPolicy().max_backoff_seconds)
            if not 1 <= attempts <= 100 or not 0 <= initial <= biggest <= 3600:
                raise ValueError
        except ValueError:
            raise CliError(
                f"--retry wants TOOL=N[:INITIAL[:MAX]] (1 ≤ N ≤ 100, 0 ≤ INITIAL ≤ MAX ≤ 3600 s), got {item!r}"
            ) from None
        out[tool_name] = RetryPolicy(
            max_attempts=attempts, initial_backoff_seconds=initial, max_backoff_seconds=biggest
        )
    return out


async def _require_live_tools(nc: NATS, settings: Settings, names: list[str]) -> None:
    """Every tool ``names`` lists has a live worker: a misspelt name is an error, not a loop without it."""
    from services.toolcaller.registry import ToolRegistry

    async with ToolRegistry(nc, settings.names, replicas=settings.replicas) as registry:
        missing = [n for n in names if registry.get(n) is None]
        live = [t.name for t in registry.live()]
    if missing:
        known = ", ".join(live) if live else "none"
        raise CliError(f"--tools: no live tool named {', '.join(missing)} (live: {known}; loopwire tools lists them)")


async def cmd_start(args: argparse.Namespace, settings: Settings) -> int:
    loop_id = require_uuid(args.loop_id, "--loop-id") if args.loop_id else str(uuid.uuid4())
    policy = parse_policy(args.policy or [])
    tools = list(split_list(args.tools)) if args.tools is not None else None
    if args.model and (problem := spec_problem(args.model)):
        raise CliError(f"--model: {problem}")
    for name in tools or ():
        if not valid_tool_name(name):
            raise CliError(f"--tools: {name!r} is not a tool name (1 to 64 of A-Z a-z 0-9 _ -)")
    limits = None
    if args.max_iterations is not None or args.max_tokens is not None:
        limits = Limits(
            max_iterations=args.max_iterations if args.max_iterations is not None else Limits().max_iterations,
            max_tokens=args.max_tokens or 0,
        )
    async with session(settings) as nc:
        if tools:
            await _require_live_tools(nc, settings, tools)
        res = await LoopClient(nc, settings.names).start(
            loop_id,
            model=args.model,
            system=args.system,
            tools=tools,
            policy=policy or None,
            default_policy=args.default_policy,
            limits=limits,
            on_unknown=args.on_unknown,
            retries=parse_retries(args.retry or []) or None,
            budget=budget_from_args(args, None),
            context=context_from_args(args),
        )
    if args.json:
        out(json_line({"loop_id": res.loop_id, "seq": res.seq, "command_id": res.command_id}))
    else:
        out(res.loop_id)
    return 0


async def cmd_send(args: argparse.Namespace, settings: Settings) -> int:
    ref = loop_ref(args.loop, "LOOP")
    if not args.text.strip():
        raise CliError("TEXT must not be empty")
    async with session(settings) as nc:
        names = settings.names
        loop_id = await resolve_loop(nc, settings, ref)
        res = await LoopClient(nc, names).input(loop_id, args.text)
        if not args.wait:
            if args.json:
                out(json_line({"loop_id": loop_id, "seq": res.seq, "command_id": res.command_id}))
            else:
                out(f"input accepted at seq {res.seq}")
            return 0

        def on_event(e: Event, seq: int) -> None:
            if isinstance(e, PermissionRequested | UserInputRequested):
                verb = "approve (or deny)" if isinstance(e, PermissionRequested) else "reply"
                gid = e.request.gate_id if isinstance(e, PermissionRequested) else e.gate_id
                print(f"waiting at a gate: {describe(e)} — loopwire {verb} {gid}", file=sys.stderr, flush=True)

        try:
            with anyio.fail_after(args.timeout):
                result = await wait_for_turn(nc, names, loop_id, res.command_id, res.seq, on_event=on_event)
        except TimeoutError:
            raise CliError(f"the turn did not end within {args.timeout:g} s (it goes on; see loopwire tail)") from None
    if args.json:
        usage = result.event.usage if isinstance(result.event, TurnDone) else None
        body: dict[str, Any] = {
            "loop_id": loop_id,
            "turn_id": result.turn_id,
            "outcome": result.outcome,
            "answer": result.answer,
            "seq": result.seq,
            "usage": msgspec.to_builtins(usage) if usage is not None else None,
        }
        if isinstance(result.event, TurnFailed):
            body["error"] = {"kind": result.event.err.kind, "message": result.event.err.message}
        out(json_line(body))
        return 0 if result.outcome == "done" else 1
    if result.outcome == "done":
        out(result.answer)
        return 0
    if result.answer:
        out(result.answer)
    detail = describe(result.event) if result.event is not None else result.outcome
    raise CliError(f"turn {result.outcome}: {detail}")


async def cmd_history(args: argparse.Namespace, settings: Settings) -> int:
    ref = loop_ref(args.loop, "LOOP")
    async with session(settings) as nc:
        loop_id = await resolve_loop(nc, settings, ref)
        records = [r async for r in replay(nc, loop_id, names=settings.names, from_seq=args.from_seq)]
    if not records and args.from_seq <= 1:
        raise CliError(f"loop {loop_id} has no history (unknown loop?)")
    if args.json:
        for seq, e in records:
            out(event_json(e, seq))
        return 0
    print_history(make_console(), records, title=f"history of loop {loop_id}")
    return 0


def print_history(console: Console, records: list[tuple[int, Event]], *, title: str = "") -> None:
    table = Table(title=title or None, show_lines=False, expand=False)
    table.add_column("seq", justify="right", style="dim")
    table.add_column("time", style="dim", no_wrap=True)
    table.add_column("event", style="bold", no_wrap=True)
    table.add_column("turn/step", style="dim", no_wrap=True)
    table.add_column("details", overflow="fold")
    for seq, e in records:
        where = "/".join(short(x) for x in (e.turn_id, e.step_id) if x)
        table.add_row(
            str(seq), clock_of(e.created_at), type(e).__name__, where, Text(describe(e, limit=240, multiline=True))
        )
    console.print(table)


async def cmd_tail(args: argparse.Namespace, settings: Settings) -> int:
    names = settings.names
    ref = loop_ref(args.loop, "LOOP") if args.loop else ""
    send, receive = anyio.create_memory_object_stream[tuple[int | None, Event]](4096)

    async def on_live(msg: Msg) -> None:
        with contextlib.suppress(LoopwireError, anyio.WouldBlock):
            for e in decode_live_frame(msg.data):
                send.send_nowait((None, e))

    async with session(settings) as nc:
        loop_id = await resolve_loop(nc, settings, ref) if ref else ""
        await nc.subscribe(names.live(loop_id) if loop_id else names.live_all, cb=on_live)

        async def follow_one() -> None:
            start = args.from_seq if args.from_seq is not None else 1
            if args.new:
                h, _ = await fold_loop(nc, names, loop_id)
                start = h.last_seq + 1
            async with follow(nc, names, loop_id, start) as it:
                async for seq, e in it:
                    await send.send((seq, e))

        async def follow_all() -> None:
            js = nc.jetstream()
            if args.from_seq is not None:
                config = api.ConsumerConfig(
                    deliver_policy=api.DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=args.from_seq
                )
            else:
                config = api.ConsumerConfig(deliver_policy=api.DeliverPolicy.NEW)
            sub = await js.subscribe(names.hist_all, stream=names.history_stream, ordered_consumer=True, config=config)
            try:
                async for m in sub.messages:
                    with contextlib.suppress(LoopwireError):
                        await send.send((m.metadata.sequence.stream, decode_event(m.data)))
            finally:
                with contextlib.suppress(Exception):
                    await sub.unsubscribe()

        async with anyio.create_task_group() as tg:
            tg.start_soon(_cancel_on_interrupt, tg.cancel_scope)
            tg.start_soon(follow_one if loop_id else follow_all)
            await nc.flush(timeout=5)  # the live subscription is in place before we say so
            what = f"loop {loop_id}" if loop_id else "every loop"
            print(f"following {what} (Ctrl-C to stop)", file=sys.stderr, flush=True)
            async for seq, e in receive:
                if isinstance(e, TokenDelta) and args.no_tokens:
                    continue
                if args.json:
                    out(event_json(e, seq))
                    continue
                where = "" if loop_id else f"{short(e.loop_id)} "
                mark = f"{seq:>5}" if seq is not None else "  ~  "
                when = clock_of(e.created_at) or " " * 12
                out(f"{mark} {when} {where}{type(e).__name__:<18} {describe(e)}")
    return 0


async def _cancel_on_interrupt(scope: anyio.CancelScope) -> None:
    """Ctrl-C (or SIGTERM) ends ``scope``. asyncio's own Ctrl-C handling cancels the main task
    once, and a library's ``wait_for`` racing that cancellation can lose it (the command then
    never stops); an anyio scope's cancellation is delivered again until it is honoured."""
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for _ in signals:
            scope.cancel()
            return


# The model column's width in `loopwire loops`: with the loop id and the other columns the table
# fits 80 columns (a scripted model shows as its file's name, see model_id).
MODEL_COLUMN: Final = 22


async def cmd_loops(args: argparse.Namespace, settings: Settings) -> int:
    async with session(settings) as nc:
        rows = []
        for loop_id in await loops(nc, settings.names):
            h, _ = await fold_loop(nc, settings.names, loop_id)
            rows.append(h)
    # Most recently active first: a loop's last record has the stream's highest sequence of its records.
    rows.sort(key=lambda h: h.last_seq, reverse=True)
    if args.json:
        for h in rows:
            out(
                json_line(
                    {
                        "loop_id": h.loop_id,
                        "model": h.config.model if h.config else "",
                        "turns": h.turns,
                        "state": loop_state(h),
                        "last_seq": h.last_seq,
                        "started_at": h.config.created_at if h.config else "",
                        "open_gates": [g.gate.id for g in h.open_gates],
                        "parent": h.forked.source_loop_id if h.forked else None,
                        "forked_at": h.forked.source_seq if h.forked else None,
                        # A sub-agent's child loop: the loop and tool whose call runs it.
                        "agent_parent": h.config.parent.loop_id if h.config and h.config.parent else None,
                        "agent_tool": h.config.parent.tool_name if h.config and h.config.parent else None,
                        **budget_json(h),
                    }
                )
            )
        return 0
    if not rows:
        out("no loops yet (loopwire start)")
        return 0
    # Short ids (every command takes a unique prefix) and no vertical rules: 80 columns hold it.
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True, show_edge=False)
    for col in ("loop", "model", "turns", "state", "seq", "started", "parent"):
        table.add_column(col, no_wrap=True, overflow="ellipsis", max_width=MODEL_COLUMN if col == "model" else None)
    for h in rows:
        started = h.config.created_at[5:16].replace("T", " ") if h.config else ""
        parent = f"{short(h.forked.source_loop_id)}@{h.forked.source_seq}" if h.forked else ""
        table.add_row(
            *_cells(
                short(h.loop_id),
                clip(model_id(h.config.model), MODEL_COLUMN) if h.config else "",
                str(h.turns),
                loop_state(h),
                str(h.last_seq),
                started,
                parent,
            )
        )
    make_console().print(table)
    return 0


async def cmd_gates(args: argparse.Namespace, settings: Settings) -> int:
    found: list[GateInfo] = []
    async with session(settings) as nc:
        if args.loop:
            target = await resolve_loop(nc, settings, loop_ref(args.loop, "LOOP"))
            # A sub-agent's gates wait in its parent's inbox: the loop's child loops are listed too.
            ids = [target, *descendants(await origins(nc, settings.names, await loops(nc, settings.names)), target)]
        else:
            ids = await loops(nc, settings.names)
        for loop_id in ids:
            h, texts = await fold_loop(nc, settings.names, loop_id)
            found.extend(gates_of(h, texts))
    if args.json:
        for g in found:
            out(
                json_line(
                    {
                        "gate_id": g.gate_id,
                        "loop_id": g.loop_id,
                        "kind": g.kind,
                        "tool": g.tool_name,
                        "text": g.text,
                        "choices": g.choices,
                        "opened_seq": g.opened_seq,
                        "parent": g.parent or None,
                    }
                )
            )
        return 0
    if not found:
        out("no open gates")
        return 0
    table = Table()
    for col in ("gate", "loop", "kind", "tool", "summary / question"):
        table.add_column(col, no_wrap=col in ("gate", "loop", "kind"), overflow="fold")
    for g in found:
        text = g.text + (f"  [{', '.join(g.choices)}]" if g.choices else "")
        where = short(g.loop_id) + (f" (child of {short(g.parent)})" if g.parent else "")
        table.add_row(*_cells(g.gate_id, where, g.kind, g.tool_name, text))
    make_console().print(table)
    return 0


async def _answer(
    args: argparse.Namespace, settings: Settings, action: AnswerAction, *, text: str = "", reason: str = ""
) -> int:
    gate_id = require_uuid(args.gate, "GATE")
    async with session(settings) as nc:
        names = settings.names
        if args.loop:
            loop_id = await resolve_loop(nc, settings, loop_ref(args.loop, "--loop"), "--loop")
        else:
            loop_id = await find_gate_loop(nc, names, gate_id)
        res = await LoopClient(nc, names).answer(loop_id, gate_id, action, text=text, reason=reason)
    if args.json:
        out(json_line({"loop_id": loop_id, "gate_id": gate_id, "action": action, "seq": res.seq}))
    else:
        out(f"gate {gate_id} of loop {loop_id}: {action} (seq {res.seq})")
    return 0


async def cmd_approve(args: argparse.Namespace, settings: Settings) -> int:
    return await _answer(args, settings, "approve_always" if args.always else "approve")


async def cmd_deny(args: argparse.Namespace, settings: Settings) -> int:
    return await _answer(args, settings, "deny", reason=args.reason or "")


async def cmd_reply(args: argparse.Namespace, settings: Settings) -> int:
    if not args.text.strip():
        raise CliError("TEXT must not be empty")
    return await _answer(args, settings, "reply", text=args.text)


async def _loop_verb(args: argparse.Namespace, settings: Settings, verb: str) -> int:
    ref = loop_ref(args.loop, "LOOP")
    async with session(settings) as nc:
        loop_id = await resolve_loop(nc, settings, ref)
        client = LoopClient(nc, settings.names)
        call: Callable[[str], Awaitable[Any]] = client.interrupt if verb == "interrupt" else client.close
        res = await call(loop_id)
    if args.json:
        out(json_line({"loop_id": loop_id, "seq": res.seq}))
    else:
        out(f"{verb}: loop {loop_id} (seq {res.seq})")
    return 0


async def cmd_interrupt(args: argparse.Namespace, settings: Settings) -> int:
    return await _loop_verb(args, settings, "interrupt")


async def cmd_close(args: argparse.Namespace, settings: Settings) -> int:
    return await _loop_verb(args, settings, "close")


def _arguments(schema: dict[str, Any]) -> str:
    props = schema.get("properties") or {}
    required = set(schema.get("required") or [])
    parts = []
    for name, spec in props.items():
        kind = "any"
        if isinstance(spec, dict):
            enum = spec.get("enum")
            kind = "|".join(map(str, enum)) if isinstance(enum, list) else str(spec.get("type", "any"))
        parts.append(f"{name}{'' if name in required else '?'}: {kind}")
    return ", ".join(parts)


async def cmd_tools(args: argparse.Namespace, settings: Settings) -> int:
    from services.toolcaller.registry import ToolRegistry

    async with session(settings) as nc:
        registry = ToolRegistry(nc, settings.names, replicas=settings.replicas)
        await registry.start()
        try:
            live = registry.live()
            conflicts = registry.conflicts()
        finally:
            await registry.stop()
    if args.json:
        for t in live:
            out(msgspec.json.encode(t).decode())
        for name, specs in conflicts.items():
            out(json_line({"name": name, "conflict": [msgspec.to_builtins(s) for s in specs]}))
        return 0
    if not live and not conflicts:
        out("no live tools (start one: loopwire serve tool calculator)")
        return 0
    table = Table()
    for col in ("tool", "replicas", "kind", "version", "safety", "source", "arguments", "description"):
        table.add_column(col, no_wrap=col in ("tool", "replicas", "kind", "source"), overflow="fold")
    for t in live:
        # source: the MCP server behind a bridged tool ("-" for SDK tools); "down" while it restarts.
        source = (t.source or "-") + ("" if t.healthy else " (down)")
        table.add_row(
            *_cells(
                t.name,
                str(t.replicas),
                t.kind,
                t.version,
                safety_of(t),
                source,
                _arguments(t.input_schema),
                clip(t.description, 60),
            )
        )
    for name, specs in conflicts.items():
        table.add_row(*_cells(name, "-", "", "conflict", "", "", "", ", ".join(sorted(s.version for s in specs))))
    make_console().print(table)
    return 0
