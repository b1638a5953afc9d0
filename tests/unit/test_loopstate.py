"""One vocabulary of loop states from the one fold: event sequences → state and text, and the
console's summary (a lean fold) agrees with the CLI's (a full fold) on every sequence."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest

from services.console.rules import LoopSummary, count_states
from shared.content import Usage, ai_text, user_text
from shared.events import (
    Cause,
    ContextCompacted,
    Event,
    Gate,
    GateOpened,
    GateResolved,
    InputSubmitted,
    LoopClosed,
    LoopForked,
    LoopIdle,
    LoopStarted,
    StepDone,
    SuspendedStep,
    TurnDone,
    TurnError,
    TurnFailed,
    TurnInterrupted,
    TurnStarted,
    make,
)
from shared.history import LoopHistory, fold
from shared.loopstate import STATES, describe, loop_state

LOOP = str(uuid.uuid4())


def uid() -> str:
    return str(uuid.uuid4())


class Script:
    """A loop's records as the services commit them (a turn takes the first waiting input)."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.inputs: list[str] = []
        self.turn = ""
        self.index = 0
        self.gates: list[str] = []

    def add(self, e: Event) -> Script:
        self.events.append(e)
        return self

    def started(self) -> Script:
        return self.add(make(LoopStarted, loop_id=LOOP, model="demo", cause=Cause(command_id=uid())))

    def send(self, text: str = "hi") -> Script:
        self.inputs.append(uid())
        cause = Cause(command_id=self.inputs[-1])
        return self.add(make(InputSubmitted, loop_id=LOOP, message=user_text(text), cause=cause))

    def turn_starts(self) -> Script:
        self.turn, self.index = uid(), self.index + 1
        cause = Cause(command_id=self.inputs.pop(0))
        return self.add(
            make(
                TurnStarted,
                loop_id=LOOP,
                turn_id=self.turn,
                turn_index=self.index,
                message=user_text("hi"),
                cause=cause,
            )
        )

    def step(self, text: str = "ok", tokens: int = 5, cost: int = 7) -> Script:
        msg = ai_text(text, Usage(input_tokens=tokens, output_tokens=1))
        return self.add(
            make(StepDone, loop_id=LOOP, turn_id=self.turn, step_id=uid(), messages=[msg], cost_micro_usd=cost)
        )

    def gate(self, kind: str = "permission") -> Script:
        self.gates.append(uid())
        gate = Gate(id=self.gates[-1], kind=kind, controls=["approve"], tool_name="calc", step=SuspendedStep())
        return self.add(make(GateOpened, loop_id=LOOP, turn_id=self.turn, step_id=uid(), gate=gate))

    def answer(self) -> Script:
        gid = self.gates.pop(0)
        return self.add(
            make(GateResolved, loop_id=LOOP, turn_id=self.turn, gate_id=gid, action="approve", resolver="al")
        )

    def done(self) -> Script:
        return self.add(make(TurnDone, loop_id=LOOP, turn_id=self.turn, turn_index=self.index))

    def failed(self) -> Script:
        err = TurnError(kind="model_error", message="boom")
        return self.add(make(TurnFailed, loop_id=LOOP, turn_id=self.turn, turn_index=self.index, err=err))

    def interrupted(self) -> Script:
        return self.add(make(TurnInterrupted, loop_id=LOOP, turn_id=self.turn, turn_index=self.index, reason="x"))

    def idle(self) -> Script:
        return self.add(make(LoopIdle, loop_id=LOOP))

    def closed(self) -> Script:
        return self.add(make(LoopClosed, loop_id=LOOP, cause=Cause(command_id=uid())))


def forming() -> Script:
    s = Script()
    s.add(make(LoopForked, loop_id=LOOP, source_loop_id=uid(), source_seq=4, records=3))
    return s.started().send()  # one announced record is still missing


def formed() -> Script:
    return forming().turn_starts()


CASES: dict[str, tuple[Callable[[], Script], str, str]] = {
    "started": (lambda: Script().started(), "idle", "idle"),
    "input waits": (lambda: Script().started().send(), "running", "running (input pending)"),
    "turn runs": (lambda: Script().started().send().turn_starts(), "running", "running (turn 1)"),
    "turn runs, input queued": (lambda: Script().started().send().turn_starts().send(), "running", "running (turn 1)"),
    "one gate": (lambda: Script().started().send().turn_starts().gate(), "waiting", "waiting (1 gate)"),
    "two gates": (lambda: Script().started().send().turn_starts().gate().gate(), "waiting", "waiting (2 gates)"),
    "a gate answered": (
        lambda: Script().started().send().turn_starts().gate().gate().answer(),
        "waiting",
        "waiting (1 gate)",
    ),
    "gates answered": (
        lambda: Script().started().send().turn_starts().gate().gate().answer().answer(),
        "running",
        "running (turn 1)",
    ),
    "turn done": (lambda: Script().started().send().turn_starts().step().done().idle(), "idle", "idle"),
    "turn failed": (
        lambda: Script().started().send().turn_starts().step().failed().idle(),
        "failed",
        "failed (turn 1: model_error)",
    ),
    "failed, then an input": (
        lambda: Script().started().send().turn_starts().failed().send(),
        "running",
        "running (input pending)",
    ),
    "failed, then a turn done": (
        lambda: Script().started().send().turn_starts().failed().send().turn_starts().done(),
        "idle",
        "idle",
    ),
    "interrupted at a gate": (lambda: Script().started().send().turn_starts().gate().interrupted(), "idle", "idle"),
    "closed at a gate": (lambda: Script().started().send().turn_starts().gate().closed(), "closed", "closed"),
    "closed after a failure": (lambda: Script().started().send().turn_starts().failed().closed(), "closed", "closed"),
    "fork forming": (forming, "forming", "forming (repeat the fork to finish)"),
    "fork formed": (formed, "running", "running (turn 1)"),
}


