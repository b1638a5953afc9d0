"""The fault suite's scripted model: 10 steps mixing single, parallel, malformed and gated tool calls.

Tool-use ids carry the step index, so every StepDone can be matched to the response that produced
it: a missing, doubled or reordered step is caught. Two calls are gated (``clock`` is ``ask`` in the
load's policy; the test operator approves ``approve_*`` gates and denies ``deny_*`` ones).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

STEPS = 10
SLEEP_SECONDS = 0.3
GATED_TOOL = "clock"
# Tool results a fault may legitimately produce instead of the tool's answer (the executor's texts).
FAULT_RESULT_PREFIXES = ("error: tool crashed", "error: tool timed out", "error: tool unavailable")
# While a NATS node is lost the registry may forget a tool whose workers cannot refresh their
# registration, and the executor answers calls meanwhile as "unknown tool" (see docs/reliability.md).
NODE_LOSS_RESULT_PREFIXES = (*FAULT_RESULT_PREFIXES, "error: unknown tool")


def _call(call_id: str, name: str, args: str, index: int = 0) -> list[dict[str, Any]]:
    return [
        {"kind": "tool_use", "index": index, "id": call_id, "name": name},
        {"kind": "tool_use", "index": index, "text": args},
    ]


def _calc(prefix: str, expr: str, index: int = 0) -> list[dict[str, Any]]:
    return _call(f"{prefix}_{{k}}", "calculator", json.dumps({"expression": expr}), index)


def _sleep(index: int = 0) -> list[dict[str, Any]]:
    return _call("sleep_{k}", "sleep", json.dumps({"seconds": SLEEP_SECONDS}), index)


def _gated(decision: str) -> list[dict[str, Any]]:
    return _call(f"{decision}_{{k}}", GATED_TOOL, json.dumps({"timezone": "UTC"}))


_FINISH_TOOLS = {"kind": "finish", "finish_reason": "tool_use"}

# Step k → the model's response. Expected results are in EXPECTED (by tool-use id prefix).
RESPONSES: list[list[dict[str, Any]]] = [
    [{"kind": "text", "text": "Step 0: one call."}, *_calc("calc", "0+1"), _FINISH_TOOLS],
    [*_calc("calc", "1+1", 0), *_sleep(1), _FINISH_TOOLS],  # parallel
    [*_call("bad_{k}", "calculator", '{"expression": "2+'), _FINISH_TOOLS],  # malformed JSON
    [{"kind": "text", "text": "Asking first."}, *_gated("approve"), _FINISH_TOOLS],  # gate: approved
    [*_sleep(0), *_calc("calc", "4+1", 1), _FINISH_TOOLS],
    [*_calc("calc", "5+1"), _FINISH_TOOLS],
    [*_gated("deny"), _FINISH_TOOLS],  # gate: denied
    [*_calc("calc", "7+1", 0), *_calc("calcb", "7*2", 1), *_sleep(2), _FINISH_TOOLS],  # three at once
    [*_sleep(0), _FINISH_TOOLS],
    [{"kind": "text", "text": "finished"}, {"kind": "finish", "finish_reason": "end_turn"}],
]
assert len(RESPONSES) == STEPS

CALC_RESULTS = {"calc_0": "1", "calc_1": "2", "calc_4": "5", "calc_5": "6", "calc_7": "8", "calcb_7": "14"}


def script(sleep_seconds: float = SLEEP_SECONDS) -> dict[str, Any]:
    """The load's script; ``sleep_seconds`` lengthens the sleep calls (more calls in flight at any time)."""
    text = json.dumps({"responses": RESPONSES})
    return json.loads(
        text.replace(
            json.dumps(json.dumps({"seconds": SLEEP_SECONDS}))[1:-1],
            json.dumps(json.dumps({"seconds": sleep_seconds}))[1:-1],
        )
    )


def quick_script() -> list[Any]:
    """A two-step loop for "is the system still serving?" checks."""
    return [[*_calc("calc", "20+22"), _FINISH_TOOLS], "quick done"]


def write_model(directory: Path, content: Any, name: str) -> str:
    path = directory / name
    path.write_text(json.dumps(content))
    return f"scripted:{path}"
