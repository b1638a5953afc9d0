"""Fork points, re-identified copies and branch comparison (shared.forking), on hand-built histories."""

from __future__ import annotations

import dataclasses

import msgspec
import pytest

from services.model_step.forkcalls import copied_view
from services.model_step.policy import ForkWay, fork_way
from services.model_step.steps import may_run_calls
from shared import events as ev
from shared.content import AIMessage, TextBlock, ToolResultMessage, ToolUseBlock, UserMessage, text_of
from shared.forking import (
    ForkPointError,
    ForkSpec,
    build_fork,
    call_key,
    check_point,
    common_prefix,
    content_of,
    source_calls,
    source_results,
    valid_points,
)
from shared.history import fold
from shared.validate import validate_event
from shared.wiretypes import Reexecution

LOOP = "0f3c9a52-1b7e-4c1a-9e55-2d6b8f0a7c11"
NEW = "5e7a9c1e-3a5c-4e7a-9c1e-3a5c7e9a1c3e"
TURN = "6a1d2e4f-3b5c-4d7e-8f90-a1b2c3d4e5f6"


def user(text: str) -> UserMessage:
    return UserMessage(blocks=[TextBlock(text=text)])


def tool_step(k: int, note: str) -> ev.StepDone:
    step = ev.step_id_for(TURN, k)
    use = ToolUseBlock(id=f"t{k}", name="ledger", input=msgspec.Raw(f'{{"note": "{note}"}}'.encode()))
    return ev.make(
        ev.StepDone,
        loop_id=LOOP,
        turn_id=TURN,
        step_id=step,
        messages=[AIMessage(blocks=[use]), ToolResultMessage(tool_use_id=f"t{k}", blocks=[TextBlock(text=note)])],
    )


def opening(command_id: str) -> list[ev.Event]:
    """A loop's start, its first input (sent by ``command_id``) and the turn it starts."""
    return [
        ev.make(ev.LoopStarted, loop_id=LOOP, model="demo", cause=ev.Cause(command_id=ev.new_id())),
        ev.make(ev.InputSubmitted, loop_id=LOOP, message=user("one"), cause=ev.Cause(command_id=command_id)),
        ev.make(
            ev.TurnStarted,
            loop_id=LOOP,
            turn_id=TURN,
            turn_index=1,
            message=user("one"),
            cause=ev.Cause(command_id=command_id),
        ),
    ]


def final_answer() -> list[ev.Event]:
    """The turn's third step answers, and the turn ends."""
    return [
        ev.make(
            ev.StepDone,
            loop_id=LOOP,
            turn_id=TURN,
            step_id=ev.step_id_for(TURN, 2),
            messages=[AIMessage(blocks=[TextBlock(text="done")])],
        ),
        ev.make(ev.TurnDone, loop_id=LOOP, turn_id=TURN, turn_index=1),
    ]


def history() -> list[tuple[int, ev.Event]]:
    events: list[ev.Event] = [
        *opening(ev.new_id()),
        tool_step(0, "a"),
        tool_step(1, "b"),
        *final_answer(),
        ev.make(ev.LoopIdle, loop_id=LOOP),
    ]
    return [(10 + 3 * i, e) for i, e in enumerate(events)]  # sequences are global: gaps between a loop's records


def spec(at: int, **changes: object) -> ForkSpec:
    return ForkSpec(NEW, LOOP, at, ev.new_id(), ev.now_rfc3339(), ev.ForkChanges(**changes), {})


def test_points_are_inputs_steps_and_turn_ends_but_not_a_step_committed_with_its_turn_end() -> None:
    h = history()
    assert valid_points(h) == [13, 19, 22, 28]  # input, two tool steps, TurnDone (not the final StepDone at 25)
    assert check_point(h, None) == 28
    with pytest.raises(ForkPointError, match=r"seq 25 \(StepDone\) is not a fork point.*nearest valid: 22, 28"):
        check_point(h, 25)
    with pytest.raises(ForkPointError, match=r"seq 11 \(not a record of this loop\).*nearest valid: 13"):
        check_point(h, 11)


def test_copies_are_re_identified_consistently_and_equal_in_content() -> None:
    h = history()
    out = build_fork(spec(19), h, ev.new_id())
    assert isinstance(out[0], ev.LoopForked) and out[0].records == len(out) - 1 == 4
    for e in out:
        validate_event(e)
        assert e.loop_id == NEW and e.event_id not in {x.event_id for _, x in h}
    assert [content_of(e) for e in out[1:]] == [content_of(e) for s, e in h if s <= 19]
    steps = [e for e in out if isinstance(e, ev.StepDone)]
    new_turn = steps[0].turn_id
    assert new_turn != TURN and steps[0].step_id == ev.step_id_for(new_turn, 0)
    f = fold([(i + 1, e) for i, e in enumerate(out)])
    assert not f.forming and f.open_turn is not None and f.open_turn.steps == 1  # continues with step index 1
    assert f.forked is not None and f.forked.source_seq == 19
    # A retried fork derives the same ids.
    again = build_fork(
        ForkSpec(NEW, LOOP, 19, out[1].cause.command_id, out[1].created_at, ev.ForkChanges(), {}),
        h,
        out[0].event_id,
    )
    assert [e.event_id for e in again] == [e.event_id for e in out]


