"""Every model adapter leaves the request's messages as they were: the driver hands adapters the
loop's folded history itself (no copy per step), which later steps and commits read again."""

from __future__ import annotations

from pathlib import Path

import anyio
import msgspec
import pytest

from services.model_step.models import anthropic, openai_compat
from services.model_step.models.base import ModelRequest
from services.model_step.models.demo import DemoModel
from services.model_step.models.scripted import ScriptedModel
from shared import content as c


def _history() -> list[c.Message]:
    return [
        c.SystemMessage(blocks=[c.TextBlock(text="be brief")]),
        c.UserMessage(blocks=[c.TextBlock(text="hi"), c.ImageBlock(media_type="image/png", data="iVBORw0KGgo=")]),
        c.AIMessage(
            blocks=[
                c.ThinkingBlock(thinking="hmm", signature="sig"),
                c.TextBlock(text="let me look"),
                c.ToolUseBlock(id="t1", name="calculator", input=msgspec.Raw(b'{"expression": "1+1"}')),
                c.ToolUseBlock(id="t2", name="clock", input=msgspec.Raw(b"{}")),
            ],
            usage=c.Usage(input_tokens=10, output_tokens=5),
        ),
        c.ToolResultMessage(tool_use_id="t1", blocks=[c.TextBlock(text="2")]),
        c.ToolResultMessage(tool_use_id="t2", blocks=[c.TextBlock(text="noon")], is_error=True),
        c.UserMessage(blocks=[c.TextBlock(text="and then?")]),
        c.AIMessage(blocks=[c.TextBlock(text="done")]),
        c.UserMessage(blocks=[c.TextBlock(text="again")]),
    ]


@pytest.mark.parametrize("convert", [anthropic.convert_messages, openai_compat.convert_messages])
def test_provider_conversions_leave_the_history_unchanged(convert: object) -> None:
    messages = _history()
    before = msgspec.json.encode(messages)
    convert("system prompt", messages)  # type: ignore[operator]
    assert msgspec.json.encode(messages) == before


def test_local_models_leave_the_history_unchanged(tmp_path: Path) -> None:
    script = tmp_path / "s.json"
    script.write_text('{"responses": ["one"], "repeat_last": true}')

    async def consume() -> None:
        for model in (DemoModel(chunk_delay=0), ScriptedModel.from_file(str(script))):
            messages = _history()
            before = msgspec.json.encode(messages)
            async for _ in model.stream(ModelRequest(messages=messages)):
                pass
            assert msgspec.json.encode(messages) == before

    anyio.run(consume)
