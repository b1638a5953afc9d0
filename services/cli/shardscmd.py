"""The shards command: the deployment's shard count, and ``grow N`` to grow a one-shard deployment.

Growing refuses while any service runs: every service answers presence requests
(:func:`shared.layout.live_services`) from start to stop, and a service of the old count would go on
writing new loops into shard 0 and keep leases in the old buckets.
"""

from __future__ import annotations

import argparse
import json

from services.cli.errors import CliError
from services.cli.output import out
from services.cli.session import session
from shared import layout
from shared.settings import MAX_SHARDS, Settings
from shared.streams import grow


def _describe(found: layout.Layout) -> str:
    grew = " (grew from one shard: its loops from before are in shard 0)" if found.grew else ""
    return f"{found.shards} shard{'s' if found.shards != 1 else ''}{grew}"


async def cmd_shards(args: argparse.Namespace, settings: Settings) -> int:
    async with session(settings) as nc:
        found = await layout.read(nc, settings.prefix)
        if (args.action is None) != (args.grow is None):
            raise CliError("give both or neither: loopwire shards grow N")
        if args.grow is None:
            live = await layout.live_services(nc, settings.names)
            if args.json:
                out(json.dumps({"shards": found.shards, "grew": found.grew, "services": len(live)}))
            else:
                out(f"{_describe(found)}; {len(live)} service(s) running")
            return 0
        to = args.grow
        if not 1 <= to <= MAX_SHARDS:
            raise CliError(f"shards grow: N must be 1-{MAX_SHARDS}, got {to}")
        if to == found.shards:
            out(f"the deployment has {_describe(found)} already: nothing to do")
            return 0
        if found.shards != 1:
            raise CliError(
                f"the deployment has {found.shards} shards: only a one-shard deployment grows "
                "(a loop's shard is its id's hash modulo the count, fixed once there are several)"
            )
        live = await layout.live_services(nc, settings.names)
        if live:
            who = ", ".join(sorted(f"{p.service} (pid {p.pid} on {p.host})" for p in live))
            raise CliError(f"{len(live)} service(s) still running, stop them first: {who}")
        await grow(nc.jetstream(timeout=10), settings, to)
    out(f"grew the deployment to {to} shards; start the services again (without LW_SHARDS: they read it)")
    return 0
