"""What a loop needs next (shared.nextaction), and the model-step's own questions of a folded history."""

from __future__ import annotations

from shared.events import execution_id_for as execution_id_for
from shared.events import step_id_for as step_id_for
from shared.history import LoopHistory
from shared.nextaction import Action as Action
from shared.nextaction import Next as Next
from shared.nextaction import may_run_calls as may_run_calls
from shared.nextaction import next_action as next_action
from shared.nextaction import open_gate as open_gate
from shared.nextaction import resumable_gate as resumable_gate

# Step and execution ids are derived (shared.events): a step re-run after a crash has the same id.


def always_allowed(h: LoopHistory) -> frozenset[str]:
    """Tools an operator approved "always" for this loop."""
    return frozenset(
        g.gate.tool_name for g in h.gates.values() if g.resolved is not None and g.resolved.action == "approve_always"
    )
