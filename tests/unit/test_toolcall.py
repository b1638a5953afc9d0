"""The one checked tool call: made once from a model reply, shared by the driver and the executor.

Covers the verdict on a call's arguments (made by the sanitiser, and again only for a step continued
from its record), the wire view, the results fitted to the record by the executor, the input check
a caller that already checked may skip (the committer still checks), and the model interface
depending on no adapter.
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import msgspec
import pytest

from services.toolcaller.base import PlannedCall, RecordFit
from services.toolcaller.executor import fit_results
from shared import events as ev
from shared import shaping
from shared.codec import encode_event
from shared.content import AIMessage, ImageBlock, TextBlock, ToolUseBlock
from shared.errors import InvalidEventError
from shared.strictjson import EMBEDDED_MAX_DEPTH
from shared.toolcall import ToolCall
from shared.validate import validate_event
from tests.unit.test_validate import valid_event

GOOD = b'{"expression": "17*23"}'
BAD = [
    b'{"a":1,"a":2}',
    b"{not json",
    b'{"a":"\xff"}',
    b"[" * (EMBEDDED_MAX_DEPTH + 1) + b"]" * (EMBEDDED_MAX_DEPTH + 1),
]


def reply(*inputs: bytes) -> AIMessage:
    return AIMessage(
        blocks=[
            TextBlock(text="let me see"),
            *(ToolUseBlock(id=f"t{i}", name="calculator", input=msgspec.Raw(raw)) for i, raw in enumerate(inputs)),
        ]
    )


def test_a_strict_call_is_valid_and_keeps_the_bytes_the_model_sent() -> None:
    _, [call] = shaping.sanitize_step(reply(GOOD))
    assert call == ToolCall(id="t0", name="calculator", input=GOOD.decode(), data=GOOD)
    assert not call.invalid


@pytest.mark.parametrize("bad", BAD, ids=range(len(BAD)))
def test_a_non_strict_call_says_why_once_and_is_stored_as_empty_object(bad: bytes) -> None:
    stored, [call] = shaping.sanitize_step(reply(bad))
    assert call.invalid
    assert stored.blocks is not None and bytes(stored.blocks[1].input) == b"{}"  # type: ignore[union-attr]


def test_the_wire_view_is_what_sanitize_ai_message_gives() -> None:
    msg = reply(GOOD, BAD[0], b"")
    stored, calls = shaping.sanitize_step(msg)
    assert (stored, [c.raw() for c in calls]) == shaping.sanitize_ai_message(msg)


@pytest.mark.parametrize("raw", [GOOD, *BAD[:2], BAD[3]])
def test_a_recorded_call_gets_the_same_verdict(raw: bytes) -> None:
    _, [call] = shaping.sanitize_step(reply(raw))
    again = ToolCall.of(call.raw())
    assert again == call
    assert bool(again.invalid) == bool(call.invalid)


def test_planned_call_constructors_take_the_wire_view_or_a_checked_call() -> None:
    use = ev.RawToolUse(id="t1", name="calculator", input=GOOD.decode())
    a = PlannedCall.approved(use, "e1")
    b = PlannedCall.approved(ToolCall.of(use), "e1")
    assert a == b and a.decision is not None and a.decision.effect == "approve"
    assert PlannedCall.of(ev.RawToolUse(id="t2", name="x", input="{"), "e2").call.invalid


def test_results_leave_the_executor_fitted_to_the_record() -> None:
    ai = reply(GOOD)
    small = [shaping.tool_result_message("t0", "391", is_error=False)]
    assert fit_results(RecordFit(ai, 1 << 20), small) is small
    big = [shaping.tool_result_message(f"t{i}", "x" * 400_000, is_error=i == 1) for i in range(3)]
    fitted = fit_results(RecordFit(ai, 1 << 20), big)
    assert len(msgspec.json.encode([ai, *fitted])) <= int((1 << 20) * 0.9) - 4096
    assert [(r.tool_use_id, r.is_error) for r in fitted] == [(r.tool_use_id, r.is_error) for r in big]


def test_images_are_left_out_before_any_text_is_cut_to_fit_the_record() -> None:
    ai = reply(GOOD)
    image = ImageBlock(media_type="image/png", data="A" * 1_000_000)
    text, images = shaping.result_content([TextBlock(text="a chart:"), image, TextBlock(text="done")])
    fitted = fit_results(
        RecordFit(ai, 1 << 20), [shaping.tool_result_message("t0", text, is_error=False, images=images)]
    )
    assert fitted[0].blocks == [
        TextBlock(text="a chart:\n[image 1: image/png, 732.4 KB, omitted: the step's record has no room for it]\ndone")
    ]
    # An image that fits stays, after the text that notes it.
    small = ImageBlock(media_type="image/png", data="A" * 4000)
    text, images = shaping.result_content([TextBlock(text="a chart:"), small])
    kept = fit_results(RecordFit(ai, 1 << 20), [shaping.tool_result_message("t0", text, is_error=False, images=images)])
    assert kept[0].blocks == [TextBlock(text="a chart:\n[image 1: image/png, 2.9 KB]"), small]
    assert encode_event(valid_event(ev.StepDone, messages=[ai, *kept]))


def _step_with_input(raw: bytes) -> ev.Event:
    ai = AIMessage(blocks=[ToolUseBlock(id="t1", name="calculator", input=msgspec.Raw(raw))])
    return valid_event(ev.StepDone, messages=[ai, shaping.tool_result_message("t1", "ok", is_error=False)])


def test_inputs_checked_skips_only_the_input_parse() -> None:
    bad = _step_with_input(b'{"a":1,"a":2}')
    with pytest.raises(InvalidEventError):
        validate_event(bad)
    with pytest.raises(InvalidEventError):
        encode_event(bad)
    validate_event(bad, inputs_checked=True)  # the caller vouched for its inputs
    # Everything else is still checked.
    no_result = valid_event(ev.StepDone, messages=[AIMessage(blocks=[ToolUseBlock(id="t1", name="c")])])
    with pytest.raises(InvalidEventError):
        validate_event(no_result, inputs_checked=True)


def _imports(module: str) -> set[str]:
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin is not None
    tree = ast.parse(Path(spec.origin).read_text())
    return {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module} | {
        a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names
    }


@pytest.mark.parametrize("module", ["base", "accumulator"])
def test_the_model_interface_imports_no_adapter(module: str) -> None:
    pkg = "services.model_step.models"
    found = _imports(f"{pkg}.{module}")
    for adapter in ("demo", "scripted", "openai_compat", "anthropic", "httpstream", "registry"):
        assert f"{pkg}.{adapter}" not in found
    assert f"{pkg}.accumulator" not in _imports(f"{pkg}.base")  # the accumulator depends on the base
