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
from shared.eventkinds import Class
from shared.events import EPHEMERAL_TYPES, EVENT_TYPES, AnyEvent, Event, event_class
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
    "decode_live_frame",
    "decode_live_strict",
    "encode_event",
    "encode_live",
    "encode_live_frame",
]

DEFAULT_MAX_RECORD_BYTES: Final = 1024 * 1024  # NATS' default max_payload
_FIELD_RE: Final = re.compile(r"(?:at|in) `\$\.([A-Za-z0-9_]+)")
_encoder = msgspec.json.Encoder()
_decoders: dict[type[Event], msgspec.json.Decoder[Event]] = {
    cls: msgspec.json.Decoder(cls) for cls in EVENT_TYPES.values()
}


def encode_event(
    event: Event, *, max_bytes: int = DEFAULT_MAX_RECORD_BYTES, inputs_checked: bool = False, validate: bool = True
) -> bytes:
    """Encode an enduring, valid event as a v1 envelope.

    ``inputs_checked``: see :func:`shared.validate.validate_event` (the rest is validated all the same).
    ``validate=False``: not validated here, for a sender whose receiver validates every event anyway.
    """
    if not isinstance(event, Event) or type(event).__name__ not in EVENT_TYPES:
        raise UnknownEventTypeError(type(event).__name__)
    if event_class(event) is Class.EPHEMERAL:
        raise EphemeralNotPersistableError(type(event).__name__)
    if validate:
        validate_event(event, inputs_checked=inputs_checked)
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


# --- canonical fast path ---------------------------------------------------------------------------
#
# Every record the committer stores (and every envelope encode_event makes) is the canonical msgspec
# encoding of its event. For such bytes the strict-JSON pass below is redundant: if msgspec decodes
# the bytes and re-encodes the event to exactly the same bytes, they are msgspec's own output —
# valid UTF-8 and JSON, struct keys exact, distinct and case-insensitively distinct (snake_case field
# names), no unknown fields, "v":1. What such bytes can still hide is free-form content: dict keys
# differing only in case, and raw JSON (tool_use inputs, copied verbatim). So the fast path takes
# only event types without dicts, Any or raw JSON anywhere in their type, plus those whose only raw
# JSON is the tool_use inputs of their messages, which validate_event checks with the same strict
# rules (duplicates, and a depth that, with the at most 5 levels around an input, stays within
# strictjson.MAX_DEPTH): StepDone, and the user and final messages of InputSubmitted, TurnStarted,
# TurnFoldedInto and TurnDone; and LoopStarted, whose only free-form content is two maps of typed
# values (policy, retries), checked here for keys that differ only in case. Anything else, or any
# difference at all, and any invalid event, takes the full strict path, so what is accepted and every
# error are unchanged. Replay and the committer decode every record, so this halves a hot cost.

_CANON_PREFIX: Final = b'{"v":1,"type":"'


def _free_form(t: msgspec.inspect.Type, seen: set[int]) -> bool:
    """True when a value of type ``t`` may hold a dict, Any or raw JSON anywhere inside."""
    if isinstance(t, msgspec.inspect.DictType | msgspec.inspect.AnyType | msgspec.inspect.RawType):
        return True
    if isinstance(t, msgspec.inspect.StructType):
        if id(t.cls) in seen:
            return False
        seen.add(id(t.cls))
        return any(_free_form(f.type, seen) for f in t.fields)
    if isinstance(t, msgspec.inspect.UnionType):
        return any(_free_form(u, seen) for u in t.types)
    item = getattr(t, "item_type", None)
    if isinstance(item, msgspec.inspect.Type):
        return _free_form(item, seen)
    items = getattr(t, "item_types", None)
    if items:
        return any(_free_form(u, seen) for u in items)
    if isinstance(t, msgspec.inspect.Metadata):
        return _free_form(t.type, seen)
    return isinstance(t, msgspec.inspect.CustomType)  # unknown to us: not on the fast path


def _keyed_maps() -> dict[type[Event], tuple[str, ...]]:
    from shared.events import LoopStarted

    return {LoopStarted: ("policy", "retries")}


_KEYED_MAPS: Final = _keyed_maps()


