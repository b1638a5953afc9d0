"""The durable envelope: an enduring event's JSON plus ``"type"`` and ``"v": 1``. Strict both ways.

``encode_event`` refuses ephemeral and invalid events and oversized records. ``decode_event``
refuses anything that is not exactly a valid v1 record: invalid UTF-8, non-JSON, duplicate keys at
any depth (case-insensitive), unknown type, ephemeral type, ``v`` > 1, unknown fields, wrong shapes,
oversized records; and it re-validates. Every failure is a :class:`shared.errors.LoopwireError`.
"""

from __future__ import annotations

import re
from typing import Final

import msgspec

from shared import strictjson
from shared.errors import (
    CodecError,
    EphemeralNotPersistableError,
    InvalidEventError,
    LoopwireError,
    MalformedRecordError,
    RecordTooLargeError,
    Rule,
    UnknownEventTypeError,
    UnsupportedSchemaError,
)
from shared.events import EPHEMERAL_TYPES, EVENT_TYPES, AnyEvent, Class, Event, event_class
from shared.validate import validate_event

__all__ = [
    "DEFAULT_MAX_RECORD_BYTES",
    "CodecError",
    "EphemeralNotPersistableError",
    "InvalidEventError",
    "LoopwireError",
    "MalformedRecordError",
    "RecordTooLargeError",
    "UnknownEventTypeError",
    "UnsupportedSchemaError",
    "decode_event",
    "decode_live",
    "encode_event",
    "encode_live",
]

DEFAULT_MAX_RECORD_BYTES: Final = 1024 * 1024  # NATS' default max_payload
_FIELD_RE: Final = re.compile(r"at `\$\.([A-Za-z0-9_]+)")
_encoder = msgspec.json.Encoder()
_decoders: dict[type[Event], msgspec.json.Decoder[Event]] = {
    cls: msgspec.json.Decoder(cls) for cls in EVENT_TYPES.values()
}


def encode_event(event: Event, *, max_bytes: int = DEFAULT_MAX_RECORD_BYTES) -> bytes:
    """Encode an enduring, valid event as a v1 envelope."""
    if not isinstance(event, Event) or type(event).__name__ not in EVENT_TYPES:
        raise UnknownEventTypeError(type(event).__name__)
    if event_class(event) is Class.EPHEMERAL:
        raise EphemeralNotPersistableError(type(event).__name__)
    validate_event(event)
    # msgspec writes the tag first and omits v == 1 (a default); put "v":1 right after the "{".
    try:
        raw = _encoder.encode(event)
    except (msgspec.EncodeError, TypeError, ValueError, OverflowError) as e:
        # e.g. a lone surrogate in a hand-built string: validation passed, but it is not UTF-8.
        raise MalformedRecordError(f"{type(event).__name__} is not encodable: {e}") from None
    data = b'{"v":1,' + raw[1:]
    if len(data) > max_bytes:
        raise RecordTooLargeError(len(data), max_bytes)
    return data


def decode_event(data: bytes, *, max_bytes: int = DEFAULT_MAX_RECORD_BYTES) -> Event:
    """Decode and re-validate one v1 envelope."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise MalformedRecordError(f"record must be bytes, not {type(data).__name__}")
    if len(data) > max_bytes:
        raise RecordTooLargeError(len(data), max_bytes)
    try:
        doc = strictjson.loads(data)
    except strictjson.StrictJSONError as e:
        raise MalformedRecordError(str(e)) from None
    if not isinstance(doc, dict):
        raise MalformedRecordError("record must be a JSON object")
    type_name = doc.get("type")
    if not isinstance(type_name, str) or type_name not in EVENT_TYPES:
        raise UnknownEventTypeError(str(type_name))
    if type_name in EPHEMERAL_TYPES:
        raise EphemeralNotPersistableError(type_name)
    v = doc.get("v", 1)
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise MalformedRecordError(f"envelope version must be a positive integer, got {v!r}")
    if v > 1:
        raise UnsupportedSchemaError(v)
    try:
        event = _decoders[EVENT_TYPES[type_name]].decode(data)
    except msgspec.ValidationError as e:
        m = _FIELD_RE.search(str(e))
        if m is None:
            raise MalformedRecordError(f"{type_name}: {e}") from None
        raise InvalidEventError(type_name, m.group(1), Rule.INVALID.value) from None
    except (msgspec.DecodeError, RecursionError) as e:  # pragma: no cover - strictjson already parsed it
        raise MalformedRecordError(str(e)) from None
    validate_event(event)
    return event


# --- live (ephemeral and enduring) events on core subjects ---------------------------------------

_live_decoder: msgspec.json.Decoder[AnyEvent] = msgspec.json.Decoder(AnyEvent)


def encode_live(event: Event) -> bytes:
    """Encode any event for a live core subject (same JSON shape as the envelope, not validated)."""
    return b'{"v":1,' + _encoder.encode(event)[1:]


def decode_live(data: bytes) -> Event:
    """Decode a live event; shape errors raise :class:`MalformedRecordError` (live events may be dropped)."""
    try:
        return _live_decoder.decode(data)
    except (msgspec.ValidationError, msgspec.DecodeError) as e:
        raise MalformedRecordError(str(e)) from None
