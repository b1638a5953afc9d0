"""A tool that records every execution it starts, for checks made from outside the services.

Served with ``python -m services.tools tests.system.ledger_tool:ledger tests.system.ledger_tool:ledger_idem
tests.system.ledger_tool:ledger_destructive`` (the same tool unannotated, declared idempotent and
declared destructive); each execution appends one
JSON line (execution id, loop, step, wall-clock start) to the file named by ``LW_LEDGER`` before it
does anything else, then takes a moment (a window for faults to land mid-call).
"""

from __future__ import annotations

import json
import os
import time

import anyio
import msgspec

from services.tools.sdk import ToolContext, tool


class Entry(msgspec.Struct):
    note: str = ""
    hold: float = 0.15  # seconds the call takes after recording that it started


def _append(line: str) -> None:
    # One short O_APPEND write per execution: lines from concurrent processes never interleave.
    with open(os.environ["LW_LEDGER"], "a", encoding="utf-8") as fh:
        fh.write(line + "\n")


async def _run(tool_name: str, args: Entry, ctx: ToolContext) -> str:
    line = json.dumps(
        {
            "tool": tool_name,
            "execution_id": ctx.ids.execution_id,
            "loop_id": ctx.ids.loop_id,
            "step_id": ctx.ids.step_id,
            "started": time.time(),
            "pid": os.getpid(),
        }
    )
    _append(line)
    await anyio.sleep(max(0.0, min(args.hold, 60.0)))
    return f"recorded {args.note}"


@tool(name="ledger", description="records that it ran (may not run twice: no annotation)")
async def ledger(args: Entry, ctx: ToolContext) -> str:
    return await _run("ledger", args, ctx)


@tool(name="ledger_idem", description="records that it ran (declared idempotent)", idempotent=True)
async def ledger_idem(args: Entry, ctx: ToolContext) -> str:
    return await _run("ledger_idem", args, ctx)


@tool(name="ledger_destructive", description="records that it ran (declared destructive)", destructive=True)
async def ledger_destructive(args: Entry, ctx: ToolContext) -> str:
    return await _run("ledger_destructive", args, ctx)
