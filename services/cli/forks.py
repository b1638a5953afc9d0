"""``loopwire fork``, ``lineage`` and ``diff``: branch a loop, show its fork tree, compare two branches."""

from __future__ import annotations

import argparse
from typing import Any, cast

from rich.table import Table
from rich.text import Text

from services.cli.errors import CliError
from services.cli.ids import loop_ref, require_uuid, resolve_loop
from services.cli.output import make_console, out
from services.cli.policyopts import parse_policy
from services.cli.render import clip, describe, json_line
from services.cli.session import session
from services.cli.valuechecks import checked_model
from shared.events import Event, LoopForked, ParentRef
from shared.forking import common_prefix, content_of, conversation, origins
from shared.replay import loops, replay
from shared.settings import Settings
from shared.wiretypes import REEXECUTIONS, Reexecution


def parse_reexecution(items: list[str]) -> dict[str, Reexecution]:
    """``TOOL=reuse|rerun|ask`` items (TOOL may be ``*``)."""
    out_: dict[str, Reexecution] = {}
    for raw in items:
        name, sep, way = (x.strip() for x in raw.partition("="))
        if not sep or not name or way not in REEXECUTIONS:
            raise CliError(f"--reexecute wants TOOL=reuse|rerun|ask (TOOL may be *), got {raw!r}")
        out_[name] = cast(Reexecution, way)
    return out_


def parse_point(text: str | None) -> int | None:
    """``--at``: a stream sequence (ASCII digits, from 1), or None for the source's last fork point."""
    if text is None:
        return None
    if not (text.isascii() and text.isdigit()) or int(text) < 1 or int(text) >= 2**63:
        raise CliError(
            f"--at wants a stream sequence of LOOP (a whole number from 1; see loopwire history), got {text!r}"
        )
    return int(text)


async def cmd_fork(args: argparse.Namespace, settings: Settings) -> int:
    source_ref = loop_ref(args.loop, "LOOP")
    at = parse_point(args.at)
    loop_id = require_uuid(args.loop_id, "--loop-id") if args.loop_id else None
    if args.input is not None and not args.input.strip():
        raise CliError("--input must not be empty")
    policy = parse_policy(args.policy or [])
    model = checked_model(args.model, "--model") if args.model is not None else None
    from shared.client import LoopClient

    async with session(settings) as nc:
        source = await resolve_loop(nc, settings, source_ref)
        res = await LoopClient(nc, settings.names).fork(
            source,
            at=at,
            input=args.input,
            model=model,
            system=args.system,
            policy=policy or None,
            reexecution=parse_reexecution(args.reexecute or []) or None,
            loop_id=loop_id,
        )
    if args.json:
        out(json_line({"loop_id": res.loop_id, "seq": res.seq, "command_id": res.command_id, "source": source}))
    else:
        out(res.loop_id)
    return 0


async def _records(nc: Any, settings: Settings, loop_id: str) -> list[tuple[int, Event]]:
    return [r async for r in replay(nc, loop_id, names=settings.names)]


