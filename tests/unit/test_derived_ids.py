"""The id derivations stated in docs/protocol.md recompute the ids the code derives."""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import pytest

from services.committer.api import _derived_id
from services.model_step.steps import execution_id_for, step_id_for
from shared.events import compaction_id_for
from shared.validate import is_uuid

PROTOCOL_MD = Path(__file__).resolve().parents[2] / "docs" / "protocol.md"
_FORMULA = re.compile(r'^(\w+)\s+= uuid5\(([^,]+), "([^"]*)"\)$', re.M)


def _formulas() -> dict[str, tuple[str, str]]:
    """name → (namespace, name template), read from the doc's "Derived ids" block."""
    text = PROTOCOL_MD.read_text(encoding="utf-8")
    block = text[text.index("## Derived ids") :]
    block = block[block.index("```text") : block.index("```", block.index("```text") + 7)]
    return {m[1]: (m[2].strip(), m[3]) for m in _FORMULA.finditer(block)}


def _from_doc(formula: str, **values: object) -> str:
    namespace, template = _formulas()[formula]
    ns = uuid.UUID(namespace.format(**values))  # a UUID literal, or "{step_id}"
    return str(uuid.uuid5(ns, template.format(**values)))


def test_the_doc_states_every_derivation() -> None:
    assert set(_formulas()) == {"step_id", "tool_execution_id", "api_event_id", "compaction_id"}


@pytest.mark.parametrize("upto", [1, 12, 4_000])
def test_compaction_id(upto: int) -> None:
    loop_id = str(uuid.uuid4())
    assert _from_doc("compaction_id", loop_id=loop_id, upto=upto) == compaction_id_for(loop_id, upto)


@pytest.mark.parametrize("step_index", [0, 1, 7, 123])
def test_step_id(step_index: int) -> None:
    turn_id = str(uuid.uuid4())
    got = step_id_for(turn_id, step_index)
    assert is_uuid(got)
    assert _from_doc("step_id", turn_id=turn_id, step_index=step_index) == got


@pytest.mark.parametrize("tool_use_id", ["toolu_01ABC", "call_x", "lw_1f2e3d", "ünïcode id"])
def test_tool_execution_id(tool_use_id: str) -> None:
    step_id = step_id_for(str(uuid.uuid4()), 2)
    got = execution_id_for(step_id, tool_use_id)
    assert _from_doc("tool_execution_id", step_id=step_id, tool_use_id=tool_use_id) == got


@pytest.mark.parametrize(("verb", "index"), [("start", 0), ("input", 0), ("interrupt", 1), ("close", 2)])
def test_loop_api_event_id(verb: str, index: int) -> None:
    loop_id, command_id = str(uuid.uuid4()), str(uuid.uuid4())
    got = _derived_id(loop_id, verb, command_id, index)
    assert _from_doc("api_event_id", loop_id=loop_id, verb=verb, command_id=command_id, index=index) == got


def test_the_worked_example_in_the_doc_is_what_the_code_derives() -> None:
    text = " ".join(PROTOCOL_MD.read_text(encoding="utf-8").split())
    turn_id, loop_id, command_id = (
        "6a1d2e4f-3b5c-4d7e-8f90-a1b2c3d4e5f6",
        "0f3c9a52-1b7e-4c1a-9e55-2d6b8f0a7c11",
        "7e9a1c3e-5a7c-4e9a-8c1e-3a5c7e9a1c3e",
    )
    step_id = step_id_for(turn_id, 0)
    assert f"step index 0 → step_id `{step_id}`" in text
    assert f"`toolu_1` → tool_execution_id `{execution_id_for(step_id, 'toolu_1')}`" in text
    assert f"index 0 → event_id `{_derived_id(loop_id, 'input', command_id, 0)}`" in text
    assert step_id == "9d9e912f-c7bd-523b-9fdb-ba184924604a"  # pinned: a change here breaks every consumer