def records(script: Script) -> list[tuple[int, Event]]:
    return [(i + 1, e) for i, e in enumerate(script.events)]


def summary(script: Script) -> LoopSummary:
    s = LoopSummary(loop_id=LOOP)
    for seq, e in records(script):
        assert s.apply(e, seq)
    return s


@pytest.mark.parametrize("case", list(CASES))
def test_state_and_text_of_each_sequence(case: str) -> None:
    build, state, text = CASES[case]
    h = fold(records(build()))
    assert (loop_state(h), describe(h)) == (state, text)
    assert describe(h).split(" ")[0] == state and state in STATES


@pytest.mark.parametrize("case", list(CASES))
def test_console_and_cli_agree(case: str) -> None:
    script = CASES[case][0]()
    full = fold(records(script))  # what the CLI folds
    s = summary(script)
    assert s.state == loop_state(full) == s.to_json()["state"] == loop_state(s.fold)
    assert [g.gate_id for g in s.open_gates] == [g.gate.id for g in full.open_gates]
    assert (s.turns, s.pending_inputs, s.closed) == (full.turns, len(full.pending_inputs), full.closed)
    assert (s.input_tokens, s.output_tokens, s.cost_micro_usd) == (
        full.usage.input_tokens,
        full.usage.output_tokens,
        full.cost_micro_usd,
    )
    assert count_states([s])[s.state] == 1


def test_every_prefix_agrees() -> None:
    script = Script().started().send().turn_starts().gate().send().answer().step().failed().send().turn_starts()
    script.gate().interrupted().closed()
    s = LoopSummary(loop_id=LOOP)
    h = LoopHistory(loop_id=LOOP)
    for seq, e in records(script):
        s.apply(e, seq)
        h.apply(e, seq)
        assert s.state == loop_state(h), (seq, type(e).__name__)


def test_a_lean_fold_keeps_no_messages_but_counts_them() -> None:
    script = Script().started().send().turn_starts().step().step().done().send().turn_starts().gate()
    script.add(make(ContextCompacted, loop_id=LOOP, turn_id=script.turn, upto=3, usage=Usage(input_tokens=100)))
    full = fold(records(script))
    lean = LoopHistory(loop_id=LOOP, lean=True)
    for seq, e in records(script):
        lean.apply(e, seq)
    assert lean.messages == [] and lean.step_ids == set() and lean.commands == {}
    assert lean.message_count == len(full.messages) == 4
    assert lean.compaction is not None and full.compaction is not None and lean.compaction.upto == 3
    assert lean.copy() == lean and lean.pending_inputs == [] and lean.lean
    assert lean.usage == full.usage and lean.cost_micro_usd == full.cost_micro_usd
    assert [g.gate.step for g in lean.gates.values()] == [None] and full.gates[script.gates[0]].gate.step is not None
    assert lean.turns == full.turns and (lean.last_outcome, lean.last_turn_index) == ("done", 1)


def test_the_fold_records_how_the_last_turn_ended() -> None:
    h = fold(records(Script().started().send().turn_starts().failed()))
    assert (h.last_outcome, h.last_turn_index) == ("failed", 1)
    assert h.last_error is not None and (h.last_error.kind, h.last_error.message) == ("model_error", "boom")
    h = fold(records(Script().started().send().turn_starts().failed().send().turn_starts().interrupted()))
    assert (h.last_outcome, h.last_turn_index, h.last_error) == ("interrupted", 2, None)


def test_console_reports_the_failure_and_the_budget_from_the_fold() -> None:
    s = summary(Script().started().send("why?").turn_starts().step(tokens=3, cost=11).failed())
    doc = s.to_json()
    assert (doc["state"], doc["last_error"], doc["title"], doc["turns"]) == ("failed", "model_error: boom", "why?", 1)
    assert (doc["input_tokens"], doc["output_tokens"], doc["tokens"], doc["cost_usd"]) == (3, 1, 4, 0.000011)
    assert s.model == "demo" and s.started_at and s.open_turn == "" and s.last_outcome == "failed"
