"""A worker's entries in the tools bucket: one per tool it serves, with its spec and health.

The bucket's TTL removes the entries of a worker that died (see :mod:`services.toolwire.bucket`);
a serving worker writes its entries again every ``REFRESH_SECONDS``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from collections.abc import Callable, Sequence
from datetime import UTC, datetime

import msgspec
import nats.errors
from nats.js.kv import KeyValue

from services.tools.sdk import Tool
from services.toolwire import protocol as p
from services.toolwire.bucket import registration_key
from services.toolwire.spec import Registration
from shared.settings import Settings

log = logging.getLogger("loopwire.tools.worker")


class Registrations:
    """Writes and deletes the registrations of worker ``worker_id``."""

    def __init__(self, settings: Settings, worker_id: str) -> None:
        self.settings = settings
        self.worker_id = worker_id
        self.registered = False  # written and not deleted since
        self._started_at = datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")

    async def register(self, kv: KeyValue, tools: Callable[[], Sequence[Tool]], *, healthy: bool) -> None:
        """Write an entry for each of ``tools()``: the tools served now, looked at again before each
        write (a tool removed meanwhile is never registered again)."""
        for t in list(tools()):
            if t not in tools():  # removed by set_tools meanwhile: never re-register it
                continue
            spec = t.spec(self.settings)
            if not healthy:
                spec = msgspec.structs.replace(spec, healthy=False)
            reg = Registration(
                worker_id=self.worker_id,
                spec=spec,
                host=socket.gethostname(),
                pid=os.getpid(),
                started_at=self._started_at,
            )
            await kv.put(registration_key(t.name, self.worker_id), p.encode(reg))
        self.registered = True

    async def deregister(self, kv: KeyValue, tools: Sequence[Tool]) -> None:
        self.registered = False
        for t in tools:
            try:
                await kv.delete(registration_key(t.name, self.worker_id))
            except nats.errors.ConnectionClosedError:  # its server is gone: every delete fails so
                log.warning("worker %s: not deregistered (connection closed); the TTL removes it", self.worker_id)
                return
            except nats.errors.Error as e:  # the TTL removes it anyway
                log.warning("worker %s: could not deregister %s: %r", self.worker_id, t.name, e)
            except Exception:
                log.warning("worker %s: could not deregister %s", self.worker_id, t.name, exc_info=True)

    async def forget(self, kv: KeyValue, name: str) -> None:
        """Delete the entry of tool ``name``, no longer served (best effort: the TTL removes it anyway)."""
        with contextlib.suppress(Exception):
            await kv.delete(registration_key(name, self.worker_id))
