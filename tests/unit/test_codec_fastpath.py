"""The codec's canonical fast path accepts and refuses exactly what the strict path does."""

from __future__ import annotations

from collections.abc import Callable

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from shared import codec
from shared import events as ev
from shared.content import AIMessage, TextBlock, ToolUseBlock, UserMessage, tool_result
from shared.errors import LoopwireError
from shared.events import make, new_id
from tests.unit.test_properties import enduring_events


def _outcome(decode: Callable[[bytes], object], data: bytes) -> tuple[str, object]:
    try:
        return ("ok", decode(data))
    except LoopwireError as e:
        return (type(e).__name__, str(e))


def _strict(data: bytes) -> object:
    original = codec._decode_canonical
    codec._decode_canonical = lambda _data: None  # type: ignore[assignment]
    try:
        return codec.decode_event(data)
    finally:
        codec._decode_canonical = original


def _mutations(data: bytes, draw: st.DataObject) -> bytes:
    kind = draw.draw(st.sampled_from(["flip", "cut", "insert", "dup_key", "case_key", "same"]))
    if kind == "same" or not data:
        return data
    i = draw.draw(st.integers(0, len(data) - 1))
    if kind == "flip":
        return data[:i] + bytes([data[i] ^ draw.draw(st.integers(1, 255))]) + data[i + 1 :]
    if kind == "cut":
        return data[:i]
    if kind == "insert":
        return data[:i] + draw.draw(st.binary(min_size=1, max_size=4)) + data[i:]
    if kind == "dup_key":
        return data.replace(b'"loop_id":', b'"loop_id":"x","loop_id":', 1)
    return data.replace(b'"loop_id":', b'"LOOP_ID":"x","loop_id":', 1)


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_fast_and_strict_paths_agree(data: st.DataObject) -> None:
    event = data.draw(enduring_events())
    record = _mutations(codec.encode_event(event), data)
    fast = _outcome(codec.decode_event, record)
    strict = _outcome(_strict, record)
    assert fast == strict


def test_fast_path_is_taken_for_a_canonical_step() -> None:
    loop, turn, step = new_id(), new_id(), new_id()
    call = ToolUseBlock(id="t1", name="calculator", input=msgspec.Raw(b'{"expression":"1+1"}'))
    event = make(
        ev.StepDone,
        loop_id=loop,
        turn_id=turn,
        step_id=step,
        messages=[AIMessage(blocks=[TextBlock(text="hi"), call]), tool_result("t1", "2")],
    )
    record = codec.encode_event(event)
    assert codec._decode_canonical(record) == event  # taken
    assert codec._decode_canonical(record.replace(b'"hi"', rb'"\u0068i"')) is None  # not canonical: strict path
    assert codec.decode_event(record) == event


def _with_call(raw: bytes) -> list[ev.Event]:
    """An event of every fast-path type whose messages can hold a tool_use input, holding ``raw``."""
    loop, turn, step = new_id(), new_id(), new_id()
    call = ToolUseBlock(id="t1", name="calculator", input=msgspec.Raw(raw))
    user = UserMessage(blocks=[TextBlock(text="hi"), call])
    cause = ev.Cause(command_id=new_id())
    return [
        make(ev.InputSubmitted, loop_id=loop, message=user, cause=cause),
        make(ev.TurnStarted, loop_id=loop, turn_id=turn, turn_index=1, message=user, cause=cause),
        make(ev.TurnFoldedInto, loop_id=loop, turn_id=turn, turn_index=1, message=user, cause=cause),
        make(ev.TurnDone, loop_id=loop, turn_id=turn, turn_index=1, message=AIMessage(blocks=[call])),
        make(
            ev.StepDone,
            loop_id=loop,
            turn_id=turn,
            step_id=step,
            messages=[AIMessage(blocks=[call]), tool_result("t1", "2")],
        ),
    ]


def test_messages_with_tool_use_inputs_take_the_fast_path_and_bad_inputs_are_refused_alike() -> None:
    for event in _with_call(b'{"expression":"1+1"}'):
        record = codec.encode_event(event)
        assert codec._decode_canonical(record) == event, type(event).__name__  # taken
        assert codec.decode_event(record) == event
    deep = b'{"a":' * 300 + b"1" + b"}" * 300
    for raw in (b'{"a":1,"a":2}', b'{"a":1,"A":2}', deep):
        for event in _with_call(b"{}"):
            # A hand-made record with the input spliced in: canonical bytes, a bad input.
            record = codec.encode_event(event).replace(b'"input":{}', b'"input":' + raw)
            assert _outcome(codec.decode_event, record) == _outcome(_strict, record), type(event).__name__
            assert _outcome(codec.decode_event, record)[0] != "ok"


def test_a_loop_start_takes_the_fast_path_unless_its_maps_hold_keys_differing_only_in_case() -> None:
    loop = new_id()
    started = make(
        ev.LoopStarted,
        loop_id=loop,
        model="demo",
        policy={"calculator": "allow", "*": "ask"},
        retries={"calculator": ev.RetryPolicy(max_attempts=2)},
        cause=ev.Cause(command_id=new_id()),
    )
    record = codec.encode_event(started)
    assert codec._decode_canonical(record) == started
    assert codec.decode_event(record) == started
    for field in (b'"policy":{"calculator"', b'"retries":{"calculator"'):
        # Canonical bytes (msgspec keeps both keys of a map it decodes from them), one key twice in case.
        bad = record.replace(
            field, field[: field.index(b"{") + 1] + b'"CALCULATOR":' + _value_of(record, field) + b',"calculator"'
        )
        assert codec._decode_canonical(bad) is None
        assert _outcome(codec.decode_event, bad) == _outcome(_strict, bad)
        assert _outcome(codec.decode_event, bad)[0] != "ok"


def _value_of(record: bytes, field: bytes) -> bytes:
    """The JSON value of the first key of the map that ``field`` opens (an object or a string)."""
    start = record.index(field) + len(field) + 1
    if record[start : start + 1] == b"{":
        return record[start : record.index(b"}", start) + 1]
    return record[start : record.index(b'"', start + 1) + 1]
