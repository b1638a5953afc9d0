"""The agent tool's declaration and the ids it derives (the child loop, its commands), and ParentRef's rules."""

from __future__ import annotations

import uuid

import msgspec
import pytest

from services.tools.agent import AgentTask, agent_tool, child_command_id, child_loop_id
from services.toolwire.spec import KIND_AGENT
from shared.codec import decode_event, encode_event
from shared.errors import InvalidEventError
from shared.events import LoopStarted, ParentRef
from shared.validate import validate_event

EXEC = "8e5b1f47-6a9d-4cae-9bc4-3d7f9a5c1e68"


def _parent(loop_id: str) -> ParentRef:
    return ParentRef(
        loop_id=loop_id,
        turn_id=str(uuid.uuid4()),
        step_id=str(uuid.uuid4()),
        tool_execution_id=EXEC,
        tool_name="researcher",
    )


def test_ids_are_derived_from_the_execution_id_only() -> None:
    child = child_loop_id(EXEC)
    assert child == child_loop_id(EXEC) == str(uuid.uuid5(uuid.UUID("7d0f3a52-6c1b-4e8a-9f27-1b5c3e9d4a60"), EXEC))
    verbs = {child_command_id(EXEC, v) for v in ("start", "input", "interrupt", "close")}
    assert len(verbs) == 4 and child not in verbs
    assert child_loop_id(str(uuid.uuid4())) != child


def test_the_spec_is_an_idempotent_agent_with_a_task_input_and_a_long_deadline() -> None:
    spec = agent_tool("researcher", model="demo", tools=["calculator"]).spec()
    assert spec.kind == KIND_AGENT and spec.idempotent and not spec.read_only
    assert spec.input_schema["required"] == ["task"] and spec.timeout_seconds >= 3600
    assert spec.retry is not None and spec.retry.max_attempts > 1 and "timeout" not in spec.retry.retry_on
    with pytest.raises(msgspec.ValidationError):
        msgspec.json.decode(b'{"task": ""}', type=AgentTask)


def test_an_agent_cannot_list_itself_or_take_a_bad_name() -> None:
    with pytest.raises(ValueError, match="itself"):
        agent_tool("researcher", model="demo", tools=["researcher"])
    with pytest.raises(ValueError, match="invalid tool name"):
        agent_tool("no spaces", model="demo")


def test_loop_started_parent_round_trips_and_a_loop_is_not_its_own_parent() -> None:
    loop_id = str(uuid.uuid4())
    parent_loop = str(uuid.uuid4())
    e = LoopStarted(
        loop_id=loop_id, event_id=str(uuid.uuid4()), created_at="2026-01-15T09:30:00Z", parent=_parent(parent_loop)
    )
    back = decode_event(encode_event(e))
    assert isinstance(back, LoopStarted) and back.parent == e.parent
    own = msgspec.structs.replace(e, parent=_parent(loop_id))
    with pytest.raises(InvalidEventError) as err:
        validate_event(own)
    assert err.value.field == "parent"
