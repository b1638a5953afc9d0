"""Reading stored messages and subjects of a stream without a consumer.

* :func:`get_msg` - a **leader** read (``STREAM.MSG.GET``): read-after-write on R3 too;
* :func:`direct_get_batch` - a batch of a subject's messages from any replica;
* :func:`stream_messages`, :func:`subjects` - a stream's message count and its subjects' counts;
* :func:`kv_removal` - whether a KV bucket's message removes its key.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

import msgspec
import nats.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from shared.connection import request_many
from shared.jsapi import ApiErrorBody, js_request
from shared.jserrors import ERR_NO_MESSAGE, ERR_STREAM_NOT_FOUND, JetStreamError, JetStreamUnavailableError
from shared.subjects import H_LAST_SEQUENCE, H_MSG_ID, H_NUM_PENDING, H_SEQUENCE, H_STATUS, H_SUBJECT, js_api

# How a KV message says it removes its key (the names nats-py gives them), and the reasons the
# server gives on the markers it writes itself (TTL and age expiry, nats-server 2.11+).
KV_DEL: Final = "DEL"
KV_PURGE: Final = "PURGE"
H_KV_OPERATION: Final = "KV-Operation"
H_MARKER_REASON: Final = "Nats-Marker-Reason"
_MARKER_OPERATIONS: Final = {"MaxAge": KV_PURGE, "Purge": KV_PURGE, "Remove": KV_DEL}


def kv_removal(headers: Mapping[str, str] | None) -> str | None:
    """:data:`KV_DEL` or :data:`KV_PURGE` when a KV message with these headers removes its key,
    else None (it holds a value)."""
    h = headers or {}
    return h.get(H_KV_OPERATION) or _MARKER_OPERATIONS.get(h.get(H_MARKER_REASON, ""))


@dataclass(slots=True)
class StoredMsg:
    """One stored message: its subject, stream sequence, headers and payload."""

    subject: str
    seq: int
    headers: dict[str, str]
    data: bytes

    @property
    def msg_id(self) -> str:
        return self.headers.get(H_MSG_ID, "")


def parse_headers(raw: bytes) -> dict[str, str]:
    """Parse a ``NATS/1.0`` header block (as stored by JetStream)."""
    out: dict[str, str] = {}
    lines = raw.decode("utf-8", "replace").split("\r\n")
    for line in lines[1:]:
        if not line:
            continue
        k, sep, v = line.partition(":")
        if sep:
            out.setdefault(k.strip(), v.strip())
    return out


class _RawStoredMsg(msgspec.Struct):
    subject: str = ""
    seq: int = 0
    hdrs: str = ""
    data: str = ""


class _MsgGetWire(msgspec.Struct):
    message: _RawStoredMsg | None = None
    error: ApiErrorBody | None = None


_msg_get = msgspec.json.Decoder(_MsgGetWire)
_json = msgspec.json.Encoder()


async def get_msg(
    nc: NATS,
    stream: str,
    *,
    seq: int | None = None,
    last_by_subj: str | None = None,
    next_by_subj: str | None = None,
    request_timeout: float = 2.0,
) -> StoredMsg | None:
    """Leader read (``$JS.API.STREAM.MSG.GET``): read-after-write even on R3. None = no such message.

    ``seq`` alone: that message; ``last_by_subj``: the subject's last; ``seq`` + ``next_by_subj``:
    the first message on the subject at or after ``seq``.
    """
    req: dict[str, object] = {}
    if last_by_subj is not None:
        req["last_by_subj"] = last_by_subj
    else:
        req["seq"] = max(1, seq or 1)
        if next_by_subj is not None:
            req["next_by_subj"] = next_by_subj
    msg = await js_request(nc, js_api("STREAM.MSG.GET", stream), _json.encode(req), None, request_timeout)
    resp = _msg_get.decode(msg.data)
    if resp.error is not None:
        if resp.error.err_code == ERR_NO_MESSAGE or resp.error.code == 404:
            return None
        raise JetStreamError(resp.error.code, resp.error.err_code, resp.error.description)
    if resp.message is None:
        raise JetStreamError(0, 0, "empty message-get response")
    m = resp.message
    return StoredMsg(
        subject=m.subject,
        seq=m.seq,
        headers=parse_headers(base64.b64decode(m.hdrs)) if m.hdrs else {},
        data=base64.b64decode(m.data) if m.data else b"",
    )


@dataclass(slots=True)
class DirectBatch:
    """One Direct Get batch: the messages, how many remain after them, and the subject's last seq."""

    messages: list[StoredMsg]
    num_pending: int
    last_seq: int


