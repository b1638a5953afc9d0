"""Hypothesis: generated valid events of every enduring type round-trip through the durable envelope,
and decoding anything else (random bytes, random JSON, mutated envelopes) raises only LoopwireError."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from shared import events as ev
from shared import wiretypes
from shared.codec import decode_event, encode_event
from shared.content import (
    UINT64_MAX,
    AIMessage,
    Block,
    ImageBlock,
    RefusalBlock,
    TextBlock,
    ThinkingBlock,
    ToolResultMessage,
    ToolUseBlock,
    Usage,
    UserMessage,
)
from shared.errors import LoopwireError, MalformedRecordError
from shared.eventkinds import Class, Profile
from shared.events import event_class, event_profile
from shared.validate import validate_event

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
ENDURING = [c for c in ev.CLASSIFICATION if event_class(c) is Class.ENDURING]

# --- strategies for valid events ----------------------------------------------------------------------

uuids = st.uuids().map(str)
texts = st.text(max_size=24)  # any Unicode but lone surrogates, control characters included
created_at = st.datetimes(min_value=datetime(1, 1, 1), max_value=datetime(9999, 12, 31), timezones=st.just(UTC)).map(
    lambda d: d.isoformat(timespec="microseconds").replace("+00:00", "Z")
)
tool_names = st.from_regex(r"[A-Za-z0-9_-]{1,20}", fullmatch=True)
counts = st.integers(0, UINT64_MAX)


def _unique_casefold(d: dict[str, Any]) -> bool:
    return len({k.casefold() for k in d}) == len(d)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64) | st.floats(allow_nan=False, allow_infinity=False) | texts,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(texts, children, max_size=4).filter(_unique_casefold)
    ),
    max_leaves=12,
)
_json_space = st.text(alphabet=" \t\n\r", max_size=2)
# Surrounding whitespace is not part of an embedded value: a block must still equal its round trip.
raw_inputs = st.builds(
    lambda pre, v, post: msgspec.Raw(pre.encode() + msgspec.json.encode(v) + post.encode()),
    _json_space,
    json_values,
    _json_space,
)

usages = st.none() | st.builds(
    Usage,
    input_tokens=counts,
    output_tokens=counts,
    cache_read_tokens=counts,
    cache_creation_tokens=counts,
    reasoning_tokens=counts,
)
plain_blocks: st.SearchStrategy[Block] = st.one_of(
    st.builds(TextBlock, text=texts),
    st.builds(RefusalBlock, text=texts),
    st.builds(ThinkingBlock, thinking=texts, signature=texts),
    st.builds(ImageBlock, media_type=texts, url=st.none() | texts, data=st.none() | texts),
)
block_lists = st.none() | st.lists(plain_blocks, max_size=4)
user_messages = st.builds(UserMessage, blocks=st.lists(plain_blocks, min_size=1, max_size=3))


@st.composite
def ai_messages(draw: st.DrawFn, max_tools: int = 4) -> AIMessage:
    ids = draw(st.lists(st.text(min_size=1, max_size=12), max_size=max_tools, unique=True))
    uses: list[Block] = [ToolUseBlock(id=i, name=draw(texts), input=draw(raw_inputs)) for i in ids]
    others = draw(st.lists(plain_blocks, max_size=3))
    blocks = draw(st.permutations(uses + others))
    if not blocks and draw(st.booleans()):
        return AIMessage(blocks=None, usage=draw(usages))
    return AIMessage(blocks=list(blocks), usage=draw(usages))


@st.composite
def step_groups(draw: st.DrawFn) -> list[Any]:
    ai = draw(ai_messages())
    results = [
        ToolResultMessage(tool_use_id=b.id, blocks=draw(block_lists), is_error=draw(st.booleans()))
        for b in ai.blocks or ()
        if isinstance(b, ToolUseBlock)
    ]
    return [ai, *results]


limits = st.builds(
    ev.Limits,
    max_iterations=st.integers(1, 1_000_000),
    max_calls_per_turn=st.integers(1, 1_000_000),
    max_parallel=st.integers(1, 1_000_000),
    max_result_bytes=st.just(0) | st.integers(256, 2**40),
    max_tokens=st.integers(0, 2**40),
)
turn_index = st.integers(1, 2**63)
decision_effects = wiretypes.DECISION_EFFECTS
suspended_steps = st.builds(
    ev.SuspendedStep,
    message=ai_messages(),
    calls=st.lists(st.builds(ev.RawToolUse, id=texts, name=texts, input=texts, minted_id=st.booleans()), max_size=3),
    decisions=st.lists(
        st.builds(
            ev.Decision,
            tool_use_id=texts,
            tool_execution_id=uuids,
            effect=st.sampled_from(decision_effects),
            reason=texts,
        ),
        max_size=3,
    ),
    iteration=st.integers(0, 100),
    calls_so_far=st.integers(0, 1000),
)

BODIES: dict[type[ev.Event], st.SearchStrategy[dict[str, Any]]] = {
    ev.LoopStarted: st.fixed_dictionaries(
        {
            "model": texts,
            "system": st.text(max_size=200),
            "tools": st.none() | st.lists(tool_names, max_size=4),
            "policy": st.dictionaries(
                tool_names | st.just("*"), st.sampled_from(wiretypes.POLICY_EFFECTS), max_size=4
            ).filter(_unique_casefold),
            "default_policy": st.sampled_from(wiretypes.POLICY_EFFECTS),
            "limits": limits,
        }
    ),
    ev.InputSubmitted: st.fixed_dictionaries(
        {"message": user_messages, "cause": st.builds(ev.Cause, command_id=uuids)}
    ),
    ev.LoopIdle: st.just({}),
    ev.LoopClosed: st.just({}),
    ev.BudgetChanged: st.fixed_dictionaries(
        {
            "budget": st.builds(
                ev.Budget,
                max_total_tokens=st.integers(0, 2**40),
                max_cost_usd=st.floats(0, 1e9),
                max_steps_per_turn=st.integers(0, 1000),
                max_turn_seconds=st.floats(0, 1e9),
                on_budget=st.sampled_from(wiretypes.ON_BUDGET_OUTCOMES),
            )
        }
    ),
    ev.LoopForked: st.fixed_dictionaries(
        {
            "source_loop_id": uuids,
            "source_seq": st.integers(0, 2**40),
            "records": st.integers(1, 10_000),
            "changes": st.builds(ev.ForkChanges, input=st.none() | texts, model=st.none() | texts),
            "reexecution": st.dictionaries(
                tool_names | st.just("*"), st.sampled_from(wiretypes.REEXECUTIONS), max_size=3
            ).filter(_unique_casefold),
        }
    ),
    ev.TurnStarted: st.fixed_dictionaries({"turn_index": turn_index, "message": user_messages}),
    ev.TurnFoldedInto: st.fixed_dictionaries({"turn_index": turn_index, "message": user_messages}),
    ev.StepDone: st.fixed_dictionaries({"messages": step_groups()}),
    ev.ContextCompacted: st.integers(1, 10_000).flatmap(
        lambda upto: st.fixed_dictionaries(
            {
                "upto": st.just(upto),
                "previous_upto": st.integers(0, upto - 1),
                "summary": st.text(min_size=1).filter(str.strip),
                "tokens_before": st.integers(0, 2**40),
                "tokens_after": st.integers(0, 2**40),
            }
        )
    ),
    ev.TurnDone: st.fixed_dictionaries(
        {"turn_index": turn_index, "message": st.none() | ai_messages(), "usage": usages}
    ),
    ev.TurnFailed: st.fixed_dictionaries(
        {
            "turn_index": turn_index,
            "err": st.builds(ev.TurnError, kind=st.sampled_from(wiretypes.TURN_FAILED_KINDS), message=texts),
        }
    ),
    ev.TurnInterrupted: st.fixed_dictionaries({"turn_index": turn_index, "reason": texts}),
    ev.PermissionRequested: st.fixed_dictionaries(
        {"request": st.builds(ev.PermissionRequest, gate_id=uuids, tool_name=st.text(min_size=1), summary=texts)}
    ),
    ev.PermissionDecided: st.fixed_dictionaries(
        {
            "tool_name": texts,
            "effect": st.sampled_from(wiretypes.PERMISSION_EFFECTS),
            "reason": st.sampled_from(wiretypes.PERMISSION_REASONS),
        }
    ),
    ev.UserInputRequested: st.fixed_dictionaries(
        {"gate_id": uuids, "question": texts.filter(lambda q: q.strip() != ""), "choices": st.lists(texts, max_size=4)}
    ),
    ev.GateOpened: st.fixed_dictionaries(
        {
            "gate": st.builds(
                ev.Gate,
                id=uuids,
                kind=st.sampled_from(wiretypes.GATE_KINDS),
                controls=st.lists(st.sampled_from(wiretypes.GATE_ACTIONS), max_size=4),
                tool_use_id=texts,
                tool_name=texts,
                step=st.none() | suspended_steps,
            )
        }
    ),
    ev.GateResolved: st.fixed_dictionaries(
        {
            "gate_id": uuids,
            "action": st.sampled_from(wiretypes.GATE_ACTIONS),
            "text": texts,
            "reason": texts,
            "resolver": texts,
        }
    ),
}
optional_ids = st.just("") | uuids
causes = st.none() | st.builds(
    ev.Cause, command_id=optional_ids, event_id=optional_ids, tool_execution_id=st.text(max_size=128)
)


@st.composite
def headers(draw: st.DrawFn, cls: type[ev.Event]) -> dict[str, Any]:
    profile = event_profile(cls)
    h: dict[str, Any] = {
        "loop_id": draw(uuids),
        "event_id": draw(uuids),
        "created_at": draw(created_at),
        "session_id": draw(optional_ids),
        "cause": draw(causes),
    }
    if profile is not Profile.LOOP:
        h["turn_id"] = draw(uuids)
    if profile in (Profile.STEP, Profile.TOOL, Profile.GATE):
        h["step_id"] = draw(uuids)
    if profile is Profile.TOOL:
        h["tool_execution_id"] = draw(uuids)
    if profile is Profile.GATE:
        h["tool_execution_id"] = draw(optional_ids)
    return h


@st.composite
def enduring_events(draw: st.DrawFn, cls: type[ev.Event] | None = None) -> ev.Event:
    cls = cls or draw(st.sampled_from(ENDURING))
    fields = {**draw(headers(cls)), **draw(BODIES[cls])}
    return cls(**fields)


def test_every_enduring_type_has_a_strategy() -> None:
    assert set(BODIES) == set(ENDURING)


# --- round trip -----------------------------------------------------------------------------------


@pytest.mark.parametrize("cls", ENDURING, ids=lambda c: c.__name__)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_round_trip_every_type(cls: type[ev.Event], data: st.DataObject) -> None:
    e = data.draw(enduring_events(cls))
    validate_event(e)
    encoded = encode_event(e)
    back = decode_event(encoded)
    assert back == e and type(back) is cls
    assert encode_event(back) == encoded


@SETTINGS
@given(messages=step_groups())
def test_round_trip_step_groups(messages: list[Any]) -> None:
    e = ev.StepDone(
        loop_id="11111111-1111-4111-8111-111111111111",
        turn_id="22222222-2222-4222-8222-222222222222",
        step_id="33333333-3333-4333-8333-333333333333",
        event_id="55555555-5555-4555-8555-555555555555",
        created_at="2026-01-01T00:00:00Z",
        messages=messages,
    )
    assert decode_event(encode_event(e)) == e


# --- decode never raises anything but LoopwireError ----------------------------------------------------


def _decode_or_typed_error(data: bytes) -> ev.Event | None:
    """Decode; a success must re-encode to an equal event, a failure must be a LoopwireError."""
    try:
        e = decode_event(data)
    except LoopwireError:
        return None
    assert decode_event(encode_event(e)) == e
    return e


@SETTINGS
@given(data=st.binary(max_size=400))
def test_decode_arbitrary_bytes(data: bytes) -> None:
    _decode_or_typed_error(data)


@SETTINGS
@given(value=json_values)
def test_decode_arbitrary_json(value: Any) -> None:
    _decode_or_typed_error(json.dumps(value).encode())


_field_values = json_values | uuids | created_at
random_records = st.fixed_dictionaries(
    {"type": st.sampled_from(sorted(ev.EVENT_TYPES)), "v": st.just(1) | json_values},
    optional={
        name: _field_values
        for name in (
            "loop_id",
            "turn_id",
            "step_id",
            "tool_execution_id",
            "event_id",
            "created_at",
            "cause",
            "messages",
            "message",
            "turn_index",
            "err",
            "gate",
            "gate_id",
            "request",
            "limits",
            "policy",
        )
    },
)


@SETTINGS
@given(record=random_records)
def test_decode_random_records(record: dict[str, Any]) -> None:
    _decode_or_typed_error(json.dumps(record).encode())


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    data = bytearray(encode_event(draw(enduring_events())))
    for _ in range(draw(st.integers(1, 3))):
        if not data:
            break
        i = draw(st.integers(0, len(data) - 1))
        op = draw(st.sampled_from(["flip", "truncate", "delete", "insert", "swap"]))
        if op == "flip":
            data[i] ^= draw(st.integers(1, 255))
        elif op == "truncate":
            del data[i:]
        elif op == "delete":
            del data[i]
        elif op == "insert":
            data[i:i] = draw(st.binary(min_size=1, max_size=4) | st.sampled_from([b'"', b"{", b"]", b",", b"\\u"]))
        else:
            j = draw(st.integers(0, len(data) - 1))
            data[i], data[j] = data[j], data[i]
    return bytes(data)


@SETTINGS
@given(data=mutated())
def test_decode_mutated_envelopes(data: bytes) -> None:
    _decode_or_typed_error(data)


def _dicts(value: Any) -> list[dict[str, Any]]:
    if isinstance(value, dict):
        return [value, *(d for v in value.values() for d in _dicts(v))]
    if isinstance(value, list):
        return [d for v in value for d in _dicts(v)]
    return []


def _dump_with_duplicate(value: Any, target: dict[str, Any], key: str) -> str:
    if isinstance(value, dict):
        items = [f"{json.dumps(k)}:{_dump_with_duplicate(v, target, key)}" for k, v in value.items()]
        if value is target:
            first = next(iter(value))
            items.append(f"{json.dumps(key)}:{_dump_with_duplicate(value[first], target, key)}")
        return "{" + ",".join(items) + "}"
    if isinstance(value, list):
        return "[" + ",".join(_dump_with_duplicate(v, target, key) for v in value) + "]"
    return json.dumps(value)


@SETTINGS
@given(e=enduring_events(), data=st.data())
def test_duplicated_keys_at_any_depth_are_refused(e: ev.Event, data: st.DataObject) -> None:
    doc = json.loads(encode_event(e))
    candidates = [d for d in _dicts(doc) if d]
    target = data.draw(st.sampled_from(candidates))
    first = next(iter(target))
    variant = first.swapcase()
    use_case_variant = data.draw(st.booleans()) and variant.casefold() == first.casefold()
    key = variant if use_case_variant else first
    record = _dump_with_duplicate(doc, target, key).encode()
    with pytest.raises(MalformedRecordError):
        decode_event(record)


@SETTINGS
@given(e=enduring_events(), cut=st.integers(0, 10_000))
def test_truncated_envelopes_are_malformed(e: ev.Event, cut: int) -> None:
    data = encode_event(e)
    assume(cut < len(data))
    with pytest.raises(MalformedRecordError):
        decode_event(data[:cut])
