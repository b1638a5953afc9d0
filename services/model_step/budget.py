"""Whether a loop's budget lets its open turn ask the model for another step (docs/budgets.md).

A pure function of the folded history and the time: every replica, and one that takes a loop over
after a crash, reads the same figures from the same records and decides the same. The time counts
only for ``max_turn_seconds`` (from the turn's TurnStarted ``created_at``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

from shared.budget import BudgetLimit, Figures, exhausted, limited
from shared.events import Budget, step_id_for
from shared.history import GateState, LoopHistory
from shared.pricing import usd

__all__ = ["ASK", "FAIL", "GO", "Verdict", "budget_gate", "budget_verdict", "describe"]

VerdictAction = Literal["go", "fail", "ask"]
GO: Final[VerdictAction] = "go"
FAIL: Final[VerdictAction] = "fail"
ASK: Final[VerdictAction] = "ask"


@dataclass(frozen=True, slots=True)
class Verdict:
    action: VerdictAction
    limits: tuple[BudgetLimit, ...] = ()
    message: str = ""


def describe(budget: Budget, f: Figures, limits: tuple[BudgetLimit, ...]) -> str:
    """``budget exhausted: max_total_tokens 1200/1000, ...``: each limit with its figure."""
    parts: list[str] = []
    for limit in limits:
        if limit == "max_total_tokens":
            parts.append(f"max_total_tokens {f.tokens}/{budget.max_total_tokens} tokens")
        elif limit == "max_cost_usd":
            parts.append(f"max_cost_usd ${usd(f.cost_micro_usd):.6f}/${budget.max_cost_usd:.6f}")
        elif limit == "max_steps_per_turn":
            parts.append(f"max_steps_per_turn {f.steps}/{budget.max_steps_per_turn} steps")
        else:
            parts.append(f"max_turn_seconds {f.turn_seconds:.1f}/{budget.max_turn_seconds:g} s")
    return "budget exhausted: " + ", ".join(parts)


def budget_gate(h: LoopHistory) -> GateState | None:
    """The latest budget gate opened before the open turn's next step (None without one)."""
    t = h.open_turn
    if t is None:
        return None
    step_id = step_id_for(t.turn_id, t.steps)
    found: GateState | None = None
    for g in h.gates.values():
        mine = g.gate.kind == "budget" and g.turn_id == t.turn_id and g.step_id == step_id
        if mine and (found is None or g.opened_seq > found.opened_seq):
            found = g
    return found


def budget_verdict(h: LoopHistory, now: str) -> Verdict:
    """go | fail | ask for the open turn's next model step at ``now`` (RFC 3339).

    Over a limit: ``fail`` with on_budget "fail", or when the budget gate opened for this step was
    denied; else ``ask`` (a budget gate; an approved one has extended the budget in the fold, so
    ``ask`` again means the extension was not enough, e.g. after a lower ``budget`` command).
    """
    budget = h.budget
    # Most loops set no budget: they skip the figures (the turn's wall time parses two timestamps).
    if h.config is None or h.open_turn is None or not limited(budget):
        return Verdict(GO)
    f = h.figures(now)
    limits = tuple(exhausted(budget, f))
    if not limits:
        return Verdict(GO)
    message = describe(budget, f, limits)
    if budget.on_budget == "fail":
        return Verdict(FAIL, limits, message)
    g = budget_gate(h)
    if g is not None and g.resolved is not None and g.resolved.action != "approve":
        return Verdict(FAIL, limits, f"{message} (budget gate {g.resolved.action})")
    return Verdict(ASK, limits, message)
