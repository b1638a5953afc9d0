"""Authorisation of tool calls: the loop's policy, "approve always" grants, and gate answers.

Pure functions over the folded history, so every replica reaches the same decision for a call.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import cast

from shared.events import POLICY_EFFECTS, DecisionEffect, GateResolved, LoopStarted, PolicyEffect
from shared.wiretypes import ALLOW, ASK, DENY

__all__ = ["ALLOW", "ASK", "DENY", "gate_effect", "parse_policy", "policy_effect", "tool_allowed_for_loop"]


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
