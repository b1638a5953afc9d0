"""Where an MCP server is and how one session to it is opened (official SDK ``mcp`` 2.x client API).

Sessions use the initialize handshake (``mode="legacy"``): every server in the field speaks it
(2025 and 2026 revisions alike), and it carries what the bridge relies on — ``notifications/progress``,
``notifications/cancelled`` and ``notifications/tools/list_changed`` — on the one long-lived session.

A stdio server is started as a child process with the bridge's environment minus ``LW_*`` variables
(loopwire's own configuration, NATS credentials included, never reaches the server); its stderr goes
to the bridge's. A streamable HTTP server gets headers named by the operator and read from the
environment, so secrets stay out of the command line; the HTTP read timeout is off because the
loopwire deadline bounds every call.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import Final

import httpx2
from mcp import Client, StdioServerParameters
from mcp.client._transport import Transport
from mcp.client.session import MessageHandlerFnT
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from shared.errors import McpStartError as McpStartError

CHILD_ENV_HIDDEN_PREFIX: Final = "LW_"


@dataclass(frozen=True, slots=True)
class McpTarget:
    """A stdio command (``command`` non-empty) or a streamable HTTP ``url``."""

    name: str
    command: tuple[str, ...] = ()
    url: str = ""
    headers: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if bool(self.command) == bool(self.url):
            raise ValueError("give either a command or a URL for the MCP server")

    def describe(self) -> str:
        return self.url if self.url else " ".join(self.command)


def child_environment(env: Mapping[str, str] | None = None) -> dict[str, str]:
    source = os.environ if env is None else env
    return {k: v for k, v in source.items() if not k.startswith(CHILD_ENV_HIDDEN_PREFIX)}


def headers_from_env(specs: list[str], env: Mapping[str, str] | None = None) -> dict[str, str]:
    """``Header=VAR`` → ``{Header: $VAR}``; raises ValueError naming what is malformed or unset."""
    source = os.environ if env is None else env
    out: dict[str, str] = {}
    for spec in specs:
        header, sep, var = spec.partition("=")
        header, var = header.strip(), var.strip()
        if not sep or not header or not var:
            raise ValueError(f"--header-env {spec!r}: expected Header=ENV_VAR")
        value = source.get(var)
        if value is None:
            raise ValueError(f"--header-env {spec!r}: environment variable {var} is not set")
        if "\r" in value or "\n" in value:
            raise ValueError(f"--header-env {spec!r}: the value of {var} contains a line break")
        out[header] = value
    return out


@asynccontextmanager
async def open_client(target: McpTarget, message_handler: MessageHandlerFnT) -> AsyncIterator[Client]:
    """A connected client: starts the server (stdio) or connects (URL) and runs the handshake."""
    async with AsyncExitStack() as stack:
        server: StdioServerParameters | Transport
        if target.command:
            server = StdioServerParameters(
                command=target.command[0], args=list(target.command[1:]), env=child_environment()
            )
        else:
            http = create_mcp_http_client(headers=dict(target.headers), timeout=httpx2.Timeout(30.0, read=None))
            await stack.enter_async_context(http)  # closed with the session, not leaked per reconnect
            server = streamable_http_client(target.url, http_client=http)
        # No response cache: a re-list must reach the server (list_changed, reconnects).
        client = Client(server, mode="legacy", message_handler=message_handler, cache=None, raise_exceptions=False)
        yield await stack.enter_async_context(client)
