"""What a loop needs next, decided from its folded history alone (so any replica decides the same).

The model-step driver asks :func:`next_action` after every commit; ``NONE`` means the loop is idle,
closed, or waiting for an operator at a gate. The committer asks :func:`may_run_calls` of a fork's
source when it writes the fork.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from shared.history import GateState, LoopHistory


class Action(Enum):
    NONE = "none"
    START_TURN = "start_turn"
    RUN_STEP = "run_step"
    FINISH_TURN = "finish_turn"
    RESUME_GATE = "resume_gate"
    IDLE = "idle"


@dataclass(frozen=True, slots=True)
class Next:
    action: Action
    gate: GateState | None = None


def resumable_gate(h: LoopHistory) -> GateState | None:
    """The latest resolved gate of the open turn whose step has not been committed yet."""
    t = h.open_turn
    if t is None:
        return None
    found: GateState | None = None
    for g in h.gates.values():
        if g.turn_id != t.turn_id or g.resolved is None or g.step_id in h.step_ids:
            continue
        if g.resolved.action == "abandoned" or g.gate.kind == "budget":
            continue  # (a budget gate parks no step: its answer is read by the budget check)
        if found is None or g.opened_seq > found.opened_seq:
            found = g
    return found


def open_gate(h: LoopHistory) -> GateState | None:
    for g in h.gates.values():
        if g.resolved is None:
            return g
    return None


def next_action(h: LoopHistory) -> Next:
    if h.config is None or h.closed or h.forming:
        return Next(Action.NONE)
    if h.open_turn is not None:
        if h.open_turn.answered:
            return Next(Action.FINISH_TURN)
        if open_gate(h) is not None:
            return Next(Action.NONE)  # waiting for an operator; the answer brings a new work signal
        g = resumable_gate(h)
        if g is not None:
            return Next(Action.RESUME_GATE, g)
        return Next(Action.RUN_STEP)
    if h.pending_inputs:
        return Next(Action.START_TURN)
    if h.turns > 0 and not h.idle:
        return Next(Action.IDLE)
    return Next(Action.NONE)


def may_run_calls(h: LoopHistory) -> bool:
    """Whether a drive of the loop may be running tool calls, or is about to: it has work to do. A
    loop that rests, is closed or forming, or waits at a gate (a step is authorised whole before
    any of its calls runs) runs none."""
    return next_action(h).action is not Action.NONE
