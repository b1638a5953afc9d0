"""The one agent-loop workload every system runs: N tool steps, then a final answer.

A *step* is one model call whose response asks for one tool call, that tool call, and the durable
record of both (loopwire: one committed StepDone group). The model is the *instant model*: a
scripted response played at once (no sleep); the tool is ``calculator`` on ``17*23`` (microseconds
of work). After N steps the model answers with text and the loop ends. Throughput counts the N
tool steps; the final text step and the start/end records are part of the wall time.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Final

TOOL: Final = "calculator"
EXPRESSION: Final = "17*23"
ARGS: Final = json.dumps({"expression": EXPRESSION})
TOOL_RESULT: Final = "391"
STEP_TEXT: Final = "Computing step {k}."
FINAL_TEXT: Final = "The answer is 391."
USER_TEXT: Final = "What is 17*23? Check it a few times."


def tool_call_id(k: int) -> str:
    return f"call_{k}"


def scripted_responses(steps: int) -> list[Any]:
    """The loopwire scripted-model script: ``steps`` tool-call responses, then the final text."""
    out: list[Any] = []
    for _ in range(steps):
        out.append(
            [
                {"kind": "text", "text": "Computing step {k}."},
                {"kind": "tool_use", "index": 0, "id": "call_{k}", "name": TOOL},
                {"kind": "tool_use", "index": 0, "text": ARGS},
                {"kind": "usage", "usage": {"input_tokens": 20, "output_tokens": 10}},
                {"kind": "finish", "finish_reason": "tool_use"},
            ]
        )
    out.append(FINAL_TEXT)
    return out


def write_script(directory: Path, steps: int) -> str:
    """Write the script for ``steps`` tool steps; returns the model spec ``scripted:<path>``."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"instant-{steps}.json"
    if not path.exists():
        path.write_text(json.dumps({"responses": scripted_responses(steps)}))
    return f"scripted:{path}"


def instant_model(k: int, steps: int) -> dict[str, Any]:
    """The same responses for the peers: call ``k`` (from 0) of a loop of ``steps`` tool steps.

    ``{"text", "tool_call": {"id", "name", "args"}}`` for a tool step, ``{"text"}`` for the answer.
    """
    if k < steps:
        return {
            "text": STEP_TEXT.format(k=k),
            "tool_call": {"id": tool_call_id(k), "name": TOOL, "args": {"expression": EXPRESSION}},
        }
    return {"text": FINAL_TEXT}


def instant_tool(args: dict[str, Any]) -> str:
    """The calculator itself (the same evaluator the loopwire tool worker runs)."""
    from services.tools.builtins.calculator import evaluate, format_number

    return format_number(evaluate(str(args["expression"])))
