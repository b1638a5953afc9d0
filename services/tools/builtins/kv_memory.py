"""``kv_memory``: remember / recall / list short notes, per loop, in KV ``<prefix>_memory``.

The loop comes from the call's ``Lw-Loop-Id`` header (never from the arguments), so one loop can
never read another's notes. Keys are stored base64url-encoded (``<loop_id>.<b64(key)>``), so any
text is a valid key.
"""

from __future__ import annotations

import base64
import re
from typing import Final, Literal

import msgspec
from nats.js import JetStreamContext
from nats.js.errors import KeyNotFoundError
from nats.js.kv import KeyValue

from services.tools.sdk import ToolContext, ToolError, tool
from shared.streams import ensure_kv
from shared.subjects import Names

MAX_KEY_CHARS: Final = 256
MAX_VALUE_BYTES: Final = 64 * 1024
MAX_LIST: Final = 1000
_LOOP_RE: Final = re.compile(r"^[A-Za-z0-9_-]{1,128}$")


class MemoryInput(msgspec.Struct, forbid_unknown_fields=True):
    """remember: store value under key; recall: read key; list: the keys of this loop."""

    action: Literal["remember", "recall", "list"]
    key: str = ""
    value: str = ""


async def ensure_memory_bucket(js: JetStreamContext, names: Names, replicas: int = 1) -> KeyValue:
    """Bind the memory bucket, creating it when missing (notes never expire: ttl 0)."""
    return await ensure_kv(js, names.memory_bucket, replicas=replicas, ttl=0.0)


def _encode_key(key: str) -> str:
    return base64.urlsafe_b64encode(key.encode("utf-8", "surrogatepass")).decode().rstrip("=")


def _decode_key(token: str) -> str:
    return base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode("utf-8", "replace")


async def _keys(kv: KeyValue, loop_id: str) -> list[str]:
    watcher = await kv.watch(f"{loop_id}.>", ignore_deletes=True, meta_only=True)
    out: list[str] = []
    try:
        async for entry in watcher:
            if entry is None:
                break
            out.append(_decode_key(entry.key.split(".", 1)[1]))
            if entry.delta == 0:
                break
    finally:
        await watcher.stop()  # type: ignore[no-untyped-call]
    return sorted(out)


# Idempotent: remembering the same note again, recalling and listing leave the same state.
@tool(
    name="kv_memory",
    description="Remember, recall or list short notes that persist for this loop.",
    idempotent=True,
)
async def kv_memory(args: MemoryInput, ctx: ToolContext) -> str:
    loop_id = ctx.loop_id
    if not _LOOP_RE.fullmatch(loop_id):
        raise ToolError("kv_memory needs the call's loop id (Lw-Loop-Id header)")
    if ctx.nc is None:
        raise ToolError("kv_memory is not connected to NATS")
    if args.action != "list" and not args.key:
        raise ToolError(f"{args.action} needs a non-empty key")
    if len(args.key) > MAX_KEY_CHARS:
        raise ToolError(f"key longer than {MAX_KEY_CHARS} characters")
    kv = await ensure_memory_bucket(ctx.nc.jetstream(), ctx.settings.names, ctx.settings.replicas)
    if args.action == "remember":
        data = args.value.encode("utf-8", "replace")
        if len(data) > MAX_VALUE_BYTES:
            raise ToolError(f"value larger than {MAX_VALUE_BYTES} bytes")
        await kv.put(f"{loop_id}.{_encode_key(args.key)}", data)
        return f"remembered {args.key!r}"
    if args.action == "recall":
        try:
            entry = await kv.get(f"{loop_id}.{_encode_key(args.key)}")
        except KeyNotFoundError:
            return f"nothing remembered under {args.key!r}"
        return (entry.value or b"").decode("utf-8", "replace")
    keys = await _keys(kv, loop_id)
    if not keys:
        return "no notes yet"
    shown = keys[:MAX_LIST]
    more = f"\n… and {len(keys) - len(shown)} more" if len(keys) > len(shown) else ""
    return "\n".join(shown) + more
