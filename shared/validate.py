"""``validate_event``: the rules every event must meet at the durable boundary.

The first violation wins, in this order: known type, event_id / created_at (enduring only),
identity profile (loop ▸ turn ▸ step ▸ tool), StepID ⇒ TurnID, then the body rules. Field names
in errors are the JSON field names. Validation is defensive: events built by hand with values of
the wrong Python type are reported, never crash.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import datetime
from typing import Final

import msgspec

from shared import events as ev
from shared.content import (
    AIMessage,
    ImageBlock,
    RefusalBlock,
    TextBlock,
    ThinkingBlock,
    ToolResultMessage,
    ToolUseBlock,
    UserMessage,
)
from shared.decoderrules import BACKOFF_ORDERED, COMPACTION_ADVANCES, NOT_OWN_PARENT, NOT_OWN_SOURCE
from shared.errors import InvalidEventError, Rule
from shared.eventkinds import Class, Profile
from shared.events import Event
from shared.strictjson import is_strict
from shared.wiretypes import (
    DECISION_EFFECTS,
    GATE_ACTIONS,
    GATE_KINDS,
    MAX_LIMIT_COUNT,
    MAX_LIMIT_VALUE,
    ON_UNKNOWN_OUTCOMES,
    PERMISSION_EFFECTS,
    PERMISSION_REASONS,
    POLICY_EFFECTS,
    PREVIEW_MAX_BYTES,
    PREVIEW_MAX_LINES,
    RETRYABLE_OUTCOMES,
    RFC3339_PATTERN,
    SUMMARY_MAX_BYTES,
    TOOL_NAME_PATTERN,
    TURN_FAILED_KINDS,
    UUID_PATTERN,
)

__all__ = [
    "PREVIEW_MAX_BYTES",
    "PREVIEW_MAX_LINES",
    "SUMMARY_MAX_BYTES",
    "InvalidEventError",
    "Rule",
    "is_rfc3339",
    "is_uuid",
    "validate_event",
]

# The same patterns msgspec enforces on decode (shared.wiretypes), for events built in code.
_UUID_RE: Final = re.compile(UUID_PATTERN)
# ASCII digits only (``\d`` would accept any Unicode digit); the date itself is checked by datetime.
_RFC3339_RE: Final = re.compile(RFC3339_PATTERN)

MAX_STEP_MESSAGES: Final = 10_000
TOOL_NAME_RE: Final = re.compile(TOOL_NAME_PATTERN)


def is_rfc3339(value: object) -> bool:
    """An RFC 3339 timestamp with a real date and time (``2024-02-30T...`` is refused)."""
    if not isinstance(value, str) or _RFC3339_RE.search(value) is None:
        return False
    try:
        datetime.fromisoformat(value)
    except ValueError:
        return False
    return True


IdCheck = Callable[[object], bool]


def is_uuid(value: object) -> bool:
    """Canonical lowercase 8-4-4-4-12 UUID string."""
    return isinstance(value, str) and _UUID_RE.search(value) is not None


def _fail(event: str, field: str, rule: Rule) -> InvalidEventError:
    return InvalidEventError(event, field, rule.value)


def _shape_checked(value: object) -> bool:
    """For decoded events: msgspec already matched every id and timestamp against its pattern."""
    return True


def _real_instant(value: object) -> bool:
    """For decoded events: the pattern matched; only whether the date exists is left."""
    try:
        datetime.fromisoformat(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False
    return True


def _check_id(name: str, field: str, value: object, *, required: bool, uuid: IdCheck = is_uuid) -> None:
    if not isinstance(value, str):
        raise _fail(name, field, Rule.INVALID)
    if not value:
        if required:
            raise _fail(name, field, Rule.REQUIRED)
        return
    if not required:
        raise _fail(name, field, Rule.MUST_BE_ZERO)
    if not uuid(value):
        raise _fail(name, field, Rule.INVALID)


def _check_optional_id(name: str, field: str, value: object, uuid: IdCheck = is_uuid) -> None:
    if not isinstance(value, str):
        raise _fail(name, field, Rule.INVALID)
    if value and not uuid(value):
        raise _fail(name, field, Rule.INVALID)


def validate_event(e: object, *, decoded: bool = False, inputs_checked: bool = False) -> None:
    """Return None when ``e`` is a valid event; raise :class:`InvalidEventError` otherwise.

    ``decoded``: ``e`` comes from a msgspec decoder of its own type, which already matched its header
    ids and timestamp against their patterns (``shared.wiretypes``); those are not matched again. The
    codec passes it; anything built in code is checked in full.

    ``inputs_checked``: every tool_use input in ``e`` was already found strict JSON by the caller
    (the model-step's sanitiser, or a decode of the same event), so it is not parsed again.
    """
    cls = type(e)
    uuid, instant = (_shape_checked, _real_instant) if decoded else (is_uuid, is_rfc3339)
    if not isinstance(e, Event) or cls not in ev.CLASSIFICATION:
        raise _fail(getattr(cls, "__name__", "?"), "type", Rule.UNKNOWN_TYPE)
    name = cls.__name__
    klass, _scope, profile, _ends = ev.CLASSIFICATION[cls]

    if klass is Class.ENDURING:
        if not e.event_id:
            raise _fail(name, "event_id", Rule.REQUIRED)
        if not uuid(e.event_id):
            raise _fail(name, "event_id", Rule.INVALID)
        if not isinstance(e.created_at, str) or not e.created_at:
            raise _fail(name, "created_at", Rule.REQUIRED)
        if not instant(e.created_at):
            raise _fail(name, "created_at", Rule.INVALID)
    else:
        _check_optional_id(name, "event_id", e.event_id, uuid)
        if not isinstance(e.created_at, str) or (e.created_at and not instant(e.created_at)):
            raise _fail(name, "created_at", Rule.INVALID)
    if e.v != 1:
        raise _fail(name, "v", Rule.INVALID)

    # identity profile: session (optional everywhere) ▸ loop ▸ turn ▸ step ▸ tool
    _check_optional_id(name, "session_id", e.session_id, uuid)
    _check_id(name, "loop_id", e.loop_id, required=True, uuid=uuid)
    if isinstance(e.step_id, str) and e.step_id and not e.turn_id:
        raise _fail(name, "turn_id", Rule.REQUIRED)  # StepID requires TurnID
    _check_id(name, "turn_id", e.turn_id, required=profile is not Profile.LOOP, uuid=uuid)
    _check_id(name, "step_id", e.step_id, required=profile in (Profile.STEP, Profile.TOOL, Profile.GATE), uuid=uuid)
    if profile is Profile.GATE:
        _check_optional_id(name, "tool_execution_id", e.tool_execution_id, uuid)
    else:
        _check_id(name, "tool_execution_id", e.tool_execution_id, required=profile is Profile.TOOL, uuid=uuid)
    if e.cause is not None:
        if not isinstance(e.cause, ev.Cause):
            raise _fail(name, "cause", Rule.INVALID)
        for f in ("command_id", "event_id", "tool_execution_id"):
            v = getattr(e.cause, f)
            if not isinstance(v, str) or len(v) > 128:
                raise _fail(name, "cause", Rule.INVALID)

    check = _BODY_RULES.get(cls)
    if check is not None:
        check(name, e, not inputs_checked)


# --- body rules -----------------------------------------------------------------------------------


def _require_cause_command(name: str, e: Event, strict: bool = True) -> None:
    if e.cause is None or not e.cause.command_id:
        raise _fail(name, "cause", Rule.REQUIRED)


def _check_limits(name: str, limits: object) -> None:
    if not isinstance(limits, ev.Limits):
        raise _fail(name, "limits", Rule.INVALID)
    for f in ("max_iterations", "max_calls_per_turn", "max_parallel"):
        v = getattr(limits, f)
        if not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= MAX_LIMIT_VALUE:
            raise _fail(name, "limits", Rule.INVALID)
    if not _counts_ok(limits, ("max_result_bytes", "max_tokens")) or 0 < limits.max_result_bytes < 256:
        raise _fail(name, "limits", Rule.INVALID)


def _counts_ok(struct: object, fields: tuple[str, ...]) -> bool:
    """Each of ``fields`` of ``struct`` is a whole number a client may set (0 to MAX_LIMIT_COUNT)."""
    for f in fields:
        v = getattr(struct, f, None)
        if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= MAX_LIMIT_COUNT:
            return False
    return True


_BUDGET_COUNTS: Final = ("max_total_tokens", "max_steps_per_turn")
_CONTEXT_COUNTS: Final = ("window", "trigger", "keep", "clear_at_least")


def _check_settings(name: str, budget: object, context: object) -> None:
    if not isinstance(budget, ev.Budget) or not _counts_ok(budget, _BUDGET_COUNTS):
        raise _fail(name, "budget", Rule.INVALID)
    if context is not None and (not isinstance(context, ev.ContextPolicy) or not _counts_ok(context, _CONTEXT_COUNTS)):
        raise _fail(name, "context", Rule.INVALID)


def _budget_changed(name: str, e: Event, strict: bool = True) -> None:
    assert isinstance(e, ev.BudgetChanged)
    _check_settings(name, e.budget, None)


def _loop_started(name: str, e: Event, strict: bool = True) -> None:
    assert isinstance(e, ev.LoopStarted)
    if not isinstance(e.model, str) or len(e.model) > 512:
        raise _fail(name, "model", Rule.INVALID)
    if not isinstance(e.system, str):
        raise _fail(name, "system", Rule.INVALID)
    if e.tools is not None and (
        not isinstance(e.tools, list) or not all(isinstance(t, str) and TOOL_NAME_RE.search(t) for t in e.tools)
    ):
        raise _fail(name, "tools", Rule.INVALID)
    if not isinstance(e.policy, dict) or not all(
        isinstance(k, str) and (k == "*" or TOOL_NAME_RE.search(k)) and v in POLICY_EFFECTS for k, v in e.policy.items()
    ):
        raise _fail(name, "policy", Rule.INVALID)
    _distinct_keys(name, "policy", e.policy)
    _distinct_keys(name, "retries", e.retries)
    if e.default_policy not in POLICY_EFFECTS:
        raise _fail(name, "default_policy", Rule.INVALID)
    _check_limits(name, e.limits)
    _check_settings(name, e.budget, e.context)
    if e.on_unknown not in ON_UNKNOWN_OUTCOMES:
        raise _fail(name, "on_unknown", Rule.INVALID)
    if not isinstance(e.retries, dict) or not all(
        isinstance(k, str) and TOOL_NAME_RE.match(k) and _retry_ok(v) for k, v in e.retries.items()
    ):
        raise _fail(name, "retries", Rule.INVALID)
    if any(r.initial_backoff_seconds > r.max_backoff_seconds for r in e.retries.values()):
        raise BACKOFF_ORDERED.refusal(name)
    if e.parent is not None and not _parent_ok(e.parent):
        raise _fail(name, "parent", Rule.INVALID)
    if e.parent is not None and e.parent.loop_id == e.loop_id:
        raise NOT_OWN_PARENT.refusal(name)


def _parent_ok(parent: object) -> bool:
    """A child loop names its parent's call by all its ids."""
    if not isinstance(parent, ev.ParentRef):
        return False
    ids = (parent.loop_id, parent.turn_id, parent.step_id, parent.tool_execution_id)
    name = parent.tool_name
    return all(is_uuid(i) for i in ids) and isinstance(name, str) and bool(TOOL_NAME_RE.search(name))


def _retry_ok(r: object) -> bool:
    if not isinstance(r, ev.RetryPolicy) or isinstance(r.max_attempts, bool):
        return False
    if not isinstance(r.max_attempts, int) or not 1 <= r.max_attempts <= 100:
        return False
    if not isinstance(r.retry_on, list) or not all(o in RETRYABLE_OUTCOMES for o in r.retry_on):
        return False
    lo, hi = r.initial_backoff_seconds, r.max_backoff_seconds
    return all(isinstance(x, int | float) and not isinstance(x, bool) and 0 <= x <= 3600 for x in (lo, hi))


def _user_message(name: str, field: str, message: object, strict: bool = True) -> None:
    if type(message) is not UserMessage or not _blocks_ok(message, strict):
        raise _fail(name, field, Rule.INVALID)
    if not message.blocks:
        raise _fail(name, field, Rule.REQUIRED)


def _input_submitted(name: str, e: Event, strict: bool = True) -> None:
    assert isinstance(e, ev.InputSubmitted)
    _require_cause_command(name, e)
    _user_message(name, "message", e.message, strict)


def _turn_index(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise _fail(name, "turn_index", Rule.INVALID)


def _turn_started(name: str, e: Event, strict: bool = True) -> None:
    assert isinstance(e, ev.TurnStarted | ev.TurnFoldedInto)
    _turn_index(name, e.turn_index)
    _user_message(name, "message", e.message, strict)


def _blocks_ok(message: object, strict: bool = True) -> bool:
    """Blocks are known block structs, and every tool_use input is strict JSON (``strict``: checked
    here; else the caller checked the inputs already)."""
    blocks = getattr(message, "blocks", None)
    if blocks is None:
        return True
    if not isinstance(blocks, list):
        return False
    for b in blocks:
        if isinstance(b, ToolUseBlock):
            if not isinstance(b.id, str) or not isinstance(b.name, str) or not isinstance(b.input, msgspec.Raw):
                return False
            if strict and not is_strict(bytes(b.input)):
                return False
        elif isinstance(b, TextBlock | RefusalBlock):
            if not isinstance(b.text, str):
                return False
        elif isinstance(b, ThinkingBlock):
            if not isinstance(b.thinking, str) or not isinstance(b.signature, str):
                return False
        elif not isinstance(b, ImageBlock):
            return False
    return True


def step_group_ok(messages: object, strict: bool = True) -> bool:
    """The StepDone group rule: [assistant AIMessage] + one tool-role ToolResultMessage per tool use.

    Each result's tool_use_id answers a distinct, non-empty tool_use id of element 0, exactly once
    and in order; with no tool use, the group is the AIMessage alone.
    """
    if not isinstance(messages, list) or not messages or len(messages) > MAX_STEP_MESSAGES:
        return False
    head = messages[0]
    if type(head) is not AIMessage or not _blocks_ok(head, strict):
        return False
    ids = [b.id for b in (head.blocks or ()) if isinstance(b, ToolUseBlock)]
    if any(not i for i in ids) or len(set(ids)) != len(ids):
        return False
    results = messages[1:]
    if len(results) != len(ids):
        return False
    for want, m in zip(ids, results, strict=True):
        if type(m) is not ToolResultMessage or not _blocks_ok(m, strict):
            return False
        if not isinstance(m.is_error, bool) or m.tool_use_id != want:
            return False
    return True


def _step_done(name: str, e: Event, strict: bool = True) -> None:
    assert isinstance(e, ev.StepDone)
    if not step_group_ok(e.messages, strict):
        raise _fail(name, "messages", Rule.INVALID)


def _turn_done(name: str, e: Event, strict: bool = True) -> None:
    assert isinstance(e, ev.TurnDone)
    _turn_index(name, e.turn_index)
    if e.message is not None and (type(e.message) is not AIMessage or not _blocks_ok(e.message, strict)):
        raise _fail(name, "message", Rule.INVALID)
    # usage is deliberately not checked for consistency: a divergent count never loses a turn.


def _context_compacted(name: str, e: Event, strict: bool = True) -> None:
    assert isinstance(e, ev.ContextCompacted)
    if e.previous_upto >= e.upto:
        raise COMPACTION_ADVANCES.refusal(name)
    if not e.summary.strip():
        raise _fail(name, "summary", Rule.REQUIRED)


def _turn_failed(name: str, e: Event, strict: bool = True) -> None:
    assert isinstance(e, ev.TurnFailed)
    _turn_index(name, e.turn_index)
    if not isinstance(e.err, ev.TurnError) or e.err.kind not in TURN_FAILED_KINDS:
        raise _fail(name, "err", Rule.INVALID)
    if not isinstance(e.err.message, str):
        raise _fail(name, "err", Rule.INVALID)


def _turn_interrupted(name: str, e: Event, strict: bool = True) -> None:
    assert isinstance(e, ev.TurnInterrupted)
    _turn_index(name, e.turn_index)


def _permission_requested(name: str, e: Event, strict: bool = True) -> None:
    assert isinstance(e, ev.PermissionRequested)
    r = e.request
    if not isinstance(r, ev.PermissionRequest) or not is_uuid(r.gate_id) or not r.tool_name:
        raise _fail(name, "request", Rule.INVALID)


def _permission_decided(name: str, e: Event, strict: bool = True) -> None:
    assert isinstance(e, ev.PermissionDecided)
    if e.effect not in PERMISSION_EFFECTS:
        raise _fail(name, "effect", Rule.INVALID)
    if e.reason not in PERMISSION_REASONS:
        raise _fail(name, "reason", Rule.INVALID)


def _user_input_requested(name: str, e: Event, strict: bool = True) -> None:
    assert isinstance(e, ev.UserInputRequested)
    if not is_uuid(e.gate_id):
        raise _fail(name, "gate_id", Rule.INVALID)
    if not isinstance(e.question, str) or not e.question.strip():
        raise _fail(name, "question", Rule.REQUIRED)
    if not isinstance(e.choices, list) or not all(isinstance(c, str) for c in e.choices):
        raise _fail(name, "choices", Rule.INVALID)


def _gate_opened(name: str, e: Event, strict: bool = True) -> None:
    assert isinstance(e, ev.GateOpened)
    g = e.gate
    if not isinstance(g, ev.Gate) or not is_uuid(g.id) or g.kind not in GATE_KINDS:
        raise _fail(name, "gate", Rule.INVALID)
    if not isinstance(g.controls, list) or not all(c in GATE_ACTIONS for c in g.controls):
        raise _fail(name, "gate", Rule.INVALID)
    s = g.step
    if s is not None and (
        not isinstance(s, ev.SuspendedStep)
        or type(s.message) is not AIMessage
        or not _blocks_ok(s.message, strict)
        or not isinstance(s.calls, list)
        or not all(isinstance(c, ev.RawToolUse) for c in s.calls)
        or not all(isinstance(d, ev.Decision) and d.effect in DECISION_EFFECTS for d in s.decisions)
    ):
        raise _fail(name, "gate", Rule.INVALID)


def _gate_resolved(name: str, e: Event, strict: bool = True) -> None:
    assert isinstance(e, ev.GateResolved)
    if not is_uuid(e.gate_id):
        raise _fail(name, "gate_id", Rule.INVALID)
    if e.action not in GATE_ACTIONS:
        raise _fail(name, "action", Rule.INVALID)


def _bounded(name: str, field: str, text: object, max_bytes: int, max_lines: int | None) -> None:
    if not isinstance(text, str):
        raise _fail(name, field, Rule.INVALID)
    if len(text) > max_bytes or len(text.encode("utf-8", "surrogatepass")) > max_bytes:
        raise _fail(name, field, Rule.INVALID)
    if max_lines is None:
        if any(ch < " " or ch == "\x7f" for ch in text):
            raise _fail(name, field, Rule.INVALID)
    elif text.count("\n") + 1 > max_lines:
        raise _fail(name, field, Rule.INVALID)


def _distinct_keys(name: str, field: str, d: object) -> None:
    """No two keys of a map equal case-insensitively: decoding refuses such JSON objects, so encoding must."""
    if isinstance(d, dict) and len({str(k).casefold() for k in d}) != len(d):
        raise _fail(name, field, Rule.INVALID)


def _loop_forked(name: str, e: Event, strict: bool = True) -> None:
    assert isinstance(e, ev.LoopForked)
    if not is_uuid(e.source_loop_id):
        raise _fail(name, "source_loop_id", Rule.INVALID)
    if e.source_loop_id == e.loop_id:
        raise NOT_OWN_SOURCE.refusal(name)
    _distinct_keys(name, "reexecution", e.reexecution)
    _distinct_keys(name, "changes", e.changes.policy if e.changes is not None else None)


def _tool_call_started(name: str, e: Event, strict: bool = True) -> None:
    assert isinstance(e, ev.ToolCallStarted)
    _bounded(name, "summary", e.summary, SUMMARY_MAX_BYTES, None)


def _tool_call_completed(name: str, e: Event, strict: bool = True) -> None:
    assert isinstance(e, ev.ToolCallCompleted)
    _bounded(name, "result_preview", e.result_preview, PREVIEW_MAX_BYTES, PREVIEW_MAX_LINES)


def _token_delta(name: str, e: Event, strict: bool = True) -> None:
    assert isinstance(e, ev.TokenDelta)
    _turn_index(name, e.turn_index)


_BODY_RULES: Final = {
    ev.LoopStarted: _loop_started,
    ev.LoopForked: _loop_forked,
    ev.BudgetChanged: _budget_changed,
    ev.InputSubmitted: _input_submitted,
    ev.TurnStarted: _turn_started,
    ev.TurnFoldedInto: _turn_started,
    ev.StepDone: _step_done,
    ev.ContextCompacted: _context_compacted,
    ev.TurnDone: _turn_done,
    ev.TurnFailed: _turn_failed,
    ev.TurnInterrupted: _turn_interrupted,
    ev.PermissionRequested: _permission_requested,
    ev.PermissionDecided: _permission_decided,
    ev.UserInputRequested: _user_input_requested,
    ev.GateOpened: _gate_opened,
    ev.GateResolved: _gate_resolved,
    ev.ToolCallStarted: _tool_call_started,
    ev.ToolCallCompleted: _tool_call_completed,
    ev.TokenDelta: _token_delta,
}
