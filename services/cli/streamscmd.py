"""The streams command: every shard's history and work streams and leases and results buckets, with
their leader, replicas and message count; ``--balance`` spreads the leaders over the nodes."""

from __future__ import annotations

import argparse
from typing import Any

from rich.table import Table

from services.cli.output import cells, make_console, out
from services.cli.render import json_line
from services.cli.session import session
from shared import placement
from shared.placement import StreamPlace
from shared.settings import Settings


def place_json(p: StreamPlace) -> dict[str, Any]:
    return {
        "shard": p.shard,
        "kind": p.kind,
        "name": p.name,
        "stream": p.stream,
        "leader": p.leader or None,
        "replicas": p.replicas,
        "followers": [{"name": f.name, "current": f.current, "lag": f.lag} for f in p.followers],
        "messages": p.messages,
        "missing": p.missing,
    }


def _followers(p: StreamPlace) -> str:
    return ", ".join(f.name + ("" if f.current else " (behind)") for f in p.followers) or "-"


async def cmd_streams(args: argparse.Namespace, settings: Settings) -> int:
    async with session(settings) as nc:
        moved = await placement.balance(nc, settings.names) if args.balance else []
        places = await placement.read(nc, settings.names)
    if args.json:
        for p in places:
            out(json_line(place_json(p)))
        return 0
    for m in moved:
        out(f"moved the leader of {m.stream}: {m.leader or '-'} -> {m.to}")
    if args.balance and not moved:
        out("balanced already: nothing moved")
    table = Table()
    for col in ("shard", "kind", "name", "leader", "followers", "messages"):
        table.add_column(col, no_wrap=col != "followers", justify="right" if col == "messages" else "left")
    for p in places:
        leader = "(missing)" if p.missing else p.leader or "(none)"
        table.add_row(*cells(str(p.shard), p.kind, p.name, leader, _followers(p), str(p.messages)))
    make_console().print(table)
    return 0
