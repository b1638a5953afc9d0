"""Publishing to JetStream with explicit headers and waiting for the ack.

* :func:`js_publish` - one publish with explicit headers → :class:`PubAck` or a typed error;
* :func:`publish_batch` - one atomic batch (ADR-50) with raw headers, all-or-nothing.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

import msgspec
import nats.errors
from nats.aio.client import Client as NATS

from shared.jsapi import ApiErrorBody, js_request
from shared.jserrors import JetStreamError, JetStreamUnavailableError, PayloadTooLargeError
from shared.subjects import H_BATCH_COMMIT, H_BATCH_ID, H_BATCH_SEQ

# Server limit on messages per atomic batch (nats-server default ``max_msgs``).
MAX_BATCH: Final = 1000
# Room reserved for headers when checking a message against the server's max_payload.
_HEADER_SLACK: Final = 16


@dataclass(frozen=True, slots=True)
class PubAck:
    stream: str
    seq: int
    duplicate: bool = False
    batch_size: int = 0


class _PubAckWire(msgspec.Struct):
    stream: str = ""
    seq: int = 0
    duplicate: bool = False
    count: int = 0
    error: ApiErrorBody | None = None


_pub_ack = msgspec.json.Decoder(_PubAckWire)


def _headers_size(headers: Mapping[str, str]) -> int:
    return 12 + sum(len(k) + len(v) + 4 for k, v in headers.items()) + _HEADER_SLACK


def check_payload(nc: NATS, payload: bytes, headers: Mapping[str, str]) -> None:
    """Raise :class:`PayloadTooLargeError` rather than let the server close the connection."""
    size = len(payload) + _headers_size(headers)
    if size > nc.max_payload:
        raise PayloadTooLargeError(size, nc.max_payload)


def parse_ack(data: bytes) -> PubAck:
    """A JetStream publish ack; raises :class:`JetStreamError` for an error ack or unreadable data."""
    try:
        ack = _pub_ack.decode(data)
    except msgspec.DecodeError as e:
        raise JetStreamError(0, 0, f"unreadable publish ack: {e}") from None
    if ack.error is not None:
        raise JetStreamError(ack.error.code, ack.error.err_code, ack.error.description)
    return PubAck(stream=ack.stream, seq=ack.seq, duplicate=ack.duplicate, batch_size=ack.count)


async def js_publish(
    nc: NATS, subject: str, payload: bytes, headers: Mapping[str, str], *, request_timeout: float
) -> PubAck:
    """Publish one message to JetStream with exactly ``headers`` and wait for its ack.

    Raises :class:`JetStreamError` (with ``err_code``), :class:`JetStreamUnavailableError` or
    :class:`PayloadTooLargeError`. A duplicate is not an error (``PubAck.duplicate``).
    """
    check_payload(nc, payload, headers)
    msg = await js_request(nc, subject, payload, headers, request_timeout)
    return parse_ack(msg.data)


async def publish_batch(
    nc: NATS,
    subject: str,
    payloads: Sequence[bytes],
    headers: Sequence[Mapping[str, str]],
    *,
    request_timeout: float,
    batch_id: str | None = None,
) -> PubAck:
    """Publish ``payloads`` (≥ 2) as ONE atomic batch on ``subject``; nothing is stored unless all are.

    ``headers[k]`` are the message's own headers (msg-id, OCC on the first); the batch headers are
    added here. The first message is a request (the server answers an empty body once staged),
    the middle ones are plain publishes, the last one commits and gets the PubAck (``seq`` = the
    batch's last sequence).
    """
    n = len(payloads)
    if n < 2 or len(headers) != n:
        raise ValueError("publish_batch needs ≥ 2 payloads and one header map per payload")
    if n > MAX_BATCH:
        raise JetStreamError(400, 10199, f"atomic batch of {n} messages exceeds the {MAX_BATCH}-message limit")
    bid = batch_id or uuid.uuid4().hex
    full: list[dict[str, str]] = []
    for k, (p, h) in enumerate(zip(payloads, headers, strict=True), 1):
        hdr = {**h, H_BATCH_ID: bid, H_BATCH_SEQ: str(k)}
        if k == n:
            hdr[H_BATCH_COMMIT] = "1"
        check_payload(nc, p, hdr)
        full.append(hdr)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + request_timeout
    first = await js_request(nc, subject, payloads[0], full[0], request_timeout)
    if first.data:
        parse_ack(first.data)  # raises the staging error
        raise JetStreamError(0, 0, "unexpected ack for the first message of an atomic batch")
    try:
        for k in range(1, n - 1):
            await nc.publish(subject, payloads[k], headers=full[k])
    except (nats.errors.ConnectionClosedError, nats.errors.OutboundBufferLimitError) as e:
        raise JetStreamUnavailableError(f"connection unavailable mid-batch: {e!r}") from None
    last = await js_request(nc, subject, payloads[-1], full[-1], max(0.05, deadline - loop.time()))
    return parse_ack(last.data)
