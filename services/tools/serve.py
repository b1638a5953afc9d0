"""Entry points that run tool workers: :func:`serve` / :func:`serve_tools` (async, for the CLI and
embedded mode) and :func:`run_worker` (blocking, for a tool author's script)."""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Sequence

import anyio

from services.runner import run_service
from services.tools.sdk import Tool
from services.tools.worker import Worker
from shared.bus import connect
from shared.settings import Settings, split_list


def resolve_tools(specs: Sequence[str]) -> list[Tool]:
    """Built-in names (``calculator``) or ``module:attr`` (a Tool or a list of Tools) → tools."""
    from services.tools.builtins import BUILTINS

    out: list[Tool] = []
    for spec in specs:
        if spec in BUILTINS:
            out.append(BUILTINS[spec])
            continue
        if ":" not in spec:
            raise ValueError(f"unknown tool {spec!r}: built-ins are {', '.join(sorted(BUILTINS))} (or use module:attr)")
        module_name, _, attr = spec.partition(":")
        obj = getattr(importlib.import_module(module_name), attr)
        items = obj if isinstance(obj, list | tuple) else [obj]
        for item in items:
            if not isinstance(item, Tool):
                raise ValueError(f"{spec}: {item!r} is not a tool (decorate it with @tool)")
            out.append(item)
    return out


async def serve(
    tools: Sequence[Tool],
    settings: Settings,
    *,
    ready: anyio.Event | None = None,
    stop: anyio.Event | None = None,
) -> None:
    """Serve ``tools`` until ``stop`` is set (graceful drain) or the task is cancelled."""
    label = ",".join(t.name for t in tools)
    nc = await connect(settings, name=f"tool-worker:{label}"[:128])
    try:
        await Worker(tools, settings, nc).run(ready=ready, stop=stop)
    finally:
        with anyio.CancelScope(shield=True), anyio.move_on_after(5):
            await nc.close()


async def serve_tools(
    names: list[str],
    settings: Settings,
    *,
    ready: anyio.Event | None = None,
    stop: anyio.Event | None = None,
) -> None:
    """Serve built-in tools by name (``loopwire serve tool NAME``); ``module:attr`` also works."""
    await serve(resolve_tools(names), settings, ready=ready, stop=stop)


def run_worker(tools: Sequence[Tool], nats_url: str | None = None, *, settings: Settings | None = None) -> int:
    """Serve ``tools`` in the foreground until SIGTERM/SIGINT (then drain); returns the exit status.

    Configuration comes from the environment (``LW_NATS_URL``, ``LW_PREFIX``, ...); ``nats_url``
    overrides the server list.
    """
    s = settings or Settings.from_env()
    if nats_url:
        s = dataclasses.replace(s, nats_urls=split_list(nats_url))
    tool_list = list(tools)

    async def main(st: Settings, stop: anyio.Event, ready: anyio.Event) -> None:
        await serve(tool_list, st, stop=stop, ready=ready)

    return run_service("tools", main, s)