def test_input_is_replaced_at_an_input_point_and_added_elsewhere() -> None:
    h = history()
    at_input = build_fork(spec(13, input="edited"), h, ev.new_id())
    inputs = [e for e in at_input if isinstance(e, ev.InputSubmitted)]
    assert [text_of(i.message) for i in inputs] == ["edited"]
    after_turn = build_fork(spec(28, input="next", model="other"), h, ev.new_id())
    inputs = [e for e in after_turn if isinstance(e, ev.InputSubmitted)]
    assert [text_of(i.message) for i in inputs] == ["one", "next"]
    started = after_turn[1]
    assert isinstance(started, ev.LoopStarted) and started.model == "other"
    assert len(fold([(i + 1, e) for i, e in enumerate(after_turn)]).pending_inputs) == 1


def test_source_results_match_calls_by_value_and_branches_compare_without_ids() -> None:
    h = history()
    found = source_results(h, 19)  # only calls after the point
    assert set(found) == {call_key("ledger", '{"note":"b"}')}
    assert call_key("ledger", '{ "note" : "b" }') == call_key("ledger", b'{"note": "b"}')
    fork = build_fork(spec(28), h, ev.new_id())
    mine = [(i, e) for i, e in enumerate(fork[1:])]
    assert common_prefix(mine, [(s, e) for s, e in h if s <= 28]) == 7


def gated_source() -> list[ev.Event]:
    """A source whose first step waits at a gate while a second input comes, then goes on."""
    gate, one, two = ev.new_id(), ev.new_id(), ev.new_id()
    step = ev.step_id_for(TURN, 1)
    return [
        *opening(one),
        tool_step(0, "a"),
        ev.make(
            ev.GateOpened,
            loop_id=LOOP,
            turn_id=TURN,
            step_id=step,
            gate=ev.Gate(id=gate, kind="permission", tool_use_id="t1", tool_name="ledger"),
        ),
        ev.make(ev.InputSubmitted, loop_id=LOOP, message=user("two"), cause=ev.Cause(command_id=two)),
        ev.make(ev.GateResolved, loop_id=LOOP, turn_id=TURN, step_id=step, gate_id=gate, action="approve"),
        tool_step(1, "b"),
        *final_answer(),
        ev.make(ev.LoopClosed, loop_id=LOOP),
    ]


@pytest.mark.parametrize(
    ("records", "running"),
    [
        (1, False),  # started, no input
        (2, True),  # an input: a turn starts
        (3, True),
        (4, True),  # the next step may be running its calls
        (5, False),  # waits at a gate: a step is authorised whole before any of its calls runs
        (6, False),  # still waits there, with an input queued
        (7, True),  # answered: the step runs its calls
        (8, True),
        (9, True),  # answered: the turn ends
        (10, True),  # ended, the queued input starts the next turn
        (11, False),  # closed
    ],
    ids=lambda v: str(v),
)
def test_a_source_may_be_running_calls_while_it_has_work_to_do(records: int, running: bool) -> None:
    events = gated_source()[:records]
    assert may_run_calls(fold([(10 + i, e) for i, e in enumerate(events)])) is running


@pytest.mark.parametrize(
    ("rule", "source_result", "source_busy", "rerun_safe", "waited", "way"),
    [
        # The source committed a result of an equal call: the fork's rule decides.
        ("reuse", True, False, False, False, ForkWay.REUSE),
        ("rerun", True, True, False, False, ForkWay.RERUN),
        ("ask", True, True, True, True, ForkWay.ASK),
        # No result, and the source rests: the source never made the call after the point.
        ("ask", False, False, False, False, ForkWay.ORDINARY),
        # No result, the source may be running it: as an unknown outcome — harmless tools run,
        ("rerun", False, True, True, False, ForkWay.ORDINARY),
        ("reuse", False, True, True, False, ForkWay.ORDINARY),
        # any other waits for the source, then asks (whatever the rule: there is nothing to reuse).
        ("ask", False, True, False, False, ForkWay.WAIT),
        ("reuse", False, True, False, False, ForkWay.WAIT),
        ("reuse", False, True, False, True, ForkWay.ASK_RUNNING),
        ("rerun", False, True, False, True, ForkWay.ASK_RUNNING),
    ],
    ids=[
        "committed-reuse",
        "committed-rerun",
        "committed-ask",
        "source-rests-without-it",
        "busy-read-only",
        "busy-idempotent",
        "busy-destructive",
        "busy-destructive-reuse",
        "still-busy-after-waiting",
        "still-busy-rerun-rule",
    ],
)
def test_what_a_fork_does_with_a_call_its_source_made_or_may_be_making(
    rule: Reexecution, source_result: bool, source_busy: bool, rerun_safe: bool, waited: bool, way: ForkWay
) -> None:
    got = fork_way(rule, source_result=source_result, source_busy=source_busy, rerun_safe=rerun_safe, waited=waited)
    assert got is way


def test_a_fork_carries_its_sources_calls_after_the_point_and_reads_them_from_there() -> None:
    h = history()
    copied = source_calls(h, 19, busy=False)
    fork = build_fork(dataclasses.replace(spec(19), source_calls=copied), h, ev.new_id())
    forked = fork[0]
    assert isinstance(forked, ev.LoopForked)
    validate_event(forked)
    again = msgspec.json.decode(msgspec.json.encode(forked), type=ev.LoopForked)  # as stored and read back
    view = copied_view(again)
    assert view is not None and not view.busy
    assert set(view.results) == {call_key("ledger", '{"note":"b"}')}
    assert text_of(view.results[call_key("ledger", '{"note": "b"}')]) == "b"
    assert view.copied
    # A fork of a source at work keeps what it copied (the calls then in flight stay of unknown
    # outcome); only one written without the copy reads its source.
    busy = copied_view(msgspec.structs.replace(again, source_calls=source_calls(h, 19, busy=True)))
    assert busy is not None and busy.busy and busy.copied and set(busy.results) == set(view.results)
    assert copied_view(msgspec.structs.replace(again, source_calls=None)) is None
