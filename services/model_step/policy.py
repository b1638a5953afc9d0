"""Authorisation of tool calls: the loop's policy, "approve always" grants, gate answers, what a
fork does with a call its source made too, and :func:`authorise`, which decides one call of a step.

Pure functions over plain facts read from the folded history, so every replica reaches the same
decision for a call.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum
from typing import Final, cast

from shared.events import GateResolved, LoopStarted
from shared.wiretypes import (
    ALLOW,
    ASK,
    DENY,
    POLICY_EFFECTS,
    DecisionEffect,
    GateReason,
    OnUnknown,
    PolicyEffect,
    Reexecution,
)

__all__ = [
    "ALLOW",
    "ASK",
    "COPIED_GATE_APPROVED",
    "DENY",
    "FORK_NO_RESULT",
    "FORK_REUSED",
    "GATE_DENIED",
    "GATE_FORK_RERUN",
    "GATE_OUTCOME_UNKNOWN",
    "ON_UNKNOWN_ASK",
    "OUTCOME_UNKNOWN",
    "RECORDED_RESULT",
    "RERUN_APPROVED",
    "Authorisation",
    "CallFacts",
    "ForkWay",
    "Prior",
    "SourceFacts",
    "authorise",
    "fork_way",
    "gate_effect",
    "has_policy",
    "parse_policy",
    "policy_effect",
    "tool_allowed_for_loop",
]

# Decision reasons (ev.Decision.reason) of calls of a step that runs again or continues at a gate.
RECORDED_RESULT: Final = "recorded_result"  # an earlier run finished the call: its outcome stands
OUTCOME_UNKNOWN: Final = "outcome_unknown"  # the call may have run: the model gets an error result
RERUN_APPROVED: Final = "rerun_approved"  # an operator approved running a call of unknown outcome again
GATE_DENIED: Final = "gate_denied"
# A fork's calls: one taking the source's result, one approved at a gate the fork copied open (the
# re-execution rule still applies), one whose gate was denied while the source had no result to take.
FORK_REUSED: Final = "fork_reused"
COPIED_GATE_APPROVED: Final = "copied_gate_approved"
FORK_NO_RESULT: Final = "fork_no_source_result"
# Gate reasons (ev.Gate.reason), and the loop setting that asks about an unknown outcome.
GATE_OUTCOME_UNKNOWN: Final[GateReason] = "outcome_unknown"
GATE_FORK_RERUN: Final[GateReason] = "fork_rerun"
ON_UNKNOWN_ASK: Final[OnUnknown] = "ask"


class ForkWay(Enum):
    """What a fork does with a call of its model (:func:`fork_way`)."""

    REUSE = "reuse"  # take the source's result: nothing runs
    RERUN = "rerun"  # run it like any call
    ASK = "ask"  # a fork_rerun gate: approve runs it again, deny takes the source's result
    ORDINARY = "ordinary"  # not a call of the source's: authorised like any call
    WAIT = "wait"  # the source may be running it: give it time to commit it
    ASK_RUNNING = "ask_running"  # a fork_rerun gate saying the source may be running it


class Prior(Enum):
    """What an earlier run of the step left of a call."""

    NONE = "none"  # nothing: it never started, was sent with other arguments, or the step is new
    RECORDED = "recorded"  # it finished: its outcome is recorded
    UNKNOWN = "unknown"  # it started and did not finish within its deadline, or its worker is gone


class Authorisation(Enum):
    """What the driver does with one call of a step (:func:`authorise`)."""

    READ_SOURCE = "read_source"  # a fork's call: read what the source did, then decide again
    WAIT_FOR_SOURCE = "wait_for_source"  # give a busy source time to commit the call, then decide again
    REUSE_RECORDED = "reuse_recorded"  # approve; the earlier run's outcome stands
    ASK_UNKNOWN = "ask_unknown"  # outcome unknown: a permission gate asks whether to run it again
    DENY_UNKNOWN = "deny_unknown"  # outcome unknown: the model gets an error result saying so
    KEEP_DECIDED = "keep_decided"  # the step's recorded decision (a gate's answer) stands
    KEEP_SOURCE_RESULT = "keep_source_result"  # the recorded decision takes the source's result
    DENY_NO_SOURCE_RESULT = "deny_no_source_result"  # ... which the source never committed
    REUSE_SOURCE = "reuse_source"  # approve with the source's result (the fork's rule says reuse)
    ASK_FORK = "ask_fork"  # a fork_rerun gate
    ASK_FORK_RUNNING = "ask_fork_running"  # a fork_rerun gate: the source may be running it
    UNCHECKED = "unchecked"  # a pre-execution failure (unknown tool, bad arguments): the executor reports it
    ASK_USER = "ask_user"  # a user_input tool: its gate asks the operator
    ALLOW_GRANTED = "allow_granted"  # approved "always" by an operator: recorded
    ALLOW_POLICY = "allow_policy"  # the policy allows it: recorded
    ALLOW_NO_POLICY = "allow_no_policy"  # the loop has no policy at all: allowed, nothing worth recording
    DENY_POLICY = "deny_policy"
    ASK_PERMISSION = "ask_permission"  # a permission gate


@dataclass(frozen=True, slots=True)
class SourceFacts:
    """What a fork's source did after the fork point: committed a result of an equal call
    (``result``), may be running calls (``busy``), was given time to commit it (``waited``). ``copied``:
    as the fork copied them when it was written; it never reads its source, so there is nothing to
    wait for."""

    result: bool
    busy: bool
    waited: bool = False
    copied: bool = False


@dataclass(frozen=True, slots=True)
class CallFacts:
    """What is known of one call of a step when it is authorised.

    ``effect``: the loop's policy for the tool, grants applied; ``granted``: approved "always";
    ``has_policy``: the loop has a policy at all; ``known_tool``: live and allowed for the loop;
    ``minted``/``invalid``: the call never runs (a minted id, arguments that are not strict JSON);
    ``prior``: what an earlier run of the step left of it; ``decided``: the reason of the step's
    recorded decision for it (None: undecided); ``fork_rule``: the fork's re-execution rule for
    the tool (None: not a fork); ``source``: the fork's source as read (None: not read yet).
    """

    effect: PolicyEffect = ALLOW
    granted: bool = False
    has_policy: bool = False
    known_tool: bool = True
    user_input: bool = False
    rerun_safe: bool = False
    minted: bool = False
    invalid: bool = False
    prior: Prior = Prior.NONE
    decided: str | None = None
    ask_on_unknown: bool = False
    fork_rule: Reexecution | None = None
    source: SourceFacts | None = None


def authorise(c: CallFacts) -> Authorisation:
    """What to do with one call, in this order: an earlier run's record (finished: reuse it;
    possibly run but unfinished: run again only a read-only or idempotent tool, else the loop's
    ``on_unknown``), the step's recorded decision, the fork's re-execution rule, then the tool's
    kind and the loop's policy."""
    if c.prior is Prior.RECORDED:
        return Authorisation.REUSE_RECORDED
    if c.prior is Prior.UNKNOWN and c.decided not in (RERUN_APPROVED, GATE_DENIED) and not c.rerun_safe:
        return Authorisation.ASK_UNKNOWN if c.ask_on_unknown else Authorisation.DENY_UNKNOWN
    if c.decided is not None:
        return _decided(c)
    if c.minted or not c.known_tool or c.invalid:
        return Authorisation.UNCHECKED
    if c.fork_rule is not None:
        forked = _fork(c)
        if forked is not None:
            return forked
    if c.user_input:
        return Authorisation.ASK_USER
    match c.effect:
        case "allow":
            if c.granted:
                return Authorisation.ALLOW_GRANTED
            return Authorisation.ALLOW_POLICY if c.has_policy else Authorisation.ALLOW_NO_POLICY
        case "deny":
            return Authorisation.DENY_POLICY
        case "ask":
            return Authorisation.ASK_PERMISSION


