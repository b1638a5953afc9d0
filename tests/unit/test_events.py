"""Classification of every event type,
the one-place rule, and the factories."""

from __future__ import annotations

import os
import subprocess
import sys
import typing
from pathlib import Path

import msgspec
import pytest

from shared import events as ev
from shared.eventkinds import Class, Profile, Scope
from shared.events import (
    CLASSIFICATION,
    ENDURING_TYPES,
    EPHEMERAL_TYPES,
    EVENT_TYPES,
    ends_turn,
    event_class,
    event_profile,
    event_scope,
    make,
    stamp,
    type_name,
)
from shared.validate import is_rfc3339, is_uuid, validate_event
from tests.unit.test_validate import valid_event

ROOT = Path(__file__).resolve().parents[2]

EPHEMERAL = {ev.TokenDelta, ev.ToolCallStarted, ev.ToolCallCompleted, ev.ToolCallProgress}
TERMINALS = {ev.TurnDone, ev.TurnFailed, ev.TurnInterrupted}
PROFILES = {
    Profile.LOOP: {ev.LoopStarted, ev.LoopForked, ev.InputSubmitted, ev.LoopIdle, ev.LoopClosed, ev.BudgetChanged},
    Profile.TURN: {ev.TurnStarted, ev.TurnFoldedInto, ev.TurnDone, ev.TurnFailed, ev.TurnInterrupted},
    Profile.STEP: {ev.StepDone, ev.ContextCompacted, ev.TokenDelta},
    Profile.TOOL: {
        ev.PermissionRequested,
        ev.PermissionDecided,
        ev.UserInputRequested,
        ev.ToolCallStarted,
        ev.ToolCallCompleted,
        ev.ToolCallProgress,
    },
    Profile.GATE: {ev.GateOpened, ev.GateResolved},
}


def _all_subclasses(cls: type) -> set[type]:
    out: set[type] = set()
    for sub in cls.__subclasses__():
        out |= {sub} | _all_subclasses(sub)
    return out


def test_every_event_subclass_is_classified() -> None:
    defined = {c for c in _all_subclasses(ev.Event) if c.__module__ == ev.__name__}
    assert defined == set(CLASSIFICATION)
    assert len(CLASSIFICATION) == 22


def test_the_any_event_union_lists_every_type() -> None:
    assert set(typing.get_args(ev.AnyEvent)) == set(CLASSIFICATION)


def test_each_type_has_exactly_one_class_scope_and_profile() -> None:
    for cls, entry in CLASSIFICATION.items():
        klass, scope, profile, ends = entry
        assert isinstance(klass, Class) and isinstance(scope, Scope) and isinstance(profile, Profile)
        assert isinstance(ends, bool), cls


@pytest.mark.parametrize("cls", list(CLASSIFICATION), ids=lambda c: c.__name__)
def test_event_class(cls: type[ev.Event]) -> None:
    want = Class.EPHEMERAL if cls in EPHEMERAL else Class.ENDURING
    assert event_class(cls) is want
    assert event_class(valid_event(cls)) is want  # instances and types alike


def test_exactly_these_are_ephemeral() -> None:
    assert {c for c in CLASSIFICATION if event_class(c) is Class.EPHEMERAL} == EPHEMERAL
    assert {EVENT_TYPES[n] for n in EPHEMERAL_TYPES} == EPHEMERAL
    assert {EVENT_TYPES[n] for n in ENDURING_TYPES} == set(CLASSIFICATION) - EPHEMERAL
    # the named enduring events
    for cls in (ev.StepDone, ev.PermissionRequested, ev.PermissionDecided, ev.UserInputRequested):
        assert event_class(cls) is Class.ENDURING
    for cls in (ev.GateOpened, ev.GateResolved, ev.LoopIdle, ev.LoopClosed, ev.InputSubmitted):
        assert event_class(cls) is Class.ENDURING


@pytest.mark.parametrize("cls", list(CLASSIFICATION), ids=lambda c: c.__name__)
def test_ends_turn(cls: type[ev.Event]) -> None:
    assert ends_turn(cls) is (cls in TERMINALS)
    assert ends_turn(valid_event(cls)) is (cls in TERMINALS)


def test_terminals_are_enduring() -> None:
    assert all(event_class(c) is Class.ENDURING for c in TERMINALS)
    assert ends_turn(ev.StepDone) is False  # a StepDone never ends a turn


def test_scope_and_profiles() -> None:
    assert {event_scope(c) for c in CLASSIFICATION} == {Scope.LOOP}
    for profile, classes in PROFILES.items():
        assert {c for c in CLASSIFICATION if event_profile(c) is profile} == classes
    assert event_scope(valid_event(ev.StepDone)) is Scope.LOOP


def test_type_names_and_wire_tags() -> None:
    for name, cls in EVENT_TYPES.items():
        assert type_name(cls) == name == cls.__name__
        assert type_name(valid_event(cls)) == name
        assert msgspec.json.decode(msgspec.json.encode(valid_event(cls)))["type"] == name


def test_make_mints_ids_for_enduring_only() -> None:
    for cls in CLASSIFICATION:
        fields = {
            k: v for k, v in msgspec.structs.asdict(valid_event(cls)).items() if k not in ("event_id", "created_at")
        }
        e = make(cls, **fields)
        if event_class(cls) is Class.ENDURING:
            assert is_uuid(e.event_id) and is_rfc3339(e.created_at), cls
            validate_event(e)
        else:
            assert e.event_id == "" and e.created_at == "", cls


def test_make_mints_fresh_ids_and_stamp_keeps_existing_ones() -> None:
    a, b = make(ev.LoopIdle), make(ev.LoopIdle)
    assert a.event_id != b.event_id
    kept = stamp(ev.LoopIdle(event_id="55555555-5555-4555-8555-555555555555", created_at="2026-01-01T00:00:00Z"))
    assert kept.event_id == "55555555-5555-4555-8555-555555555555" and kept.created_at == "2026-01-01T00:00:00Z"
    half = stamp(ev.LoopIdle(event_id="55555555-5555-4555-8555-555555555555"))
    assert half.event_id == "55555555-5555-4555-8555-555555555555" and is_rfc3339(half.created_at)
    assert stamp(ev.TokenDelta()).event_id == ""
    assert ev.now_rfc3339().endswith("Z") and is_uuid(ev.new_id())


def test_acceptance_command_prints_the_two_classes() -> None:
    cmd = (
        "from shared.events import StepDone, ToolCallStarted, event_class; "
        "print(event_class(StepDone), event_class(ToolCallStarted))"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", cmd], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "enduring ephemeral\n"
