"""The durable envelope: acceptance checks and strictness both ways."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from shared import events as ev
from shared.codec import DEFAULT_MAX_RECORD_BYTES, decode_event, encode_event
from shared.content import AIMessage, TextBlock, ToolUseBlock, ai_text, tool_result
from shared.errors import (
    CodecError,
    EphemeralNotPersistableError,
    ErrorKind,
    InvalidEventError,
    LoopwireError,
    MalformedRecordError,
    RecordTooLargeError,
    UnknownEventTypeError,
    UnsupportedSchemaError,
)
from shared.eventkinds import Class
from shared.events import event_class
from shared.strictjson import EMBEDDED_MAX_DEPTH, MAX_DEPTH
from tests.unit.test_validate import ENDURING, EPHEMERAL, GATE, header_for, step_json, valid_event


def envelope(cls: type[ev.Event] = ev.LoopIdle, **fields: Any) -> dict[str, Any]:
    """A valid envelope as a dict (for hand-built records)."""
    doc: dict[str, Any] = json.loads(encode_event(valid_event(cls)))
    return doc | fields


def dumps(doc: Any) -> bytes:
    return json.dumps(doc).encode()


# --- acceptance -----------------------------------------------------------------------------------


def test_encoding_tool_call_started_is_refused() -> None:
    with pytest.raises(EphemeralNotPersistableError) as info:
        encode_event(valid_event(ev.ToolCallStarted))
    assert info.value.type_name == "ToolCallStarted" and "ToolCallStarted" in str(info.value)


@pytest.mark.parametrize("cls", EPHEMERAL, ids=lambda c: c.__name__)
def test_every_ephemeral_type_is_refused_both_ways(cls: type[ev.Event]) -> None:
    with pytest.raises(EphemeralNotPersistableError) as info:
        encode_event(valid_event(cls))
    assert info.value.type_name == cls.__name__
    # even an invalid ephemeral event: the class is checked before validation
    with pytest.raises(EphemeralNotPersistableError):
        encode_event(cls())
    record = {"v": 1, "type": cls.__name__, **header_for(cls)}
    with pytest.raises(EphemeralNotPersistableError) as info:
        decode_event(dumps(record))
    assert info.value.type_name == cls.__name__


def test_decoding_step_done_with_no_messages_is_invalid() -> None:
    with pytest.raises(InvalidEventError) as info:
        decode_event(step_json([]))
    assert info.value.field == "messages" and info.value.rule == "is invalid" and info.value.event == "StepDone"


# --- the envelope ---------------------------------------------------------------------------------


@pytest.mark.parametrize("cls", ENDURING, ids=lambda c: c.__name__)
def test_envelope_round_trip(cls: type[ev.Event]) -> None:
    e = valid_event(cls)
    data = encode_event(e)
    assert data.startswith(b'{"v":1,"type":"' + cls.__name__.encode() + b'"')
    doc = json.loads(data)
    assert doc["v"] == 1 and doc["type"] == cls.__name__
    back = decode_event(data)
    assert back == e and type(back) is cls
    assert encode_event(back) == data  # canonical: re-encoding is byte-identical


def test_v_may_be_absent_and_means_1() -> None:
    doc = envelope()
    del doc["v"]
    assert decode_event(dumps(doc)) == valid_event(ev.LoopIdle)


def test_decode_accepts_bytearray_and_memoryview() -> None:
    data = encode_event(valid_event(ev.StepDone))
    assert decode_event(bytearray(data)) == decode_event(memoryview(data)) == valid_event(ev.StepDone)


def test_encode_validates_first() -> None:
    with pytest.raises(InvalidEventError) as info:
        encode_event(valid_event(ev.TurnDone, turn_id=""))
    assert info.value == InvalidEventError("TurnDone", "turn_id", "must be set")
    with pytest.raises(UnknownEventTypeError):
        encode_event(object())  # type: ignore[arg-type]


# --- strictness -----------------------------------------------------------------------------------

VALID = encode_event(valid_event(ev.StepDone, messages=[ai_text("x")]))
H = header_for(ev.StepDone)
AI = '{"role":"assistant","blocks":[{"type":"text","text":"x"}]}'


def _rec(body: str, type_: str = '"StepDone"') -> bytes:
    head = ",".join(f'"{k}":"{v}"' for k, v in H.items())
    return f'{{"type":{type_},"v":1,{head},{body}}}'.encode()


BAD_RECORDS: list[tuple[str, bytes, type[LoopwireError]]] = [
    ("unknown type", dumps(envelope(type="StepExploded")), UnknownEventTypeError),
    ("type of the wrong case", dumps(envelope(type="loopidle")), UnknownEventTypeError),
    ("type not a string", dumps(envelope(type=5)), UnknownEventTypeError),
    ("missing type", dumps({k: v for k, v in envelope().items() if k != "type"}), UnknownEventTypeError),
    ("base class as type", dumps(envelope(type="Event")), UnknownEventTypeError),
    ("v 2", dumps(envelope(v=2)), UnsupportedSchemaError),
    ("v 99", dumps(envelope(v=99)), UnsupportedSchemaError),
    ("v 0", dumps(envelope(v=0)), MalformedRecordError),
    ("v -1", dumps(envelope(v=-1)), MalformedRecordError),
    ("v string", dumps(envelope(v="1")), MalformedRecordError),
    ("v true", dumps(envelope(v=True)), MalformedRecordError),
    ("v float", dumps(envelope(v=1.0)), MalformedRecordError),
    ("v null", dumps(envelope(v=None)), MalformedRecordError),
    ("duplicate top-level key", _rec(f'"messages":[{AI}],"loop_id":"{H["loop_id"]}"'), MalformedRecordError),
    ("duplicate type", _rec(f'"messages":[{AI}],"type":"StepDone"'), MalformedRecordError),
    ("case-insensitive top-level duplicate", _rec(f'"messages":[{AI}],"LOOP_ID":"x"'), MalformedRecordError),
    ("duplicate nested key", _rec('"messages":[{"role":"assistant","role":"assistant"}]'), MalformedRecordError),
    (
        "case-insensitive nested duplicate",
        _rec('"messages":[{"role":"assistant","blocks":[{"type":"text","Text":"a","text":"b"}]}]'),
        MalformedRecordError,
    ),
    (
        "duplicate inside a tool input",
        _rec(
            '"messages":[{"role":"assistant","blocks":[{"type":"tool_use","id":"t","name":"n","input":{"a":1,"a":2}}]}]'
        ),
        MalformedRecordError,
    ),
    ("invalid UTF-8", VALID.replace(b'"text":"x"', b'"text":"\xff\xfe"'), MalformedRecordError),
    ("truncated UTF-8", VALID.replace(b'"text":"x"', b'"text":"\xe2\x82"'), MalformedRecordError),
    ("UTF-8 BOM", b"\xef\xbb\xbf" + VALID, MalformedRecordError),
    ("lone surrogate escape", VALID.replace(b'"text":"x"', b'"text":"\\ud800"'), MalformedRecordError),
    ("not JSON", b"hello", MalformedRecordError),
    ("empty", b"", MalformedRecordError),
    ("truncated JSON", VALID[:-1], MalformedRecordError),
    ("trailing garbage", VALID + b"x", MalformedRecordError),
    ("two documents", VALID + VALID, MalformedRecordError),
    ("JSON array", b"[" + VALID + b"]", MalformedRecordError),
    ("JSON string", b'"StepDone"', MalformedRecordError),
    ("JSON number", b"1", MalformedRecordError),
    ("JSON null", b"null", MalformedRecordError),
    ("NaN", _rec(f'"messages":[{AI}],"extra":NaN'), MalformedRecordError),
    ("NaN in usage", _rec('"messages":[{"role":"assistant","usage":{"input_tokens":NaN}}]'), MalformedRecordError),
    ("Infinity", _rec('"messages":[{"role":"assistant","usage":{"input_tokens":-Infinity}}]'), MalformedRecordError),
    ("unknown top-level field", _rec(f'"messages":[{AI}],"extra":1'), MalformedRecordError),
    ("unknown nested field", _rec('"messages":[{"role":"assistant","colour":"red"}]'), InvalidEventError),
    ("unknown block type", _rec('"messages":[{"role":"assistant","blocks":[{"type":"audio"}]}]'), InvalidEventError),
    (
        "wrong field type",
        _rec('"messages":[{"role":"assistant","blocks":[{"type":"text","text":5}]}]'),
        InvalidEventError,
    ),
    ("float token count", _rec('"messages":[{"role":"assistant","usage":{"input_tokens":1.5}}]'), InvalidEventError),
    ("header of the wrong type", dumps(envelope(loop_id=5)), InvalidEventError),
    ("too deep", _rec('"messages":' + "[" * (MAX_DEPTH + 5) + "]" * (MAX_DEPTH + 5)), MalformedRecordError),
    ("far too deep", _rec('"messages":' + "[" * 100_000 + "]" * 100_000), MalformedRecordError),
    ("not bytes", VALID.decode(), MalformedRecordError),
]


@pytest.mark.parametrize(("label", "data", "error"), BAD_RECORDS, ids=[c[0] for c in BAD_RECORDS])
def test_decode_is_strict(label: str, data: bytes, error: type[LoopwireError]) -> None:
    with pytest.raises(LoopwireError) as info:
        decode_event(data)
    assert type(info.value) is error, f"{label}: {info.value!r}"


def test_bad_nested_shape_names_the_top_level_field() -> None:
    with pytest.raises(InvalidEventError) as info:
        decode_event(_rec('"messages":[{"role":"assistant","colour":"red"}]'))
    assert info.value == InvalidEventError("StepDone", "messages", "is invalid")
    with pytest.raises(InvalidEventError) as info:
        decode_event(dumps(envelope(ev.TurnDone, turn_index="1")))
    assert info.value == InvalidEventError("TurnDone", "turn_index", "is invalid")


def test_decode_revalidates() -> None:
    with pytest.raises(InvalidEventError) as info:
        decode_event(dumps(envelope(ev.TurnDone, turn_id="")))
    assert info.value == InvalidEventError("TurnDone", "turn_id", "must be set")
    with pytest.raises(InvalidEventError) as info:
        decode_event(dumps({k: v for k, v in envelope().items() if k != "event_id"}))
    assert info.value == InvalidEventError("LoopIdle", "event_id", "must be set")


def test_deepest_accepted_nesting_round_trips() -> None:
    # A tool input as deep as validation allows still decodes inside the record (no stack-dependent limits).
    deep = b"[" * EMBEDDED_MAX_DEPTH + b"]" * EMBEDDED_MAX_DEPTH
    ai = AIMessage(blocks=[ToolUseBlock(id="t", name="n", input=msgspec.Raw(deep))])
    for e in (
        valid_event(ev.StepDone, messages=[ai, tool_result("t", "ok")]),
        valid_event(
            ev.GateOpened,
            gate=ev.Gate(id=GATE, kind="permission", step=ev.SuspendedStep(message=ai)),
        ),
    ):
        assert decode_event(encode_event(e)) == e
    too_deep = b"[" + deep + b"]"
    ai = AIMessage(blocks=[ToolUseBlock(id="t", name="n", input=msgspec.Raw(too_deep))])
    with pytest.raises(InvalidEventError):
        encode_event(valid_event(ev.StepDone, messages=[ai, tool_result("t", "ok")]))


def test_unencodable_strings_are_a_codec_error() -> None:
    e = valid_event(ev.StepDone, messages=[AIMessage(blocks=[TextBlock(text="bad \ud800")])])
    with pytest.raises(MalformedRecordError):
        encode_event(e)


def test_record_too_large_both_ways() -> None:
    e = valid_event(ev.StepDone, messages=[ai_text("x" * 2000)])
    data = encode_event(e)
    with pytest.raises(RecordTooLargeError) as info:
        encode_event(e, max_bytes=len(data) - 1)
    assert info.value.size == len(data) and info.value.limit == len(data) - 1
    assert info.value.kind is ErrorKind.TOO_LARGE
    assert encode_event(e, max_bytes=len(data)) == data
    with pytest.raises(RecordTooLargeError):
        decode_event(data, max_bytes=len(data) - 1)
    assert decode_event(data, max_bytes=len(data)) == e
    # the default cap is 1 MiB
    big = valid_event(ev.StepDone, messages=[ai_text("x" * DEFAULT_MAX_RECORD_BYTES)])
    with pytest.raises(RecordTooLargeError):
        encode_event(big)
    with pytest.raises(RecordTooLargeError):
        decode_event(b" " * (DEFAULT_MAX_RECORD_BYTES + 1))


def test_error_hierarchy() -> None:
    for err in (
        EphemeralNotPersistableError,
        UnknownEventTypeError,
        UnsupportedSchemaError,
        MalformedRecordError,
        RecordTooLargeError,
    ):
        assert issubclass(err, CodecError) and issubclass(err, LoopwireError)
    assert issubclass(InvalidEventError, LoopwireError)
    assert all(event_class(c) is Class.ENDURING for c in ENDURING)


def test_what_encodes_also_decodes_for_tool_inputs() -> None:
    # The json module accepts a lone surrogate escape, msgspec (which decodes every record) does not:
    # validation must refuse such an input on encode rather than write a record nobody can read.
    ai = AIMessage(blocks=[ToolUseBlock(id="t", name="n", input=msgspec.Raw(b'{"a":"\\ud800"}'))])
    with pytest.raises(InvalidEventError) as info:
        encode_event(valid_event(ev.StepDone, messages=[ai, tool_result("t", "ok")]))
    assert info.value == InvalidEventError("StepDone", "messages", "is invalid")
    # a surrogate pair is fine
    ai = AIMessage(blocks=[ToolUseBlock(id="t", name="n", input=msgspec.Raw(b'{"a":"\\ud83d\\ude00"}'))])
    e = valid_event(ev.StepDone, messages=[ai, tool_result("t", "ok")])
    assert decode_event(encode_event(e)) == e
