"""Fork points, re-identified copies and branch comparison (shared.forking), on hand-built histories."""

from __future__ import annotations

import msgspec
import pytest

from services.model_step import forkcalls
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
    source_results,
    valid_points,
)
from shared.history import fold
from shared.validate import validate_event

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


def history() -> list[tuple[int, ev.Event]]:
    cmd = ev.new_id()
    events: list[ev.Event] = [
        ev.make(ev.LoopStarted, loop_id=LOOP, model="demo", cause=ev.Cause(command_id=ev.new_id())),
        ev.make(ev.InputSubmitted, loop_id=LOOP, message=user("one"), cause=ev.Cause(command_id=cmd)),
        ev.make(
            ev.TurnStarted,
            loop_id=LOOP,
            turn_id=TURN,
            turn_index=1,
            message=user("one"),
            cause=ev.Cause(command_id=cmd),
        ),
        tool_step(0, "a"),
        tool_step(1, "b"),
        ev.make(
            ev.StepDone,
            loop_id=LOOP,
            turn_id=TURN,
            step_id=ev.step_id_for(TURN, 2),
            messages=[AIMessage(blocks=[TextBlock(text="done")])],
        ),
        ev.make(ev.TurnDone, loop_id=LOOP, turn_id=TURN, turn_index=1),
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


@pytest.mark.parametrize(
    ("last", "running"),
    [
        (None, False),
        (ev.LoopStarted(), False),
        (ev.InputSubmitted(), True),  # its turn is being driven
        (ev.TurnStarted(), True),
        (ev.StepDone(), True),  # the next step may be running its calls
        (ev.GateResolved(), True),  # the step resumes with the answer
        (ev.PermissionRequested(), False),  # a step is authorised whole before any call runs
        (ev.UserInputRequested(), False),
        (ev.TurnDone(), False),
        (ev.TurnFailed(), False),
        (ev.TurnInterrupted(), False),
        (ev.LoopIdle(), False),
        (ev.LoopClosed(), False),
    ],
    ids=lambda v: type(v).__name__ if not isinstance(v, bool) else str(v),
)
def test_a_source_may_be_running_calls_unless_it_rests_or_waits_at_a_gate(last: ev.Event | None, running: bool) -> None:
    assert forkcalls.may_be_running(last) is running
