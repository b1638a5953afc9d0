"""The commands on loops: start, send, interrupt, close, and loops (the list)."""

from __future__ import annotations

import argparse
import sys
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, Final

import anyio
import msgspec
from rich import box
from rich.table import Table

from services.cli.budgets import budget_from_args, budget_json, count_range
from services.cli.contextopts import context_from_args
from services.cli.errors import CliError
from services.cli.folds import fold_loop, loop_state
from services.cli.ids import loop_ref, require_uuid, resolve_loop
from services.cli.output import cells, make_console, out
from services.cli.policyopts import parse_policy, parse_retries
from services.cli.render import clip, describe, json_line, short
from services.cli.session import session
from services.cli.valuechecks import checked_model, model_from_env, require_live_tools
from services.toolwire.spec import valid_tool_name
from shared.client import LoopClient
from shared.events import Event, Limits, PermissionRequested, TurnDone, TurnFailed, UserInputRequested
from shared.modelspec import model_id
from shared.replay import loops
from shared.settings import Settings, split_list
from shared.turns import wait_for_turn
from shared.wiretypes import MAX_LIMIT_COUNT, MAX_LIMIT_VALUE


async def cmd_start(args: argparse.Namespace, settings: Settings) -> int:
    loop_id = require_uuid(args.loop_id, "--loop-id") if args.loop_id else str(uuid.uuid4())
    policy = parse_policy(args.policy or [])
    tools = list(split_list(args.tools)) if args.tools is not None else None
    model = checked_model(args.model, "--model") if args.model is not None else model_from_env(settings)
    for name in tools or ():
        if not valid_tool_name(name):
            raise CliError(f"--tools: {name!r} is not a tool name (1 to 64 of A-Z a-z 0-9 _ -)")
    limits = None
    if args.max_tokens is not None and not 0 <= args.max_tokens <= MAX_LIMIT_COUNT:
        raise CliError(f"--max-tokens: {count_range(args.max_tokens)}")
    if args.max_iterations is not None and not 1 <= args.max_iterations <= MAX_LIMIT_VALUE:
        raise CliError(f"--max-iterations: {count_range(args.max_iterations, 1, MAX_LIMIT_VALUE)}")
    if args.max_iterations is not None or args.max_tokens is not None:
        limits = Limits(
            max_iterations=args.max_iterations if args.max_iterations is not None else Limits().max_iterations,
            max_tokens=args.max_tokens or 0,
        )
    # Checked before connecting: a bad option is refused the same whether a deployment runs or not.
    budget, context = budget_from_args(args, None), context_from_args(args)
    async with session(settings) as nc:
        if tools:
            await require_live_tools(nc, settings, tools, "--tools")
        res = await LoopClient(nc, settings.names).start(
            loop_id,
            model=model,
            system=args.system,
            tools=tools,
            policy=policy or None,
            default_policy=args.default_policy,
            limits=limits,
            on_unknown=args.on_unknown,
            retries=parse_retries(args.retry or []) or None,
            budget=budget,
            context=context,
        )
    if args.json:
        out(json_line({"loop_id": res.loop_id, "seq": res.seq, "command_id": res.command_id}))
    else:
        out(res.loop_id)
    return 0


async def cmd_send(args: argparse.Namespace, settings: Settings) -> int:
    ref = loop_ref(args.loop, "LOOP")
    text = args.text
    if text == "-":  # as CLIs do: the text from standard input (a piped file keeps its lines, not its last newline)
        text = sys.stdin.read().rstrip("\n")
        if not text.strip():
            raise CliError("TEXT must not be empty (standard input held none)")
    if not text.strip():
        raise CliError("TEXT must not be empty")
    async with session(settings) as nc:
        names = settings.names
        loop_id = await resolve_loop(nc, settings, ref)
        res = await LoopClient(nc, names).input(loop_id, text)
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


# The model column's width in `loopwire loops`: with the loop id and the other columns the table
# fits 80 columns (a scripted model shows as its file's name, see model_id).
MODEL_COLUMN: Final = 22


async def cmd_loops(args: argparse.Namespace, settings: Settings) -> int:
    async with session(settings) as nc:
        rows = []
        for loop_id in await loops(nc, settings.names):
            h, _ = await fold_loop(nc, settings.names, loop_id)
            rows.append(h)
    # Most recently active first, by the last record's time (each shard's stream numbers its own records).
    rows.sort(key=lambda h: (h.last_at, h.last_seq), reverse=True)
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
            *cells(
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
