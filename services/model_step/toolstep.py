"""A step's tool calls: authorise each in call order (:func:`~services.model_step.policy.authorise`
on the facts gathered here), parking the step at the first gate, then run the batch and commit it."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Final

import anyio

from services.model_step import forkcalls, gates, turns
from services.model_step.drive import Drive
from services.model_step.policy import (
    FORK_NO_RESULT,
    FORK_REUSED,
    ON_UNKNOWN_ASK,
    OUTCOME_UNKNOWN,
    RECORDED_RESULT,
    Authorisation,
    CallFacts,
    Prior,
    SourceFacts,
    authorise,
    has_policy,
    policy_effect,
)
from services.model_step.steps import always_allowed, execution_id_for
from services.toolcaller.base import PlannedCall, RecordFit
from services.toolcaller.client import outcome_of
from services.toolcaller.executor import caller_span
from services.toolwire.spec import KIND_USER_INPUT
from shared import events as ev
from shared import shaping
from shared.events import make
from shared.history import LoopHistory, OpenTurn
from shared.jsapi import is_gone
from shared.results import DONE, CallRecord, args_digest
from shared.toolcall import ToolCall
from shared.wiretypes import DecisionEffect

RECORD_POLL_SECONDS: Final = 0.1
WORKER_PING_SECONDS: Final = 0.5
# Each call's permission event when the loop's policy decided it (None: nothing recorded).
_RECORDED_EFFECTS: Final[dict[Authorisation, tuple[DecisionEffect, str]]] = {
    Authorisation.ALLOW_GRANTED: ("approve", "always_allowed"),
    Authorisation.ALLOW_POLICY: ("approve", "policy_allow"),
    Authorisation.DENY_POLICY: ("deny", "policy_deny"),
}


async def run_calls(
    d: Drive,
    h: LoopHistory,
    t: OpenTurn,
    step_id: str,
    s: ev.SuspendedStep,
    calls: list[ToolCall] | None = None,
    *,
    rerun: bool = False,
) -> None:
    """Authorise every call in call order (opening at most one gate), then run the batch and commit.

    ``calls``: the step's calls as just checked (:func:`shared.shaping.sanitize_step`); None for
    a step continued from its record (its plan or a gate), whose calls are checked here.

    ``rerun``: calls of this step may have been sent before (the step is continued from its plan
    or a gate); each call's record decides — finished: its outcome is reused; possibly run but
    unfinished: run again only if the tool is read-only or idempotent, else the loop's
    ``on_unknown`` (an error result, or a gate).
    """
    decided = {x.tool_use_id: x for x in s.decisions}
    grants = always_allowed(h)
    planned: list[PlannedCall] = []
    for call in calls if calls is not None else [ToolCall.of(c) for c in s.calls]:
        p = PlannedCall(call=call, execution_id=execution_id_for(step_id, call.id), fresh=not rerun)
        planned.append(p)
        way, view = await _authorise(d, h, p, decided.get(call.id), grants, rerun)
        match way:
            case (
                Authorisation.ASK_UNKNOWN
                | Authorisation.ASK_FORK
                | Authorisation.ASK_FORK_RUNNING
                | Authorisation.ASK_USER
                | Authorisation.ASK_PERMISSION
            ):
                await gates.open_call_gate(d, h, t, step_id, s, p, way)
                return  # the step parks at the gate
            case _:
                s = _act(h, t, step_id, p, way, decided.get(call.id), view, s)
    d.check()
    config = h.config
    async with d.waiting_on_calls():
        results = await d.shared.execute(
            loop_id=h.loop_id,
            turn_id=t.turn_id,
            step_id=step_id,
            planned=planned,
            limits=config.limits if config else ev.Limits(),
            spec_of=lambda name: d.tool_spec(h, name),
            fence=d.guard,
            retries=config.retries if config else None,
            fit=RecordFit(s.message, d.settings.max_record_bytes),
        )
    await turns.commit_tool_step(d, h, t, step_id, s.message, planned, results)


async def _authorise(
    d: Drive, h: LoopHistory, p: PlannedCall, known: ev.Decision | None, grants: frozenset[str], rerun: bool
) -> tuple[Authorisation, forkcalls.SourceView | None]:
    """Gather the call's facts, reading a fork's source as far as the decision needs it."""
    call = p.call
    prior = await _prior(d, p) if rerun and d.shared.results is not None and not call.minted_id else Prior.NONE
    spec = d.tool_spec(h, call.name)
    config = h.config
    facts = CallFacts(
        effect=policy_effect(config, call.name, grants),
        granted=call.name in grants,
        has_policy=has_policy(config),
        known_tool=spec is not None,
        user_input=spec is not None and spec.kind == KIND_USER_INPUT,
        rerun_safe=spec is not None and spec.rerun_safe,
        minted=call.minted_id,
        invalid=bool(call.invalid),
        prior=prior,
        decided=known.reason if known is not None else None,
        ask_on_unknown=config is not None and config.on_unknown == ON_UNKNOWN_ASK,
        fork_rule=forkcalls.reexecution_for(h.forked, call.name, spec) if h.forked is not None else None,
    )
    view: forkcalls.SourceView | None = None
    while True:
        way = authorise(facts)
        match way:
            case Authorisation.READ_SOURCE:
                view = await d.source_view(h)
            case Authorisation.WAIT_FOR_SOURCE:
                assert spec is not None
                wait = min(float(spec.timeout_seconds or 0.0), forkcalls.SOURCE_WAIT_SECONDS)
                view = await _settled_view(d, h, p, wait)
            case _:
                return way, view
        outcome = forkcalls.recorded_outcome(view.results, call.name, call.input)
        waited = way is Authorisation.WAIT_FOR_SOURCE or (facts.source is not None and facts.source.waited)
        source = SourceFacts(result=outcome is not None, busy=view.busy, waited=waited, copied=view.copied)
        facts = replace(facts, source=source)


def _act(
    h: LoopHistory,
    t: OpenTurn,
    step_id: str,
    p: PlannedCall,
    way: Authorisation,
    known: ev.Decision | None,
    view: forkcalls.SourceView | None,
    s: ev.SuspendedStep,
) -> ev.SuspendedStep:
    """Set ``p``'s decision (and the outcome it takes, if any); return the step with the decisions
    a gate opened later stores (a decision taken here is added to it, a recorded one is in it)."""
    call = p.call

    def decision(effect: DecisionEffect, reason: str, text: str = "") -> ev.Decision:
        return ev.Decision(
            tool_use_id=call.id, tool_execution_id=p.execution_id, effect=effect, reason=reason, text=text
        )

    match way:
        case Authorisation.UNCHECKED:
            return s  # a pre-execution failure: the executor reports it, no authorisation
        case Authorisation.REUSE_RECORDED:
            p.decision = decision("approve", RECORDED_RESULT)  # (its outcome was read with its record)
            return s
        case Authorisation.DENY_UNKNOWN:
            p.decision = decision("deny", OUTCOME_UNKNOWN, shaping.outcome_unknown(call.name))
            return s
        case Authorisation.KEEP_DECIDED:
            p.decision = known
            return s
        case Authorisation.KEEP_SOURCE_RESULT:
            assert view is not None
            p.decision, p.recorded = known, forkcalls.recorded_outcome(view.results, call.name, call.input)
            return s
        case Authorisation.DENY_NO_SOURCE_RESULT:
            p.decision = decision("deny", FORK_NO_RESULT, shaping.fork_no_source_result(call.name))
            return s
        case Authorisation.REUSE_SOURCE:
            assert view is not None
            p.recorded = forkcalls.recorded_outcome(view.results, call.name, call.input)
            p.decision = decision("approve", FORK_REUSED)
        case Authorisation.ALLOW_NO_POLICY:
            p.decision = decision("approve", "policy_allow")
        case Authorisation.ALLOW_GRANTED | Authorisation.ALLOW_POLICY | Authorisation.DENY_POLICY:
            effect, reason = _RECORDED_EFFECTS[way]
            text = shaping.permission_denied(f"policy denies {call.name}") if effect == "deny" else ""
            p.decision = decision(effect, reason, text)
            p.permission_event = make(
                ev.PermissionDecided,
                loop_id=h.loop_id,
                turn_id=t.turn_id,
                step_id=step_id,
                tool_execution_id=p.execution_id,
                tool_name=call.name,
                effect=effect,
                reason=reason,
            )
        case _:
            raise AssertionError(f"not a decision to act on: {way}")
    return _with_decision(s, p.decision)


async def _settled_view(d: Drive, h: LoopHistory, p: PlannedCall, wait: float) -> forkcalls.SourceView:
    """The source's view once it has a result of ``p``'s call or rests, or after ``wait`` seconds."""
    deadline = anyio.current_time() + wait
    view = await d.source_view(h)
    while view.busy and forkcalls.recorded_outcome(view.results, p.call.name, p.call.input) is None:
        if anyio.current_time() >= deadline:
            break
        await anyio.sleep(0.25)
        view = await d.source_view(h)
    return view


async def _prior(d: Drive, p: PlannedCall) -> Prior:
    """What an earlier run of the step left of this call (a finished one's outcome goes to ``p``):
    nothing when it never started or was sent with other arguments (its worker refuses those)."""
    results = d.shared.results
    assert results is not None
    rec = await results.call(p.call.name, p.execution_id, loop_id=d.loop_id)
    if rec is None or rec.args_digest != args_digest(p.call.data):
        return Prior.NONE
    if rec.state != DONE:
        # Started and not done: maybe still running on its worker (our predecessor stopped, not
        # the worker) — then its result comes within the call's deadline, unless the worker is gone.
        s = d.settings
        spec = d.shared.tools.get(p.call.name)
        timeout = float(spec.timeout_seconds if spec is not None else s.tool_timeout_seconds)
        left = rec.started_ms / 1000 + timeout + 3 * s.heartbeat_seconds - time.time()
        until = time.monotonic() + max(0.0, left)
        # (a call still running, e.g. a sub-agent, may take long: waited on outside the drive slot)
        with caller_span(p.call.name, p.call.id, p.execution_id):  # the worker's span's parent
            async with d.waiting_on_calls():
                rec = await _finished(d, p, rec, until)
        if rec is None:
            return Prior.UNKNOWN
    p.recorded = outcome_of(rec.reply_kind, bytes(rec.reply), rec.worker_id)
    return Prior.RECORDED


async def _finished(d: Drive, p: PlannedCall, rec: CallRecord, until: float) -> CallRecord | None:
    """``p``'s record once its call is done; None when its worker is gone or its deadline passed."""
    results = d.shared.results
    assert results is not None
    s = d.settings
    while rec.state != DONE:
        if time.monotonic() >= until or await is_gone(
            d.shared.nc, s.names.tool_worker(rec.worker_id), timeout=WORKER_PING_SECONDS
        ):
            return None
        await anyio.sleep(RECORD_POLL_SECONDS)
        rec = await results.call(p.call.name, p.execution_id, loop_id=d.loop_id) or rec
    return rec


def _with_decision(s: ev.SuspendedStep, decision: ev.Decision | None) -> ev.SuspendedStep:
    """The step with one more call decided (what a gate opened later stores, to resume from)."""
    assert decision is not None
    return ev.SuspendedStep(
        message=s.message,
        calls=s.calls,
        decisions=[*s.decisions, decision],
        iteration=s.iteration,
        calls_so_far=s.calls_so_far,
    )