def _decided(c: CallFacts) -> Authorisation:
    """A call the step holds a decision of (a gate's answer, or one taken before the gate)."""
    if c.decided == COPIED_GATE_APPROVED and c.known_tool and not c.invalid:
        # Approved in the fork; but a call the source ran since (or may be running) is a repeated
        # call, and the fork's re-execution rule decides whether it runs again.
        return _fork(c) or Authorisation.KEEP_DECIDED
    if c.decided == FORK_REUSED:
        if c.source is None:
            return Authorisation.READ_SOURCE
        return Authorisation.KEEP_SOURCE_RESULT if c.source.result else Authorisation.DENY_NO_SOURCE_RESULT
    return Authorisation.KEEP_DECIDED


def _fork(c: CallFacts) -> Authorisation | None:
    """A fork's call its source may have made too; None: it is authorised like any call."""
    if c.fork_rule is None:
        return None
    if c.source is None:
        return Authorisation.READ_SOURCE
    s = c.source
    waited = s.waited or s.copied  # a copy tells all the fork will know: waiting would learn nothing
    match fork_way(c.fork_rule, source_result=s.result, source_busy=s.busy, rerun_safe=c.rerun_safe, waited=waited):
        case ForkWay.WAIT:
            return Authorisation.WAIT_FOR_SOURCE
        case ForkWay.ASK:
            return Authorisation.ASK_FORK
        case ForkWay.ASK_RUNNING:
            return Authorisation.ASK_FORK_RUNNING
        case ForkWay.REUSE:
            return Authorisation.REUSE_SOURCE
        case ForkWay.RERUN | ForkWay.ORDINARY:
            return None


