"""The tools bucket both sides share: workers write their registrations, callers watch them.

Key ``<tool_name>.<worker_id>`` → :class:`~services.toolwire.spec.Registration`. A worker refreshes
its entries every :data:`REFRESH_SECONDS`; the bucket's TTL removes the entries of a worker that died.
"""

from __future__ import annotations

from typing import Final

from nats.js import JetStreamContext
from nats.js.kv import KeyValue

from shared.streams import TOOLS_TTL_SECONDS, ensure_kv
from shared.subjects import Names

REGISTRATION_TTL_SECONDS: Final = TOOLS_TTL_SECONDS
REFRESH_SECONDS: Final = TOOLS_TTL_SECONDS / 3


async def ensure_tools_bucket(js: JetStreamContext, names: Names, replicas: int = 1) -> KeyValue:
    """Bind the tools bucket, creating it when missing (an incompatible one is reported)."""
    return await ensure_kv(js, names.tools_bucket, replicas=replicas, ttl=REGISTRATION_TTL_SECONDS)


def registration_key(tool_name: str, worker_id: str) -> str:
    return f"{tool_name}.{worker_id}"