async def cmd_lineage(args: argparse.Namespace, settings: Settings) -> int:
    ref = loop_ref(args.loop, "LOOP")
    async with session(settings) as nc:
        target = await resolve_loop(nc, settings, ref)
        every = await loops(nc, settings.names)
        if target not in every:
            raise CliError(f"no loop {target}")
        links = await origins(nc, settings.names, every)

    def up(o: LoopForked | ParentRef | None) -> str:
        return o.source_loop_id if isinstance(o, LoopForked) else o.loop_id if o is not None else ""

    root = target
    seen = {root}
    while (src := up(links.get(root))) in links and src not in seen:
        root = src
        seen.add(root)
    children: dict[str, list[tuple[str, LoopForked | ParentRef]]] = {}
    for loop_id, o in links.items():
        if o is not None:
            children.setdefault(up(o), []).append((loop_id, o))
    rows: list[tuple[int, str, LoopForked | ParentRef | None]] = []

    def order(c: tuple[str, LoopForked | ParentRef]) -> tuple[int, int, str]:
        o = c[1]
        return (0, o.source_seq, o.created_at) if isinstance(o, LoopForked) else (1, 0, o.tool_execution_id)

    def walk(loop_id: str, depth: int) -> None:
        if any(r[1] == loop_id for r in rows):
            return
        rows.append((depth, loop_id, links.get(loop_id)))
        for child, _ in sorted(children.get(loop_id, []), key=order):
            walk(child, depth + 1)

    walk(root, 0)
    if args.json:
        for depth, loop_id, o in rows:
            line: dict[str, object] = {"loop_id": loop_id, "depth": depth, "parent": up(o) or None}
            if isinstance(o, ParentRef):
                line.update(link="child", tool=o.tool_name, tool_execution_id=o.tool_execution_id, at=None)
            else:
                line.update(
                    link="fork" if o else None, at=o.source_seq if o else None, changes=_changes(o) if o else ""
                )
            out(json_line(line))
        return 0
    for depth, loop_id, o in rows:
        mark = " ◀" if loop_id == target else ""
        if isinstance(o, ParentRef):
            where = f"  (sub-agent {o.tool_name}, call {o.tool_execution_id[:8]})"
        elif o is not None:
            where = f"  (forked at seq {o.source_seq}{'; ' + _changes(o) if _changes(o) else ''})"
        else:
            where = ""
        out(f"{'  ' * depth}{'└─ ' if depth else ''}{loop_id}{where}{mark}")
    return 0


def _changes(f: LoopForked) -> str:
    c = f.changes
    parts = []
    if c.input is not None:
        parts.append(f"input {clip(c.input, 30)!r}")
    if c.model is not None:
        parts.append(f"model {c.model}")
    if c.system is not None:
        parts.append("system")
    if c.policy:
        parts.append("policy " + ",".join(f"{k}={v}" for k, v in sorted(c.policy.items())))
    return ", ".join(parts)


async def cmd_diff(args: argparse.Namespace, settings: Settings) -> int:
    a_ref, b_ref = loop_ref(args.a, "A"), loop_ref(args.b, "B")
    async with session(settings) as nc:
        a_id, b_id = await resolve_loop(nc, settings, a_ref, "A"), await resolve_loop(nc, settings, b_ref, "B")
        a = conversation(await _records(nc, settings, a_id))
        b = conversation(await _records(nc, settings, b_id))
    if not a or not b:
        raise CliError(f"no loop {a_id if not a else b_id}")
    n = common_prefix(a, b)
    rest_a, rest_b = a[n:], b[n:]
    if args.json:
        out(
            json_line(
                {
                    "a": a_id,
                    "b": b_id,
                    "common": n,
                    "diverge_at": {"a": rest_a[0][0] if rest_a else None, "b": rest_b[0][0] if rest_b else None},
                    "only_a": [{"seq": s, "type": type(e).__name__, "content": content_of(e)} for s, e in rest_a],
                    "only_b": [{"seq": s, "type": type(e).__name__, "content": content_of(e)} for s, e in rest_b],
                }
            )
        )
        return 0
    out(f"common prefix: {n} records")
    if not rest_a and not rest_b:
        out("the branches are equal")
        return 0
    first = (
        f"first divergence: A seq {rest_a[0][0] if rest_a else '(end)'} / B seq {rest_b[0][0] if rest_b else '(end)'}"
    )
    out(first)
    table = Table()
    table.add_column(f"A {a_id[:8]}", overflow="fold")
    table.add_column(f"B {b_id[:8]}", overflow="fold")
    for k in range(max(len(rest_a), len(rest_b))):
        cells = [_cell(rest_a, k), _cell(rest_b, k)]
        table.add_row(*cells)
    make_console().print(table)
    return 0


def _cell(rows: list[tuple[int, Event]], k: int) -> Text:
    """A record as plain text: a loop's words are never read as rich markup ("[b]" stays "[b]")."""
    if k >= len(rows):
        return Text("")
    seq, e = rows[k]
    return Text(f"{seq} {type(e).__name__}: {describe(e)}")
