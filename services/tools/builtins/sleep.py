"""``sleep``: wait some seconds while heart-beating; honours cancel and the deadline (for tests and demos)."""

from __future__ import annotations

import math
from typing import Final

import anyio
import msgspec

from services.tools.sdk import ToolContext, ToolError, tool

MAX_SLEEP_SECONDS: Final = 3600.0


class SleepInput(msgspec.Struct, forbid_unknown_fields=True):
    """How long to sleep, in seconds (0-3600)."""

    seconds: float


@tool(name="sleep", description="Sleep for the given number of seconds, then say so.", read_only=True)
async def sleep(args: SleepInput, ctx: ToolContext) -> str:
    s = args.seconds
    if not math.isfinite(s) or s < 0 or s > MAX_SLEEP_SECONDS:
        raise ToolError(f"seconds must be between 0 and {MAX_SLEEP_SECONDS:g}")
    # The worker heartbeats on its own; cancellation (toolctl, deadline, drain) interrupts the sleep.
    await anyio.sleep(s)
    return f"slept {s:g}s"
