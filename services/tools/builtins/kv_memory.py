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
import nats.errors
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext, api
from nats.js.errors import KeyNotFoundError
from nats.js.kv import KeyValue

from services.tools.sdk import ToolContext, ToolError, tool
from shared.streamreads import kv_removal
from shared.streams import ensure_kv
from shared.subjects import Names, kv_stream

MAX_KEY_CHARS: Final = 256
MAX_VALUE_BYTES: Final = 64 * 1024
MAX_LIST: Final = 1000
_LOOP_RE: Final = re.compile(r"^[A-Za-z0-9_-]{1,128}$")
_LIST_IDLE_SECONDS: Final = 5.0


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


async def _keys(nc: NATS, bucket: str, loop_id: str) -> list[str]:
    """The loop's keys that hold a note: the last message of each of its subjects, headers only.

    nats-py's ``KeyValue.watch`` says "nothing pending" when the server has sent every message but
    the client has not read them yet, and a list made just after a remember came back empty. Here
    the server's own count decides: it has neither sent nor holds a message only when there is none.
    """
    prefix = f"$KV.{bucket}.{loop_id}."
    sub = await nc.jetstream().subscribe(
        prefix + ">",
        stream=kv_stream(bucket),
        ordered_consumer=True,
        deliver_policy=api.DeliverPolicy.LAST_PER_SUBJECT,
        headers_only=True,
        inactive_threshold=30.0,
    )
    out: list[str] = []
    try:
        info = await sub.consumer_info()
        if info.num_pending == 0 and not (info.delivered and info.delivered.consumer_seq):
            return out
        while True:
            msg = await sub.next_msg(timeout=_LIST_IDLE_SECONDS)
            if kv_removal(msg.headers) is None:
                out.append(_decode_key(msg.subject[len(prefix) :]))
            if msg.metadata.num_pending == 0:
                break
    except nats.errors.TimeoutError:
        raise ToolError(f"listing notes stalled: JetStream sent nothing for {_LIST_IDLE_SECONDS:g} s") from None
    finally:
        await sub.unsubscribe()
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
    keys = await _keys(ctx.nc, ctx.settings.names.memory_bucket, loop_id)
    if not keys:
        return "no notes yet"
    shown = keys[:MAX_LIST]
    more = f"\n… and {len(keys) - len(shown)} more" if len(keys) > len(shown) else ""
    return "\n".join(shown) + more
