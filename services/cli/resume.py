"""Following through a lost NATS connection (``loopwire tail``): on where it left off, or one line.

nats-py reconnects by itself, but the server may have forgotten the consumers (a restart): what
follows the history subscribes again after its last record (never one twice, none left out) and
says so in one line on stderr. A connection that stays away longer than ``LW_CONNECT_SECONDS``
(or is closed) ends the command with one ``error:`` line.
"""

from __future__ import annotations

from typing import Final

import anyio
from nats.aio.client import Client as NATS

from services.cli.errors import CliError
from shared.settings import Settings

CHECK_SECONDS: Final = 0.2


async def watch_connection(nc: NATS, settings: Settings) -> None:
    """Raise :class:`CliError` once ``nc`` is closed, or away for longer than ``LW_CONNECT_SECONDS``."""
    where = ",".join(settings.nats_urls)
    lost_at: float | None = None
    while True:
        await anyio.sleep(CHECK_SECONDS)
        if nc.is_closed:
            raise CliError(f"the connection to NATS at {where} was closed")
        if nc.is_connected:
            lost_at = None
            continue
        lost_at = lost_at if lost_at is not None else anyio.current_time()
        if anyio.current_time() - lost_at > settings.connect_seconds:
            raise CliError(
                f"lost the connection to NATS at {where}; it did not come back within "
                f"{settings.connect_seconds:g} s (LW_CONNECT_SECONDS)"
            )


async def reconnected(nc: NATS, seen: int) -> None:
    """Return once ``nc`` has reconnected since it had ``seen`` reconnects, and is connected."""
    while nc.stats["reconnects"] == seen or not nc.is_connected:  # noqa: ASYNC110  # nats-py has no event for it
        await anyio.sleep(CHECK_SECONDS)


def resumed_line(positions: dict[int, int]) -> str:
    """What ``tail`` says after following on: where, per history stream (one per shard)."""
    if len(positions) == 1:
        after = f"seq {next(iter(positions.values()))}"
    else:
        after = ", ".join(f"seq {seq} of shard {shard}" for shard, seq in sorted(positions.items()))
    return f"the NATS connection was lost and is back: following on after {after}"