def policy_effect(config: LoopStarted | None, tool_name: str, always_allowed: frozenset[str]) -> PolicyEffect:
    """allow | deny | ask for ``tool_name``: grants first, then the tool's rule, then ``*``, then the default."""
    if tool_name in always_allowed:
        return ALLOW
    if config is None:
        return ALLOW
    effect = config.policy.get(tool_name) or config.policy.get("*") or config.default_policy
    return effect if effect in POLICY_EFFECTS else DENY


def has_policy(config: LoopStarted | None) -> bool:
    """A loop with no policy at all allows every call; there is no decision worth recording per call."""
    return config is not None and (bool(config.policy) or config.default_policy != ALLOW)


def parse_policy(items: Iterable[str]) -> dict[str, PolicyEffect]:
    """``TOOL=allow|deny|ask`` items (TOOL may be ``*``) as a loop policy; ValueError names a bad item."""
    policy: dict[str, PolicyEffect] = {}
    for raw in items:
        item = raw.strip()
        tool_name, sep, effect = item.partition("=")
        tool_name, effect = tool_name.strip(), effect.strip()
        if not sep or not tool_name or effect not in POLICY_EFFECTS:
            raise ValueError(f"TOOL=allow|deny|ask (TOOL may be *), got {item!r}")
        policy[tool_name] = cast(PolicyEffect, effect)
    return policy


def tool_allowed_for_loop(config: LoopStarted | None, tool_name: str) -> bool:
    """The loop's tool allow-list (None = every live tool)."""
    return config is None or config.tools is None or tool_name in config.tools


def gate_effect(resolution: GateResolved) -> DecisionEffect:
    """What an operator's answer means for the gated call: approve | deny | reply."""
    if resolution.action in ("approve", "approve_always"):
        return "approve"
    if resolution.action == "reply":
        return "reply"
    return "deny"


def fork_way(rule: Reexecution, *, source_result: bool, source_busy: bool, rerun_safe: bool, waited: bool) -> ForkWay:
    """What a fork does with a call of its model, from what its source did after the fork point.

    ``rule``: the fork's re-execution rule for the tool (reuse, rerun or ask); ``source_result``: the
    source committed the result of an equal call; ``source_busy``: the source may be running calls
    whose results it has not committed (it neither rests nor waits at a gate); ``rerun_safe``: the
    tool is read-only or idempotent; ``waited``: nothing more is to be learnt of the source (it was
    given time to commit the call, or the fork copied its calls when written and never reads it).

    A call the source may be running is treated as one whose outcome is unknown, as in a step that
    runs again: a read-only or idempotent tool runs (twice is harmless); any other is never run
    unasked — an operator is asked at once by a fork that copied its source's calls; a fork that
    reads its source (written before forks copied them) first gives it time to commit the call,
    then the rule decides with its result, or, still without one, an operator is asked.
    """
    if source_result:
        return ForkWay(rule)
    if not source_busy or rerun_safe:
        return ForkWay.ORDINARY
    return ForkWay.ASK_RUNNING if waited else ForkWay.WAIT