def _fast_types() -> dict[bytes, type[Event]]:
    from shared.events import InputSubmitted, StepDone, TurnDone, TurnFoldedInto, TurnStarted

    inputs_checked = (StepDone, InputSubmitted, TurnStarted, TurnFoldedInto, TurnDone)
    out: dict[bytes, type[Event]] = {}
    for name, cls in EVENT_TYPES.items():
        if name in EPHEMERAL_TYPES:
            continue
        if cls in inputs_checked or cls in _KEYED_MAPS or not _free_form(msgspec.inspect.type_info(cls), set()):
            out[name.encode()] = cls
    return out


_FAST_TYPES: Final = _fast_types()


def _decode_canonical(data: bytes) -> Event | None:
    """The event when ``data`` is exactly the canonical encoding of a fast-path type; else None."""
    if not data.startswith(_CANON_PREFIX):
        return None
    end = data.find(b'"', len(_CANON_PREFIX))
    cls = _FAST_TYPES.get(data[len(_CANON_PREFIX) : end])
    if cls is None:
        return None
    try:
        event = _decoders[cls].decode(data)
        if b'{"v":1,' + _encoder.encode(event)[1:] != data:
            return None
    except (msgspec.ValidationError, msgspec.DecodeError, msgspec.EncodeError, TypeError, ValueError, RecursionError):
        return None
    for field in _KEYED_MAPS.get(cls, ()):
        if not strictjson.keys_distinct(getattr(event, field) or {}):
            return None  # keys that differ only in case: the strict path says so
    return event


def decode_event(data: bytes, *, max_bytes: int = DEFAULT_MAX_RECORD_BYTES) -> Event:
    """Decode and re-validate one v1 envelope."""
    return _decode_strict(data, max_bytes, ephemeral=False)[0]


def decode_event_to_store(data: bytes, *, max_bytes: int, max_record_bytes: int) -> tuple[Event, bytes]:
    """:func:`decode_event`, and the record to store: :func:`encode_event` of the event.

    Bytes that took the canonical fast path already are that record (and were validated as
    decoded), so they are neither validated nor encoded a second time.
    """
    event, canonical = _decode_strict(data, max_bytes, ephemeral=False)
    if canonical:
        if len(data) > max_record_bytes:
            raise RecordTooLargeError(len(data), max_record_bytes)
        return event, bytes(data)
    return event, encode_event(event, max_bytes=max_record_bytes, inputs_checked=True)


def decode_live_strict(data: bytes, *, max_bytes: int = DEFAULT_MAX_RECORD_BYTES) -> Event:
    """Decode and validate one live event of either class with :func:`decode_event`'s rules.

    What a consumer checking the contract runs on an ephemeral record (``decode_live`` is the lenient
    reader for the live path, where a bad event is dropped).
    """
    return _decode_strict(data, max_bytes, ephemeral=True)[0]


def _decode_strict(data: bytes, max_bytes: int, *, ephemeral: bool) -> tuple[Event, bool]:
    """The event, and whether ``data`` is its canonical encoding (the fast path took it)."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise MalformedRecordError(f"record must be bytes, not {type(data).__name__}")
    if len(data) > max_bytes:
        raise RecordTooLargeError(len(data), max_bytes)
    fast = _decode_canonical(bytes(data))
    if fast is not None:
        try:
            validate_event(fast, decoded=True)
            return fast, True
        except LoopwireError:
            pass  # invalid: the strict path below reports it exactly as it always did
    try:
        doc = strictjson.loads(data)
    except strictjson.StrictJSONError as e:
        raise MalformedRecordError(str(e)) from None
    if not isinstance(doc, dict):
        raise MalformedRecordError("record must be a JSON object")
    type_name = doc.get("type")
    if not isinstance(type_name, str) or type_name not in EVENT_TYPES:
        raise UnknownEventTypeError(str(type_name))
    if type_name in EPHEMERAL_TYPES and not ephemeral:
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
    validate_event(event, decoded=True)
    return event, False


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


# A live frame (``<prefix>.live.<loop_id>``): a JSON array of one or more events of one loop, oldest first.
_frame_decoder: msgspec.json.Decoder[list[AnyEvent]] = msgspec.json.Decoder(list[AnyEvent])


def encode_live_frame(encoded: list[bytes]) -> bytes:
    """One live frame of events already encoded with :func:`encode_live`, in order."""
    return b"[" + b",".join(encoded) + b"]"


def decode_live_frame(data: bytes) -> list[Event]:
    """The events of a live frame; shape errors raise :class:`MalformedRecordError` (a frame may be dropped)."""
    try:
        return list(_frame_decoder.decode(data))
    except (msgspec.ValidationError, msgspec.DecodeError) as e:
        raise MalformedRecordError(str(e)) from None
