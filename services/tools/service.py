"""Tool-worker entry points: :class:`ToolService` (one worker on its own connection, for
``python -m services.tools``, ``loopwire serve tool`` and embedding) and :func:`run_worker`
(blocking, for a tool author's script)."""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Sequence
from functools import partial

import anyio
from anyio.abc import TaskStatus

from services.lifecycle import let_go
from services.tools.sdk import Tool
from services.tools.worker import Worker
from shared.connect import connect
from shared.settings import Settings, check_nats_urls, split_list
from shared.streams import require_deployment


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


class ToolService:
    """Serve ``tools`` as one :class:`~services.tools.worker.Worker` on a connection of its own."""

    def __init__(self, tools: Sequence[Tool], settings: Settings) -> None:
        self.tools = list(tools)
        self.settings = settings

    @property
    def label(self) -> str:
        return ",".join(t.name for t in self.tools)

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled, then drain (calls in flight answer first)."""
        nc = await connect(self.settings, name=f"tool-worker:{self.label}"[:128])
        try:
            # Refused before anything is created: a worker never makes a deployment of its own.
            await require_deployment(nc.jetstream(), self.settings)
            await Worker(self.tools, self.settings, nc).run(task_status=task_status)
        finally:
            await let_go(nc)


def run_worker(tools: Sequence[Tool], nats_url: str | None = None, *, settings: Settings | None = None) -> int:
    """Serve ``tools`` in the foreground until SIGTERM/SIGINT (then drain); returns the exit status.

    Configuration comes from the environment (``LW_NATS_URL``, ``LW_PREFIX``, ...); ``nats_url``
    overrides the server list.
    """
    from services.runner import env_settings, run_service

    s = settings or env_settings()
    if nats_url:
        s = dataclasses.replace(s, nats_urls=check_nats_urls("nats_url", split_list(nats_url)))
    return run_service("tools", partial(ToolService, tools), s)
