"""``loopwire budget``: show a loop's budget and what it has spent, or change it."""

from __future__ import annotations

import argparse

from services.cli.budgets import budget_from_args, budget_json
from services.cli.errors import CliError
from services.cli.ids import loop_ref, resolve_loop
from services.cli.output import out
from services.cli.render import json_line
from services.cli.session import session
from shared.client import LoopClient
from shared.events import now_rfc3339
from shared.history import LoopHistory
from shared.pricing import usd
from shared.replay import load
from shared.settings import Settings

__all__ = ["cmd_budget"]


def _text(h: LoopHistory) -> str:
    b, f = h.budget, h.figures(now_rfc3339())

    def cap(v: float, unit: str = "") -> str:
        return f"{v:g}{unit}" if v else "unlimited"

    lines = [
        f"tokens      {f.tokens} / {cap(b.max_total_tokens)}",
        f"cost        ${usd(f.cost_micro_usd):.6f} / {cap(b.max_cost_usd)}{' USD' if b.max_cost_usd else ''}",
        f"turn steps  {f.steps} / {cap(b.max_steps_per_turn)}",
        f"turn time   {f.turn_seconds:.1f}s / {cap(b.max_turn_seconds, 's')}",
        f"on budget   {b.on_budget}",
    ]
    return "\n".join(lines)


async def cmd_budget(args: argparse.Namespace, settings: Settings) -> int:
    ref = loop_ref(args.loop, "LOOP")
    budget_from_args(args, None)  # a bad option is refused before connecting
    async with session(settings) as nc:
        loop_id = await resolve_loop(nc, settings, ref)
        h = await load(nc, settings.names, loop_id)
        if h.config is None:
            raise CliError(f"loop {loop_id} was never started")
        new = budget_from_args(args, h.budget)
        if new is not None and new != h.budget:
            res = await LoopClient(nc, settings.names).budget(loop_id, new)
            h = await load(nc, settings.names, loop_id, h)
            if not args.json:
                out(f"budget changed at seq {res.seq}")
    if args.json:
        out(json_line({"loop_id": loop_id, **budget_json(h)}))
    else:
        out(_text(h))
    return 0
