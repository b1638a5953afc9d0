"""``clock``: the current time in an IANA time zone (``zoneinfo``), e.g.
``2026-11-29T19:02:03+09:00 (Asia/Tokyo)``."""

from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import msgspec

from services.tools.sdk import ToolError, tool


class ClockInput(msgspec.Struct, forbid_unknown_fields=True):
    """An IANA time zone name such as "Europe/Paris" or "UTC"."""

    timezone: str = "UTC"


def zone(name: str) -> ZoneInfo:
    if not name or len(name) > 128:
        raise ToolError(f"unknown time zone: {name!r}")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError, UnicodeError):
        raise ToolError(f"unknown time zone: {name!r} (use an IANA name such as 'Europe/Paris')") from None


@tool(
    name="clock",
    description="Current date and time in an IANA time zone (default UTC).",
    read_only=True,
    inline=True,  # a clock read and a cached zone lookup: quick
)
def clock(args: ClockInput) -> str:
    tz = zone(args.timezone)
    return f"{datetime.now(tz).isoformat(timespec='seconds')} ({args.timezone})"
