"""What kinds of event there are: an event's class (ephemeral | enduring), scope and identity profile.

Which kind each event type is lives in :data:`shared.events.CLASSIFICATION`.
"""

from __future__ import annotations

from enum import StrEnum


class Class(StrEnum):
    EPHEMERAL = "ephemeral"
    ENDURING = "enduring"


class Scope(StrEnum):
    LOOP = "loop"
    SESSION = "session"


class Profile(StrEnum):
    """Which identity coordinates an event must (and must not) carry."""

    LOOP = "loop"  # loop_id; no turn/step/tool ids
    TURN = "turn"  # loop_id + turn_id; no step/tool ids
    STEP = "step"  # loop_id + turn_id + step_id; no tool id
    TOOL = "tool"  # loop_id + turn_id + step_id + tool_execution_id
    GATE = "gate"  # like STEP; tool_execution_id optional (the gated call)
