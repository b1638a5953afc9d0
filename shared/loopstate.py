"""A loop's state in one vocabulary, derived from its fold: what the CLI and the console show.

Precedence, first that holds: ``forming`` (a fork whose copied records are not all stored),
``closed``, ``waiting`` (the running turn has an unanswered gate), ``running`` (a turn is open or an
input waits for one), ``failed`` (the last turn failed), ``idle``.
"""

from __future__ import annotations

from typing import Final, Literal

from shared.history import LoopHistory

__all__ = ["STATES", "LoopState", "describe", "loop_state"]

LoopState = Literal["forming", "closed", "waiting", "running", "failed", "idle"]
# Every state, in the order lists and counts show them.
STATES: Final[tuple[LoopState, ...]] = ("running", "waiting", "idle", "failed", "closed", "forming")


def loop_state(h: LoopHistory) -> LoopState:
    """The loop's state (module docstring for the precedence)."""
    if h.forming:
        return "forming"
    if h.closed:
        return "closed"
    if h.open_gates:
        return "waiting"
    if h.open_turn is not None or h.pending_inputs:
        return "running"
    if h.last_outcome == "failed":
        return "failed"
    return "idle"


def describe(h: LoopHistory) -> str:
    """The state on one line with its detail, e.g. ``waiting (2 gates)`` or ``running (turn 3)``."""
    state = loop_state(h)
    if state == "forming":
        return "forming (repeat the fork to finish)"
    if state == "waiting":
        n = len(h.open_gates)
        return f"waiting ({n} gate{'' if n == 1 else 's'})"
    if state == "running":
        t = h.open_turn
        return f"running (turn {t.turn_index})" if t is not None else "running (input pending)"
    if state == "failed":
        why = f": {h.last_error.kind}" if h.last_error is not None else ""
        return f"failed (turn {h.last_turn_index}{why})"
    return state
