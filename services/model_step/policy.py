"""Authorisation of tool calls: the loop's policy, "approve always" grants, gate answers, and what a
fork does with a call its source made too.

Pure functions over the folded history, so every replica reaches the same decision for a call.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final, Literal, cast

from shared.events import POLICY_EFFECTS, DecisionEffect, GateResolved, LoopStarted, PolicyEffect
from shared.wiretypes import ALLOW, ASK, DENY, Reexecution

__all__ = [
    "ALLOW",
    "ASK",
    "ASK_RUNNING",
    "DENY",
    "FORK_ORDINARY",
    "WAIT_FOR_SOURCE",
    "ForkWay",
    "fork_way",
    "gate_effect",
    "parse_policy",
    "policy_effect",
    "tool_allowed_for_loop",
]

# What a fork does with a call of its model: a re-execution rule (reuse, rerun, ask), or one of these.
ForkWay = Literal["", "reuse", "rerun", "ask", "wait", "ask_running"]
FORK_ORDINARY: Final[ForkWay] = ""  # not a call of the source's: authorised like any call
WAIT_FOR_SOURCE: Final[ForkWay] = "wait"  # the source may be running it: give it time to commit it
ASK_RUNNING: Final[ForkWay] = "ask_running"  # a fork_rerun gate saying the source may be running it


def policy_effect(config: LoopStarted | None, tool_name: str, always_allowed: frozenset[str]) -> PolicyEffect:
    """allow | deny | ask for ``tool_name``: grants first, then the tool's rule, then ``*``, then the default."""
    if tool_name in always_allowed:
        return ALLOW
    if config is None:
        return ALLOW
    effect = config.policy.get(tool_name) or config.policy.get("*") or config.default_policy
    return effect if effect in POLICY_EFFECTS else DENY


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
    tool is read-only or idempotent; ``waited``: the source was given time to commit the call.

    A call the source may be running is treated as one whose outcome is unknown, as in a step that
    runs again: a read-only or idempotent tool runs (twice is harmless); any other is never run
    unasked — the source is given time to commit it, then the rule decides with its result, or, still
    without one, an operator is asked.
    """
    if source_result:
        return rule
    if not source_busy or rerun_safe:
        return FORK_ORDINARY
    return ASK_RUNNING if waited else WAIT_FOR_SOURCE
