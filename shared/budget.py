"""A loop's budget figures and what approving a budget gate grants: pure, read from the folded history.

The figures (tokens and cost of the loop, model steps and wall time of the open turn) are what the
model-step checks before each step (``services.model_step.budget``) and what an approved budget gate
extends (the fold applies :func:`extended` at the GateResolved, so every reader agrees on the result).
"""

from __future__ import annotations

from datetime import datetime
from typing import Final, Literal

import msgspec

from shared.content import Usage
from shared.events import Budget
from shared.pricing import usd, usd_to_micro
from shared.wiretypes import MAX_LIMIT_COUNT

__all__ = ["LIMITS", "BudgetLimit", "Figures", "exhausted", "extended", "limited", "seconds_between", "total_tokens"]

BudgetLimit = Literal["max_total_tokens", "max_cost_usd", "max_steps_per_turn", "max_turn_seconds"]
LIMITS: Final[tuple[BudgetLimit, ...]] = ("max_total_tokens", "max_cost_usd", "max_steps_per_turn", "max_turn_seconds")


class Figures(msgspec.Struct, frozen=True, kw_only=True):
    """What a loop has spent, as the budget counts it."""

    tokens: int = 0  # the loop's input (cache included) and output tokens
    cost_micro_usd: int = 0  # the loop's cost
    steps: int = 0  # model steps of the open turn
    turn_seconds: float = 0.0  # wall time since the open turn's TurnStarted


def total_tokens(u: Usage) -> int:
    """Tokens a budget counts of a usage: every input token (cached or not) and every output token."""
    return u.context_tokens + u.output_tokens


def seconds_between(start: str, end: str) -> float:
    """Seconds from one RFC 3339 time to another (0 when either is empty or unreadable)."""
    if not start or not end:
        return 0.0
    try:
        a = datetime.fromisoformat(start.replace("Z", "+00:00"))
        b = datetime.fromisoformat(end.replace("Z", "+00:00"))
    except ValueError:
        return 0.0
    return max(0.0, (b - a).total_seconds())


def _spent(budget: Budget, f: Figures, limit: BudgetLimit) -> tuple[float, float]:
    """(figure, limit) of one limit, in the limit's own unit."""
    if limit == "max_total_tokens":
        return f.tokens, budget.max_total_tokens
    if limit == "max_cost_usd":
        return usd(f.cost_micro_usd), budget.max_cost_usd
    if limit == "max_steps_per_turn":
        return f.steps, budget.max_steps_per_turn
    return f.turn_seconds, budget.max_turn_seconds


def limited(budget: Budget) -> bool:
    """Whether the budget sets any limit (one that sets none is never exhausted)."""
    return bool(budget.max_total_tokens or budget.max_cost_usd or budget.max_steps_per_turn or budget.max_turn_seconds)


def exhausted(budget: Budget, f: Figures) -> list[BudgetLimit]:
    """The limits that allow no further step (a set limit the figure has reached), in LIMITS order."""
    out: list[BudgetLimit] = []
    for limit in LIMITS:
        if limit == "max_cost_usd":
            if budget.max_cost_usd > 0 and f.cost_micro_usd >= usd_to_micro(budget.max_cost_usd):
                out.append(limit)
            continue
        figure, cap = _spent(budget, f, limit)
        if cap > 0 and figure >= cap:
            out.append(limit)
    return out


def extended(budget: Budget, base: Budget, f: Figures) -> Budget:
    """The budget after an operator approved a budget gate: each exhausted limit grants its amount as
    last set (``base``: LoopStarted's or the latest BudgetChanged's) again, counted from what is spent
    now (so a turn that waited an hour at the gate still gets its seconds)."""
    changes: dict[str, float | int] = {}
    for limit in exhausted(budget, f):
        figure, cap = _spent(budget, f, limit)
        grant = getattr(base, limit) or cap
        new = max(cap, figure) + grant
        if limit == "max_cost_usd":
            new = round(new, 6)
        elif limit != "max_turn_seconds":
            new = int(new)
        changes[limit] = min(new, 1e9) if isinstance(new, float) else min(new, MAX_LIMIT_COUNT)
    return msgspec.structs.replace(budget, **changes) if changes else budget
