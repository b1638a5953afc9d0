"""validate_event: the identity matrix, the body rules and the StepDone group matrix.

Covers identity, the StepDone message group (from validate, encode and decode alike) and an unknown
role (the same InvalidEventError, see docs/architecture.md).

``header_for`` / ``valid_event`` / ``step_json`` are reused by the other unit test modules.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any

import msgspec
import pytest

from shared import events as ev
from shared import wiretypes
from shared.codec import decode_event, encode_event
from shared.content import (
    AIMessage,
    ImageBlock,
    RefusalBlock,
    SystemMessage,
    TextBlock,
    ThinkingBlock,
    ToolResultMessage,
    ToolUseBlock,
    Usage,
    ai_text,
    tool_result,
    user_text,
)
from shared.errors import InvalidEventError, MalformedRecordError, Rule
from shared.eventkinds import Class, Profile
from shared.events import event_class, event_profile
from shared.validate import PREVIEW_MAX_BYTES, PREVIEW_MAX_LINES, SUMMARY_MAX_BYTES, validate_event

LOOP = "11111111-1111-4111-8111-111111111111"
TURN = "22222222-2222-4222-8222-222222222222"
STEP = "33333333-3333-4333-8333-333333333333"
TOOL = "44444444-4444-4444-8444-444444444444"
EVENT = "55555555-5555-4555-8555-555555555555"
GATE = "66666666-6666-4666-8666-666666666666"
CMD = "77777777-7777-4777-8777-777777777777"
CREATED = "2026-01-02T03:04:05.123456Z"


def header_for(cls: type[ev.Event]) -> dict[str, Any]:
    """The minimal valid header fields of ``cls`` (ids by its identity profile)."""
    profile = event_profile(cls)
    h: dict[str, Any] = {"loop_id": LOOP}
    if profile is not Profile.LOOP:
        h["turn_id"] = TURN
    if profile in (Profile.STEP, Profile.TOOL, Profile.GATE):
        h["step_id"] = STEP
    if profile is Profile.TOOL:
        h["tool_execution_id"] = TOOL
    if event_class(cls) is Class.ENDURING:
        h["event_id"] = EVENT
        h["created_at"] = CREATED
    return h


def tool_use(id_: str, name: str = "calculator", raw: bytes = b'{"expression":"1+2"}') -> ToolUseBlock:
    return ToolUseBlock(id=id_, name=name, input=msgspec.Raw(raw))


def ai_with_tools(*ids: str) -> AIMessage:
    return AIMessage(blocks=[TextBlock(text="let me check"), *(tool_use(i) for i in ids)])


_BODIES: dict[type[ev.Event], Callable[[], dict[str, Any]]] = {
    ev.LoopStarted: lambda: {"model": "demo", "policy": {"*": "allow", "calculator": "ask"}},
    ev.InputSubmitted: lambda: {"message": user_text("hi"), "cause": ev.Cause(command_id=CMD)},
    ev.LoopIdle: dict,
    ev.LoopClosed: dict,
    ev.BudgetChanged: lambda: {
        "budget": ev.Budget(max_cost_usd=0.5, on_budget="ask"),
        "cause": ev.Cause(command_id=CMD),
    },
    ev.LoopForked: lambda: {"source_loop_id": "5e7a9c1e-3a5c-4e7a-9c1e-3a5c7e9a1c3e", "source_seq": 7, "records": 3},
    ev.TurnStarted: lambda: {"turn_index": 1, "message": user_text("hi"), "cause": ev.Cause(command_id=CMD)},
    ev.TurnFoldedInto: lambda: {"turn_index": 1, "message": user_text("more"), "cause": ev.Cause(command_id=CMD)},
    ev.StepDone: lambda: {"messages": [ai_with_tools("t1"), tool_result("t1", "3")]},
    ev.ContextCompacted: lambda: {"upto": 4, "summary": "read a.txt", "tokens_before": 900, "tokens_after": 200},
    ev.TurnDone: lambda: {"turn_index": 1, "message": ai_text("3"), "usage": Usage(input_tokens=5)},
    ev.TurnFailed: lambda: {"turn_index": 1, "err": ev.TurnError(kind="tool_limit", message="too many")},
    ev.TurnInterrupted: lambda: {"turn_index": 1, "reason": "interrupt"},
    ev.PermissionRequested: lambda: {
        "request": ev.PermissionRequest(gate_id=GATE, tool_name="calculator", summary="calculator {}")
    },
    ev.PermissionDecided: lambda: {"tool_name": "calculator", "effect": "approve", "reason": "policy_allow"},
    ev.UserInputRequested: lambda: {"gate_id": GATE, "question": "which?", "choices": ["a", "b"]},
    ev.GateOpened: lambda: {
        "gate": ev.Gate(
            id=GATE,
            kind="permission",
            controls=["approve", "deny"],
            tool_use_id="t1",
            tool_name="calculator",
            step=ev.SuspendedStep(
                message=ai_with_tools("t1"),
                calls=[ev.RawToolUse(id="t1", name="calculator", input='{"expression":"1+2"}')],
            ),
        )
    },
    ev.GateResolved: lambda: {"gate_id": GATE, "action": "approve", "resolver": "operator"},
    ev.TokenDelta: lambda: {"turn_index": 1, "chunk": ev.Chunk(kind="text", text="he")},
    ev.ToolCallStarted: lambda: {"tool_name": "calculator", "tool_use_id": "t1", "summary": "calculator {}"},
    ev.ToolCallCompleted: lambda: {"tool_use_id": "t1", "is_error": False, "result_preview": "3", "duration_ms": 4},
    ev.ToolCallProgress: lambda: {"message": "still working"},
}


def valid_event(cls: type[ev.Event], **overrides: Any) -> ev.Event:
    """A valid instance of ``cls``; ``overrides`` replace header or body fields."""
    fields = {**header_for(cls), **_BODIES[cls](), **overrides}
    return cls(**fields)


def step_json(messages: Any, **overrides: Any) -> bytes:
    """A hand-built StepDone envelope with a valid header around ``messages`` (any JSON value)."""
    doc = {"type": "StepDone", "v": 1, **header_for(ev.StepDone), "messages": messages, **overrides}
    return json.dumps(doc).encode()


def expect_invalid(event: object, field: str, rule: Rule, name: str | None = None) -> None:
    with pytest.raises(InvalidEventError) as info:
        validate_event(event)
    want = InvalidEventError(name or type(event).__name__, field, rule.value)
    assert info.value == want, f"got {info.value}, want {want}"


ALL_TYPES = list(ev.CLASSIFICATION)
ENDURING = [c for c in ALL_TYPES if event_class(c) is Class.ENDURING]
EPHEMERAL = [c for c in ALL_TYPES if event_class(c) is Class.EPHEMERAL]


# --- valid events ----------------------------------------------------------------------------------


@pytest.mark.parametrize("cls", ALL_TYPES, ids=lambda c: c.__name__)
def test_builders_make_valid_events(cls: type[ev.Event]) -> None:
    validate_event(valid_event(cls))


def test_ephemeral_events_need_no_event_id_or_created_at() -> None:
    for cls in EPHEMERAL:
        e = valid_event(cls)
        assert e.event_id == "" and e.created_at == ""
        validate_event(e)


def test_optional_session_id_and_cause() -> None:
    validate_event(valid_event(ev.LoopIdle, session_id=str(uuid.uuid4()), cause=ev.Cause(event_id=EVENT)))


# --- identity matrix -----------------------------------------------------------------------------

IDENTITY_CASES: list[tuple[str, type[ev.Event], dict[str, Any], str, Rule]] = [
    ("zero event_id", ev.StepDone, {"event_id": ""}, "event_id", Rule.REQUIRED),
    ("zero event_id (loop event)", ev.LoopStarted, {"event_id": ""}, "event_id", Rule.REQUIRED),
    ("event_id not a uuid", ev.TurnDone, {"event_id": "evt-1"}, "event_id", Rule.INVALID),
    ("event_id uppercase", ev.TurnDone, {"event_id": EVENT.upper().replace("5", "A")}, "event_id", Rule.INVALID),
    ("event_id without dashes", ev.TurnDone, {"event_id": EVENT.replace("-", "")}, "event_id", Rule.INVALID),
    ("ephemeral bad event_id", ev.ToolCallStarted, {"event_id": "nope"}, "event_id", Rule.INVALID),
    ("created_at missing", ev.StepDone, {"created_at": ""}, "created_at", Rule.REQUIRED),
    ("created_at not a time", ev.StepDone, {"created_at": "yesterday"}, "created_at", Rule.INVALID),
    ("created_at no zone", ev.StepDone, {"created_at": "2026-01-02T03:04:05"}, "created_at", Rule.INVALID),
    ("created_at impossible date", ev.StepDone, {"created_at": "2026-02-30T03:04:05Z"}, "created_at", Rule.INVALID),
    ("created_at hour 24", ev.StepDone, {"created_at": "2026-01-02T24:00:00Z"}, "created_at", Rule.INVALID),
    ("created_at unicode digits", ev.StepDone, {"created_at": "２０２６-01-02T03:04:05Z"}, "created_at", Rule.INVALID),
    ("v 2 on an event", ev.LoopIdle, {"v": 2}, "v", Rule.INVALID),
    ("session_id not a uuid", ev.LoopIdle, {"session_id": "s1"}, "session_id", Rule.INVALID),
    ("missing loop_id", ev.LoopStarted, {"loop_id": ""}, "loop_id", Rule.REQUIRED),
    ("missing loop_id (tool event)", ev.ToolCallStarted, {"loop_id": ""}, "loop_id", Rule.REQUIRED),
    ("loop_id not a uuid", ev.LoopIdle, {"loop_id": "loop-1"}, "loop_id", Rule.INVALID),
    ("loop_id wrong python type", ev.LoopIdle, {"loop_id": 5}, "loop_id", Rule.INVALID),
    ("loop event with turn_id", ev.LoopStarted, {"turn_id": TURN}, "turn_id", Rule.MUST_BE_ZERO),
    ("loop event with turn_id (input)", ev.InputSubmitted, {"turn_id": TURN}, "turn_id", Rule.MUST_BE_ZERO),
    ("loop event with step_id, no turn", ev.LoopIdle, {"step_id": STEP}, "turn_id", Rule.REQUIRED),
    ("loop event with step and turn", ev.LoopIdle, {"turn_id": TURN, "step_id": STEP}, "turn_id", Rule.MUST_BE_ZERO),
    ("loop event with tool id", ev.LoopClosed, {"tool_execution_id": TOOL}, "tool_execution_id", Rule.MUST_BE_ZERO),
    ("turn event without turn_id", ev.TurnStarted, {"turn_id": ""}, "turn_id", Rule.REQUIRED),
    ("turn_id not a uuid", ev.TurnDone, {"turn_id": "t"}, "turn_id", Rule.INVALID),
    ("turn event with step_id", ev.TurnDone, {"step_id": STEP}, "step_id", Rule.MUST_BE_ZERO),
    ("turn event with tool id", ev.TurnFailed, {"tool_execution_id": TOOL}, "tool_execution_id", Rule.MUST_BE_ZERO),
    ("step_id without turn_id", ev.StepDone, {"turn_id": ""}, "turn_id", Rule.REQUIRED),
    ("step_id without turn_id (tool)", ev.ToolCallStarted, {"turn_id": ""}, "turn_id", Rule.REQUIRED),
    ("StepDone without step_id", ev.StepDone, {"step_id": ""}, "step_id", Rule.REQUIRED),
    ("TokenDelta without step_id", ev.TokenDelta, {"step_id": ""}, "step_id", Rule.REQUIRED),
    ("ToolCallStarted without step_id", ev.ToolCallStarted, {"step_id": ""}, "step_id", Rule.REQUIRED),
    ("step_id not a uuid", ev.StepDone, {"step_id": "s"}, "step_id", Rule.INVALID),
    ("step event with tool id", ev.StepDone, {"tool_execution_id": TOOL}, "tool_execution_id", Rule.MUST_BE_ZERO),
    ("TokenDelta with tool id", ev.TokenDelta, {"tool_execution_id": TOOL}, "tool_execution_id", Rule.MUST_BE_ZERO),
    ("gate event without step_id", ev.GateOpened, {"step_id": ""}, "step_id", Rule.REQUIRED),
    ("gate event bad tool id", ev.GateResolved, {"tool_execution_id": "x"}, "tool_execution_id", Rule.INVALID),
    ("cause of the wrong type", ev.LoopIdle, {"cause": "cmd"}, "cause", Rule.INVALID),
    ("cause id too long", ev.LoopIdle, {"cause": ev.Cause(command_id="x" * 129)}, "cause", Rule.INVALID),
]
TOOL_EVENTS = [c for c in ALL_TYPES if event_profile(c) is Profile.TOOL]
IDENTITY_CASES += [
    (f"{c.__name__} without tool_execution_id", c, {"tool_execution_id": ""}, "tool_execution_id", Rule.REQUIRED)
    for c in TOOL_EVENTS
]
IDENTITY_CASES += [
    (f"{c.__name__} tool id not a uuid", c, {"tool_execution_id": "exec-1"}, "tool_execution_id", Rule.INVALID)
    for c in TOOL_EVENTS
]


@pytest.mark.parametrize(
    ("label", "cls", "overrides", "field", "rule"), IDENTITY_CASES, ids=[c[0] for c in IDENTITY_CASES]
)
def test_identity_matrix(label: str, cls: type[ev.Event], overrides: dict[str, Any], field: str, rule: Rule) -> None:
    expect_invalid(valid_event(cls, **overrides), field, rule)


def test_identity_applies_to_every_profile() -> None:
    assert {c[1] for c in IDENTITY_CASES} >= {ev.LoopStarted, ev.TurnDone, ev.StepDone, ev.ToolCallStarted}
    assert len(TOOL_EVENTS) == 6


def test_gate_events_may_name_the_gated_call() -> None:
    for cls in (ev.GateOpened, ev.GateResolved):
        validate_event(valid_event(cls, tool_execution_id=TOOL))
        validate_event(valid_event(cls))


def test_first_violation_wins() -> None:
    # event_id is checked before identity; loop before turn; StepID ⇒ TurnID before the step itself.
    expect_invalid(valid_event(ev.StepDone, event_id="", loop_id=""), "event_id", Rule.REQUIRED)
    expect_invalid(valid_event(ev.StepDone, loop_id="", turn_id=""), "loop_id", Rule.REQUIRED)
    expect_invalid(valid_event(ev.StepDone, turn_id="", messages=[]), "turn_id", Rule.REQUIRED)
    expect_invalid(valid_event(ev.TurnFailed, turn_id="", err=ev.TurnError(kind="x")), "turn_id", Rule.REQUIRED)


def test_unknown_types() -> None:
    expect_invalid(object(), "type", Rule.UNKNOWN_TYPE, name="object")
    expect_invalid({"type": "StepDone"}, "type", Rule.UNKNOWN_TYPE, name="dict")

    class Rogue(ev.Event):  # an Event subclass nobody classified
        pass

    expect_invalid(Rogue(loop_id=LOOP), "type", Rule.UNKNOWN_TYPE)


# --- body rules ---------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", wiretypes.TURN_FAILED_KINDS)
def test_turn_failed_kinds(kind: str) -> None:
    validate_event(valid_event(ev.TurnFailed, err=ev.TurnError(kind=kind, message="m")))


@pytest.mark.parametrize("kind", ["", "boom", "EMPTY_RESPONSE", "tool_limit "])
def test_turn_failed_unknown_kind(kind: str) -> None:
    expect_invalid(valid_event(ev.TurnFailed, err=ev.TurnError(kind=kind)), "err", Rule.INVALID)


@pytest.mark.parametrize("cls", [c for c in ALL_TYPES if "turn_index" in c.__struct_fields__], ids=lambda c: c.__name__)
@pytest.mark.parametrize("index", [0, -1, True, "1"])
def test_turn_index_must_be_positive(cls: type[ev.Event], index: object) -> None:
    expect_invalid(valid_event(cls, turn_index=index), "turn_index", Rule.INVALID)


BODY_CASES: list[tuple[str, type[ev.Event], dict[str, Any], str, Rule]] = [
    ("summary too long", ev.ToolCallStarted, {"summary": "x" * (SUMMARY_MAX_BYTES + 1)}, "summary", Rule.INVALID),
    ("summary too many bytes", ev.ToolCallStarted, {"summary": "é" * 513}, "summary", Rule.INVALID),
    ("summary with newline", ev.ToolCallStarted, {"summary": "a\nb"}, "summary", Rule.INVALID),
    ("summary with tab", ev.ToolCallStarted, {"summary": "a\tb"}, "summary", Rule.INVALID),
    ("summary with DEL", ev.ToolCallStarted, {"summary": "a\x7fb"}, "summary", Rule.INVALID),
    ("summary not text", ev.ToolCallStarted, {"summary": b"x"}, "summary", Rule.INVALID),
    ("preview too long", ev.ToolCallCompleted, {"result_preview": "x" * 2049}, "result_preview", Rule.INVALID),
    ("preview too many bytes", ev.ToolCallCompleted, {"result_preview": "€" * 683}, "result_preview", Rule.INVALID),
    ("preview 21 lines", ev.ToolCallCompleted, {"result_preview": "l\n" * 20 + "l"}, "result_preview", Rule.INVALID),
    ("LoopStarted bad policy effect", ev.LoopStarted, {"policy": {"calculator": "maybe"}}, "policy", Rule.INVALID),
    ("LoopStarted bad policy tool", ev.LoopStarted, {"policy": {"bad name": "allow"}}, "policy", Rule.INVALID),
    ("LoopStarted bad default policy", ev.LoopStarted, {"default_policy": "yes"}, "default_policy", Rule.INVALID),
    # Keys equal but for case: strict decoding refuses such an object, so encoding must too.
    (
        "LoopStarted policy keys by case",
        ev.LoopStarted,
        {"policy": {"J": "allow", "j": "deny"}},
        "policy",
        Rule.INVALID,
    ),
    (
        "LoopStarted retries keys by case",
        ev.LoopStarted,
        {"retries": {"Calc": ev.RetryPolicy(), "calc": ev.RetryPolicy()}},
        "retries",
        Rule.INVALID,
    ),
    (
        "LoopForked reexecution keys by case",
        ev.LoopForked,
        {"source_loop_id": str(uuid.uuid4()), "reexecution": {"J": "reuse", "j": "reuse"}},
        "reexecution",
        Rule.INVALID,
    ),
    (
        "LoopForked changed policy keys by case",
        ev.LoopForked,
        {"source_loop_id": str(uuid.uuid4()), "changes": ev.ForkChanges(policy={"A": "ask", "a": "ask"})},
        "changes",
        Rule.INVALID,
    ),
    ("LoopStarted bad tool name", ev.LoopStarted, {"tools": ["ok", "not ok"]}, "tools", Rule.INVALID),
    ("LoopStarted model too long", ev.LoopStarted, {"model": "m" * 513}, "model", Rule.INVALID),
    ("LoopStarted zero iterations", ev.LoopStarted, {"limits": ev.Limits(max_iterations=0)}, "limits", Rule.INVALID),
    ("LoopStarted zero calls", ev.LoopStarted, {"limits": ev.Limits(max_calls_per_turn=0)}, "limits", Rule.INVALID),
    ("LoopStarted zero parallel", ev.LoopStarted, {"limits": ev.Limits(max_parallel=0)}, "limits", Rule.INVALID),
    (
        "LoopStarted result cap < 256",
        ev.LoopStarted,
        {"limits": ev.Limits(max_result_bytes=255)},
        "limits",
        Rule.INVALID,
    ),
    ("LoopStarted negative tokens", ev.LoopStarted, {"limits": ev.Limits(max_tokens=-1)}, "limits", Rule.INVALID),
    ("InputSubmitted without cause", ev.InputSubmitted, {"cause": None}, "cause", Rule.REQUIRED),
    ("InputSubmitted without command", ev.InputSubmitted, {"cause": ev.Cause(event_id=EVENT)}, "cause", Rule.REQUIRED),
    ("InputSubmitted empty message", ev.InputSubmitted, {"message": ev.UserMessage()}, "message", Rule.REQUIRED),
    ("InputSubmitted AI message", ev.InputSubmitted, {"message": ai_text("x")}, "message", Rule.INVALID),
    ("TurnStarted empty message", ev.TurnStarted, {"message": ev.UserMessage(blocks=[])}, "message", Rule.REQUIRED),
    ("TurnFoldedInto system message", ev.TurnFoldedInto, {"message": SystemMessage()}, "message", Rule.INVALID),
    ("TurnDone user message", ev.TurnDone, {"message": user_text("x")}, "message", Rule.INVALID),
    (
        "PermissionRequested bad gate",
        ev.PermissionRequested,
        {"request": ev.PermissionRequest()},
        "request",
        Rule.INVALID,
    ),
    ("PermissionDecided bad effect", ev.PermissionDecided, {"effect": "maybe"}, "effect", Rule.INVALID),
    ("PermissionDecided bad reason", ev.PermissionDecided, {"reason": "because"}, "reason", Rule.INVALID),
    ("UserInputRequested bad gate", ev.UserInputRequested, {"gate_id": "g"}, "gate_id", Rule.INVALID),
    ("UserInputRequested blank question", ev.UserInputRequested, {"question": "  "}, "question", Rule.REQUIRED),
    ("UserInputRequested bad choices", ev.UserInputRequested, {"choices": [1]}, "choices", Rule.INVALID),
    ("GateOpened bad id", ev.GateOpened, {"gate": ev.Gate(id="g", kind="permission")}, "gate", Rule.INVALID),
    ("GateOpened bad kind", ev.GateOpened, {"gate": ev.Gate(id=GATE, kind="other")}, "gate", Rule.INVALID),
    (
        "GateOpened bad control",
        ev.GateOpened,
        {"gate": ev.Gate(id=GATE, kind="permission", controls=["x"])},
        "gate",
        Rule.INVALID,
    ),
    ("GateResolved bad id", ev.GateResolved, {"gate_id": ""}, "gate_id", Rule.INVALID),
    ("GateResolved bad action", ev.GateResolved, {"action": "maybe"}, "action", Rule.INVALID),
]


@pytest.mark.parametrize(("label", "cls", "overrides", "field", "rule"), BODY_CASES, ids=[c[0] for c in BODY_CASES])
def test_body_rules(label: str, cls: type[ev.Event], overrides: dict[str, Any], field: str, rule: Rule) -> None:
    expect_invalid(valid_event(cls, **overrides), field, rule)


def test_bounds_at_the_limit_pass() -> None:
    validate_event(valid_event(ev.ToolCallStarted, summary="x" * SUMMARY_MAX_BYTES))
    validate_event(valid_event(ev.ToolCallStarted, summary="€" * (SUMMARY_MAX_BYTES // 3)))
    validate_event(valid_event(ev.ToolCallCompleted, result_preview="x" * PREVIEW_MAX_BYTES))
    validate_event(valid_event(ev.ToolCallCompleted, result_preview="\n".join(["l"] * PREVIEW_MAX_LINES)))
    validate_event(valid_event(ev.ToolCallCompleted, result_preview="tabs\tand\rcontrols\x00are fine"))
    validate_event(valid_event(ev.LoopStarted, limits=ev.Limits(max_result_bytes=256), tools=[], policy={}))
    validate_event(valid_event(ev.LoopStarted, tools=None, default_policy="deny"))


def test_turn_done_usage_is_not_checked_for_consistency() -> None:
    # Reasoning > output never loses a turn.
    validate_event(valid_event(ev.TurnDone, usage=Usage(output_tokens=1, reasoning_tokens=99)))
    validate_event(valid_event(ev.TurnDone, message=None, usage=None))


# --- the StepDone group matrix ----------------------------------------------------------------------

A1 = ai_with_tools("t1")
A2 = ai_with_tools("t1", "t2")
R1 = tool_result("t1", "3")
R2 = tool_result("t2", "4")


def _j(m: Any) -> Any:
    return json.loads(msgspec.json.encode(m))


# (label, python messages, hand-built JSON messages or None when JSON cannot express the case)
BAD_GROUPS: list[tuple[str, Any, Any]] = [
    ("nil group", None, None),
    ("empty group", [], []),
    ("None first", [None], [None]),
    ("None first then AI", [None, ai_text("x")], [None, _j(ai_text("x"))]),
    ("AI of the wrong type", [{"role": "assistant"}], [{"role": "assistant", "blocks": 5}]),
    ("AI with an unknown field", [AIMessage(blocks="x")], [{"role": "assistant", "blocks": [], "tool_use_id": "t1"}]),
    ("tool first", [R1], [_j(R1)]),
    ("tool first then AI", [R1, A1], [_j(R1), _j(A1)]),
    ("user first", [user_text("hi")], [_j(user_text("hi"))]),
    ("system first", [SystemMessage(blocks=[TextBlock(text="s")])], [{"role": "system", "blocks": []}]),
    ("second AI", [ai_text("a"), ai_text("b")], [_j(ai_text("a")), _j(ai_text("b"))]),
    ("AI, result, AI", [A1, R1, ai_text("b")], [_j(A1), _j(R1), _j(ai_text("b"))]),
    ("system after AI", [A1, SystemMessage()], [_j(A1), {"role": "system"}]),
    ("user after AI", [A1, user_text("x")], [_j(A1), _j(user_text("x"))]),
    ("None tool", [A1, None], [_j(A1), None]),
    (
        "tool with assistant role",
        [A1, AIMessage(blocks=[TextBlock(text="3")])],
        [_j(A1), {**_j(R1), "role": "assistant"}],
    ),
    ("unknown role alien", [A1, object()], [_j(A1), {**_j(R1), "role": "alien"}]),
    ("unknown role alien first", [object()], [{"role": "alien", "blocks": []}]),
    ("missing role", [A1, {"tool_use_id": "t1"}], [_j(A1), {"tool_use_id": "t1", "blocks": []}]),
    ("unpaired tool_use", [A1], [_j(A1)]),
    ("one of two unpaired", [A2, R1], [_j(A2), _j(R1)]),
    ("result for an unknown id", [A1, tool_result("t9", "x")], [_j(A1), _j(tool_result("t9", "x"))]),
    ("result without a tool use", [ai_text("x"), R1], [_j(ai_text("x")), _j(R1)]),
    ("duplicated tool_use_id", [A2, R1, R1], [_j(A2), _j(R1), _j(R1)]),
    ("extra result", [A1, R1, R1], [_j(A1), _j(R1), _j(R1)]),
    ("results out of order", [A2, R2, R1], [_j(A2), _j(R2), _j(R1)]),
    (
        "duplicate tool_use ids in element 0",
        [ai_with_tools("t1", "t1"), R1, R1],
        [_j(ai_with_tools("t1", "t1")), _j(R1), _j(R1)],
    ),
    ("empty tool_use id", [ai_with_tools(""), tool_result("", "x")], [_j(ai_with_tools("")), _j(tool_result("", "x"))]),
    ("invalid JSON tool input", [AIMessage(blocks=[tool_use("t1", raw=b"{not valid json")]), R1], None),
    ("duplicate keys in tool input", [AIMessage(blocks=[tool_use("t1", raw=b'{"a":1,"A":2}')]), R1], None),
    ("result of the wrong type", [A1, {"role": "tool", "tool_use_id": "t1"}], [_j(A1), {**_j(R1), "is_error": "no"}]),
    ("is_error not a bool", [A1, ToolResultMessage(tool_use_id="t1", is_error=1)], [_j(A1), {**_j(R1), "is_error": 1}]),
    (
        "unknown block in result",
        [A1, ToolResultMessage(tool_use_id="t1", blocks=["x"])],
        [_j(A1), {**_j(R1), "blocks": [{"type": "audio"}]}],
    ),
    ("messages not a list", (ai_text("x"),), {"role": "assistant"}),
]
VALID_GROUPS: list[tuple[str, list[Any]]] = [
    ("AI only", [ai_text("the answer is 3")]),
    ("AI with no blocks", [AIMessage()]),
    ("AI with empty blocks", [AIMessage(blocks=[])]),
    ("AI + one result", [A1, R1]),
    ("AI + results", [A2, R1, tool_result("t2", "boom", is_error=True)]),
    (
        "every block kind",
        [
            AIMessage(
                blocks=[
                    ThinkingBlock(thinking="hmm", signature="sig"),
                    TextBlock(text="x"),
                    RefusalBlock(text="no"),
                    ImageBlock(media_type="image/png", data="AAAA"),
                    tool_use("a", raw=b' {"deep": [1, {"x": null}]} '),
                ],
                usage=Usage(input_tokens=1, output_tokens=2),
            ),
            ToolResultMessage(tool_use_id="a", blocks=[TextBlock(text="ok")]),
        ],
    ),
]
STEP_INVALID = InvalidEventError("StepDone", "messages", "is invalid")


@pytest.mark.parametrize(("label", "messages", "doc"), BAD_GROUPS, ids=[c[0] for c in BAD_GROUPS])
def test_step_done_matrix_validate_and_encode(label: str, messages: Any, doc: Any) -> None:
    e = valid_event(ev.StepDone, messages=messages)
    with pytest.raises(InvalidEventError) as v_err:
        validate_event(e)
    assert v_err.value == STEP_INVALID
    with pytest.raises(InvalidEventError) as e_err:
        encode_event(e)
    assert e_err.value == STEP_INVALID


DECODABLE_BAD_GROUPS = [(c[0], c[2]) for c in BAD_GROUPS if c[2] is not None or c[0] == "nil group"]


@pytest.mark.parametrize(("label", "doc"), DECODABLE_BAD_GROUPS, ids=[c[0] for c in DECODABLE_BAD_GROUPS])
def test_step_done_matrix_decode(label: str, doc: Any) -> None:
    with pytest.raises(InvalidEventError) as d_err:
        decode_event(step_json(doc))
    assert d_err.value == STEP_INVALID


def test_step_done_missing_messages_decodes_as_invalid() -> None:
    data = json.dumps({"type": "StepDone", "v": 1, **header_for(ev.StepDone)}).encode()
    with pytest.raises(InvalidEventError) as err:
        decode_event(data)
    assert err.value == STEP_INVALID


@pytest.mark.parametrize(("label", "messages"), VALID_GROUPS, ids=[c[0] for c in VALID_GROUPS])
def test_step_done_valid_groups_pass_all_three(label: str, messages: list[Any]) -> None:
    e = valid_event(ev.StepDone, messages=messages)
    validate_event(e)
    data = encode_event(e)
    assert decode_event(data) == e
    # and the same group written by hand decodes too (tool inputs keep the hand-written bytes)
    by_hand = decode_event(step_json([_j(m) for m in messages]))
    assert json.loads(encode_event(by_hand)) == json.loads(data)


def test_step_done_message_cap() -> None:
    # At most 10,000 messages: an AIMessage with 9,999 tool uses and their results fits, one more does not.
    def group(n: int) -> list[Any]:
        ids = [f"t{i}" for i in range(n)]
        return [ai_with_tools(*ids), *(tool_result(i, "x") for i in ids)]

    validate_event(valid_event(ev.StepDone, messages=group(9_999)))
    expect_invalid(valid_event(ev.StepDone, messages=group(10_000)), "messages", Rule.INVALID)


def test_invalid_tool_input_cannot_reach_a_record() -> None:
    # JSON cannot embed "{not valid json"; a tool input with duplicate keys makes the whole record
    # non-strict, so decode refuses it as malformed before the group rule is reached.
    ai = _j(A1)
    ai["blocks"][1]["input"] = {"a": 1}
    data = step_json([ai, _j(R1)]).replace(b'{"a": 1}', b'{"a": 1, "A": 2}')
    with pytest.raises(MalformedRecordError):
        decode_event(data)
