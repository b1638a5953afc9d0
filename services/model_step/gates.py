"""Gates: opening one for a call (permission, user input) or a budget, and reading an operator's
answer into the decision its parked step continues with."""

from __future__ import annotations

import json
from typing import Final

from services.model_step import tracing
from services.model_step.budget import Verdict
from services.model_step.drive import Drive
from services.model_step.policy import (
    COPIED_GATE_APPROVED,
    FORK_REUSED,
    GATE_DENIED,
    GATE_FORK_RERUN,
    GATE_OUTCOME_UNKNOWN,
    RERUN_APPROVED,
    Authorisation,
    gate_effect,
)
from services.toolcaller.base import PlannedCall
from shared import events as ev
from shared import shaping, wiretypes
from shared.events import Event, make, new_id
from shared.history import GateState, LoopHistory, OpenTurn
from shared.wiretypes import DecisionEffect, GateReason

# What a permission gate says before the call's own summary.
OUTCOME_UNKNOWN_SUMMARY: Final = "outcome unknown (may have run already), run again? "
FORK_RERUN_SUMMARY: Final = "forked: the source made this call; approve runs it again, deny reuses its result: "
FORK_RUNNING_SUMMARY: Final = (
    "forked: the source may be running this call now; approve runs it here too, deny leaves it to the source: "
)
# The gate reason and summary prefix of each permission gate a call's authorisation opens.
_PERMISSION_GATES: Final[dict[Authorisation, tuple[GateReason, str]]] = {
    Authorisation.ASK_PERMISSION: ("", ""),
    Authorisation.ASK_UNKNOWN: (GATE_OUTCOME_UNKNOWN, OUTCOME_UNKNOWN_SUMMARY),
    Authorisation.ASK_FORK: (GATE_FORK_RERUN, FORK_RERUN_SUMMARY),
    Authorisation.ASK_FORK_RUNNING: (GATE_FORK_RERUN, FORK_RUNNING_SUMMARY),
}


async def open_call_gate(
    d: Drive, h: LoopHistory, t: OpenTurn, step_id: str, s: ev.SuspendedStep, p: PlannedCall, why: Authorisation
) -> None:
    """Park the step at a gate for ``p``'s call: a user_input gate (ASK_USER) or a permission gate."""
    gate_id = new_id()
    common: dict[str, str] = {
        "loop_id": h.loop_id,
        "turn_id": t.turn_id,
        "step_id": step_id,
        "tool_execution_id": p.execution_id,
    }
    kind: wiretypes.GateKind
    controls: list[wiretypes.GateAction]
    reason: GateReason = ""
    if why is Authorisation.ASK_USER:
        kind, controls = "user_input", ["reply"]
        question, choices = _question_of(p.call.input)
        request: Event = make(ev.UserInputRequested, **common, gate_id=gate_id, question=question, choices=choices)
    else:
        kind, controls = "permission", ["approve", "approve_always", "deny"]
        reason, prefix = _PERMISSION_GATES[why]
        summary = prefix + shaping.summary_for_call(p.call.name, p.call.input)
        request = make(
            ev.PermissionRequested,
            **common,
            request=ev.PermissionRequest(gate_id=gate_id, tool_name=p.call.name, summary=summary),
        )
    gate = ev.Gate(
        id=gate_id,
        kind=kind,
        controls=controls,
        tool_use_id=p.call.id,
        tool_name=p.call.name,
        step=s,
        reason=reason,
    )
    opened = make(ev.GateOpened, **common, gate=gate)
    tracing.gate_event("gate.opened", gate_id, kind, p.call.name)
    await d.commit(h, lambda _cur: [opened, request])


async def open_budget_gate(d: Drive, h: LoopHistory, t: OpenTurn, step_id: str, verdict: Verdict) -> None:
    """A budget gate before the step asks the model (approve: go on past the limit)."""
    gate_id = new_id()
    opened = make(
        ev.GateOpened,
        loop_id=h.loop_id,
        turn_id=t.turn_id,
        step_id=step_id,
        gate=ev.Gate(id=gate_id, kind="budget", controls=["approve", "deny"], tool_name=verdict.limits[0]),
    )
    tracing.gate_event("gate.opened", gate_id, "budget", verdict.limits[0])
    await d.commit(h, lambda _cur: [opened])


def resumed_step(h: LoopHistory, g: GateState) -> ev.SuspendedStep:
    """The step parked at ``g`` with the operator's answer as its gated call's decision."""
    assert g.resolved is not None and g.gate.step is not None
    s = g.gate.step
    effect = gate_effect(g.resolved)
    tracing.gate_event("gate.resolved", g.gate.id, g.gate.kind, g.gate.tool_name, effect=effect)
    return ev.SuspendedStep(
        message=s.message,
        calls=s.calls,
        decisions=[*s.decisions, answer_decision(h, g)],
        iteration=s.iteration,
        calls_so_far=s.calls_so_far,
    )


def answer_decision(h: LoopHistory, g: GateState) -> ev.Decision:
    """What the operator's answer at ``g`` decides for the gated call."""
    assert g.resolved is not None
    effect = gate_effect(g.resolved)
    unknown = g.gate.reason == GATE_OUTCOME_UNKNOWN

    def decision(effect: DecisionEffect, reason: str, text: str = "") -> ev.Decision:
        return ev.Decision(
            tool_use_id=g.gate.tool_use_id,
            tool_execution_id=g.tool_execution_id,
            effect=effect,
            reason=reason,
            text=text,
        )

    if effect == "approve":
        # A permission gate a fork copied open: the source may have run the call since.
        copied = h.forked is not None and g.opened_seq <= h.formed_seq and not g.gate.reason
        return decision("approve", RERUN_APPROVED if unknown else COPIED_GATE_APPROVED if copied else "gate_approved")
    if effect == "reply":
        return decision("reply", "user_reply", g.resolved.text)
    if g.gate.reason == GATE_FORK_RERUN:
        # A forked call the operator chose not to run again: it takes the source's result.
        return decision("approve", FORK_REUSED)
    why = g.resolved.reason or "denied by operator"
    return decision(
        "deny", GATE_DENIED, shaping.outcome_unknown(g.gate.tool_name) if unknown else shaping.permission_denied(why)
    )


def _question_of(raw: str) -> tuple[str, list[str]]:
    # (a gated call's arguments were checked when it was planned: this only reads them)
    try:
        args = json.loads(raw)
    except ValueError:
        return "(the model sent an unreadable question)", []
    if not isinstance(args, dict):
        return "(the model sent an unreadable question)", []
    q = args.get("question")
    choices = args.get("choices")
    question = q if isinstance(q, str) and q.strip() else "(no question given)"
    return question, [c for c in choices if isinstance(c, str)] if isinstance(choices, list) else []