def _has_status(m: Msg) -> bool:
    return m.headers is not None and H_STATUS in m.headers


async def direct_get_batch(
    nc: NATS,
    stream: str,
    subject: str,
    *,
    start_seq: int,
    batch: int = 2000,
    max_bytes: int = 8 * 1024 * 1024,
    idle_timeout: float = 5.0,
    multi_last: Sequence[str] = (),
) -> DirectBatch:
    """Up to ``batch`` messages of ``subject`` from ``start_seq`` with ONE request (no consumer).

    With ``multi_last``, instead the last message of each of those subjects (``subject`` and
    ``start_seq`` are then ignored). Served by any replica (no read-after-write on R3; see
    :func:`get_msg`). The messages come to the connection's reply inbox (no subscription of the
    request's own) and end with a status message.
    """
    req: dict[str, object] = (
        {"multi_last": list(multi_last), "batch": batch}
        if multi_last
        else {"seq": max(1, start_seq), "batch": batch, "next_by_subj": subject, "max_bytes": max_bytes}
    )
    try:
        # Every batch ends with a status message: 204 (end of batch), 404 (nothing), or an error.
        replies = await request_many(
            nc, js_api("DIRECT.GET", stream), _json.encode(req), last=_has_status, idle=idle_timeout
        )
    except nats.errors.TimeoutError:
        raise JetStreamUnavailableError(f"direct get on {stream} stalled for {idle_timeout:g}s") from None
    except nats.errors.ConnectionClosedError as e:
        raise JetStreamUnavailableError(f"connection closed: {e!r}") from None
    out: list[StoredMsg] = []
    end: dict[str, str] = {}
    for m in replies:
        h = m.headers or {}
        status = h.get(H_STATUS)
        if status is None:
            seq = int(h.get(H_SEQUENCE, "0"))
            out.append(StoredMsg(subject=h.get(H_SUBJECT, subject), seq=seq, headers=h, data=m.data))
        elif status == "204":
            end = h
        elif status != "404":
            code = int(status) if status.isdigit() else 0
            if code == 503:
                raise JetStreamUnavailableError(f"direct get on {stream}: no responders (no stream, or no leader)")
            why = f"direct get on {stream}: status {status} {h.get('Description', '')}".strip()
            raise JetStreamError(code, 0, why)
    pending = int(end.get(H_NUM_PENDING, "0") or 0)
    last = int(end.get(H_LAST_SEQUENCE, "0") or 0)
    return DirectBatch(messages=out, num_pending=pending, last_seq=last)


async def stream_messages(nc: NATS, stream: str, *, request_timeout: float = 5.0) -> int:
    """How many messages ``stream`` holds (one stream info request, only its count decoded)."""
    msg = await js_request(nc, js_api("STREAM.INFO", stream), b"", None, request_timeout)
    resp = msgspec.json.decode(msg.data, type=_StreamInfoWire)
    if resp.error is not None:
        raise JetStreamError(resp.error.code, resp.error.err_code, resp.error.description)
    return resp.state.messages if resp.state else 0


async def subjects(nc: NATS, stream: str, subjects_filter: str, *, request_timeout: float = 5.0) -> dict[str, int]:
    """Every subject of ``stream`` matching ``subjects_filter`` with its message count (paged)."""
    out: dict[str, int] = {}
    offset = 0
    while True:
        req = {"subjects_filter": subjects_filter, "offset": offset}
        msg = await js_request(nc, js_api("STREAM.INFO", stream), _json.encode(req), None, request_timeout)
        resp = msgspec.json.decode(msg.data, type=_StreamInfoWire)
        if resp.error is not None:
            if resp.error.err_code == ERR_STREAM_NOT_FOUND:
                return out
            raise JetStreamError(resp.error.code, resp.error.err_code, resp.error.description)
        got = (resp.state.subjects if resp.state else None) or {}
        out.update(got)
        offset += len(got)
        if not got or offset >= resp.total:
            return out


class _StreamStateWire(msgspec.Struct):
    messages: int = 0
    subjects: dict[str, int] | None = None


class _StreamInfoWire(msgspec.Struct):
    state: _StreamStateWire | None = None
    total: int = 0
    error: ApiErrorBody | None = None
