"""The tools command: the live tools with their replicas, kind, version, safety and arguments."""

from __future__ import annotations

import argparse
from typing import Any

import msgspec
from rich.table import Table

from services.cli.output import cells, make_console, out
from services.cli.render import clip, json_line
from services.cli.session import session
from services.toolwire.spec import ToolSpec
from shared.settings import Settings


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
            *cells(
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
        table.add_row(*cells(name, "-", "", "conflict", "", "", "", ", ".join(sorted(s.version for s in specs))))
    make_console().print(table)
    return 0
