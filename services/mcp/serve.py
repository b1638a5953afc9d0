"""Entry point of ``loopwire serve mcp``: one bridge on its own NATS connection."""

from __future__ import annotations

import logging

import anyio

from services.mcp.bridge import Bridge
from services.mcp.connect import McpTarget
from shared.bus import connect
from shared.settings import Settings


async def serve_mcp(
    target: McpTarget,
    settings: Settings,
    *,
    ready: anyio.Event | None = None,
    stop: anyio.Event | None = None,
    timeout_seconds: float | None = None,
    init_timeout: float = 10.0,
) -> None:
    """Serve ``target``'s tools until ``stop``; raises McpStartError when the server never came up."""
    if settings.log_level.upper() != "DEBUG":
        # httpx logs every request at INFO: one line per liveness ping of a URL server.
        logging.getLogger("httpx2").setLevel(logging.WARNING)
    nc = await connect(settings, name=f"mcp-bridge:{target.name}"[:128])
    try:
        bridge = Bridge(target, settings, nc, timeout_seconds=timeout_seconds, init_timeout=init_timeout)
        await bridge.run(ready=ready, stop=stop)
    finally:
        with anyio.CancelScope(shield=True), anyio.move_on_after(5):
            await nc.close()
    if bridge.start_error is not None:
        raise bridge.start_error
