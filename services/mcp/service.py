"""The MCP bridge service (``loopwire serve mcp``): one :class:`~services.mcp.bridge.Bridge` on a
NATS connection of its own."""

from __future__ import annotations

import logging

import anyio
from anyio.abc import TaskStatus

from services.lifecycle import let_go
from services.mcp.bridge import Bridge
from services.mcp.connect import McpTarget
from shared.connect import connect
from shared.settings import Settings
from shared.streams import require_deployment


class McpService:
    """Serve ``target``'s tools; :meth:`run` raises McpStartError when the server never came up."""

    def __init__(
        self,
        target: McpTarget,
        settings: Settings,
        *,
        timeout_seconds: float | None = None,
        init_timeout: float = 10.0,
    ) -> None:
        self.target = target
        self.settings = settings
        self.timeout_seconds = timeout_seconds
        self.init_timeout = init_timeout

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled, then drain; started once the MCP server's first session is up."""
        if self.settings.log_level.upper() != "DEBUG":
            # httpx logs every request at INFO: one line per liveness ping of a URL server.
            logging.getLogger("httpx2").setLevel(logging.WARNING)
        nc = await connect(self.settings, name=f"mcp-bridge:{self.target.name}"[:128])
        try:
            # Refused before anything is created or started: a bridge never makes a deployment of its own.
            await require_deployment(nc.jetstream(), self.settings)
            bridge = Bridge(
                self.target,
                self.settings,
                nc,
                timeout_seconds=self.timeout_seconds,
                init_timeout=self.init_timeout,
            )
            await bridge.run(task_status=task_status)
        finally:
            await let_go(nc)
