"""The tools bucket both sides share: workers write their registrations, callers watch them.

Key ``<tool_name>.<worker_id>`` → :class:`~services.toolwire.spec.Registration`. A worker refreshes
its entries every :data:`REFRESH_SECONDS`; the bucket's TTL removes the entries of a worker that died.

Besides the watch, a caller reads the bucket directly while it starts (:func:`tools_bucket_keys`,
:func:`read_entry`): see :meth:`services.toolcaller.registry.ToolRegistry.start` for why.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.kv import KeyValue

from shared import streamreads
from shared.streams import TOOLS_TTL_SECONDS, ensure_kv
from shared.subjects import Names, kv_stream

REGISTRATION_TTL_SECONDS: Final = TOOLS_TTL_SECONDS
REFRESH_SECONDS: Final = TOOLS_TTL_SECONDS / 3

KV_DEL: Final = streamreads.KV_DEL
KV_PURGE: Final = streamreads.KV_PURGE


async def ensure_tools_bucket(js: JetStreamContext, names: Names, replicas: int = 1) -> KeyValue:
    """Bind the tools bucket, creating it when missing (an incompatible one is reported)."""
    return await ensure_kv(js, names.tools_bucket, replicas=replicas, ttl=REGISTRATION_TTL_SECONDS)


def registration_key(tool_name: str, worker_id: str) -> str:
    return f"{tool_name}.{worker_id}"


@dataclass(frozen=True, slots=True)
class StoredEntry:
    """A key's current message in the bucket: ``operation`` is :data:`KV_DEL`/:data:`KV_PURGE` for
    a removal marker, None for a value."""

    key: str
    revision: int
    value: bytes
    operation: str | None


def _subject_prefix(names: Names) -> str:
    return f"$KV.{names.tools_bucket}."


async def tools_bucket_keys(nc: NATS, names: Names) -> tuple[set[str], int]:
    """Every key the bucket holds a message for (removal markers included), and the bucket's last
    revision once they were listed."""
    prefix, stream = _subject_prefix(names), kv_stream(names.tools_bucket)
    subjects = await streamreads.subjects(nc, stream, f"{prefix}>")
    info = await nc.jetstream().stream_info(stream)
    return {s[len(prefix) :] for s in subjects if s.startswith(prefix)}, info.state.last_seq or 0


async def read_entry(nc: NATS, names: Names, key: str) -> StoredEntry | None:
    """The key's current message (a leader read), or None when the bucket holds none for it."""
    m = await streamreads.get_msg(nc, kv_stream(names.tools_bucket), last_by_subj=_subject_prefix(names) + key)
    if m is None:
        return None
    return StoredEntry(key=key, revision=m.seq, value=m.data, operation=streamreads.kv_removal(m.headers))
