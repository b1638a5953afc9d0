"""The budget options of ``loopwire start`` and ``loopwire budget``, and a loop's budget and spend as JSON."""

from __future__ import annotations

import argparse
import math
from typing import Any

import msgspec

from services.cli.errors import CliError
from services.model_step.budget import budget_verdict
from shared.budget import LIMITS
from shared.events import Budget, now_rfc3339
from shared.history import LoopHistory
from shared.pricing import usd
from shared.wiretypes import MAX_LIMIT_COUNT, ON_BUDGET_OUTCOMES

__all__ = ["add_budget_options", "budget_from_args", "budget_gate_text", "budget_json", "count_range"]


def count_range(value: int, low: int = 0, high: int = MAX_LIMIT_COUNT) -> str:
    """What a whole-number limit option takes, said of a ``value`` outside it (one error line)."""
    return f"a whole number from {low} to {high}, got {value}"


def add_budget_options(p: argparse.ArgumentParser) -> None:
    """The budget options of ``start`` and ``budget`` (0 = unlimited)."""
    p.add_argument(
        "--max-total-tokens", type=int, metavar="N", help="the loop's input + output tokens, all turns (0 = unlimited)"
    )
    p.add_argument(
        "--max-cost-usd", type=float, metavar="X", help="the loop's cost in USD by the price table (0 = unlimited)"
    )
    p.add_argument("--max-steps-per-turn", type=int, metavar="N", help="model steps in one turn (0 = unlimited)")
    p.add_argument(
        "--max-turn-seconds", type=float, metavar="S", help="wall time of one turn from its start (0 = unlimited)"
    )
    p.add_argument(
        "--on-budget",
        choices=ON_BUDGET_OUTCOMES,
        help="a spent budget: fail the turn (TurnFailed budget, default) or ask (a budget gate: approve "
        "grants each spent limit its amount again, deny fails the turn)",
    )


def budget_from_args(args: argparse.Namespace, base: Budget | None) -> Budget | None:
    """``base`` with the limits the options give replaced (None: no option given and no base)."""
    changes: dict[str, Any] = {}
    for name in (*LIMITS, "on_budget"):
        value = getattr(args, name, None)
        if value is None:
            continue
        if isinstance(value, float) and (not math.isfinite(value) or value < 0):
            raise CliError(f"--{name.replace('_', '-')}: a number ≥ 0, got {value}")
        if isinstance(value, int) and not 0 <= value <= MAX_LIMIT_COUNT:
            raise CliError(f"--{name.replace('_', '-')}: {count_range(value)}")
        changes[name] = value
    if not changes:
        return base
    try:
        return msgspec.convert({**msgspec.to_builtins(base or Budget()), **changes}, Budget)
    except msgspec.ValidationError as e:
        raise CliError(f"budget: {e}") from None


def budget_gate_text(h: LoopHistory) -> str:
    """What an open budget gate asks: the spent limits with their figures, and what approving does."""
    return f"{budget_verdict(h, now_rfc3339()).message}; approve grants each spent limit its amount again"


def budget_json(h: LoopHistory) -> dict[str, Any]:
    """A loop's budget now and what it spent (``loops --json``, ``budget --json``)."""
    t = h.open_turn
    return {
        "budget": msgspec.to_builtins(h.budget),
        "tokens": h.figures().tokens,
        "cost_usd": usd(h.cost_micro_usd),
        "turn_cost_usd": {str(k): usd(v) for k, v in sorted(h.turn_costs.items())},
        "turn_steps": t.steps if t is not None else 0,
    }
