"""A tool result with an image, as each model adapter sends it: Anthropic takes the image with the
result; OpenAI-compatible tool messages take text only, where the image's note stands."""

from __future__ import annotations

from services.model_step.models import anthropic, openai_compat
from shared import content as c
from shared import shaping

IMAGE = c.ImageBlock(media_type="image/png", data="iVBORw0KGgo=")


def _history() -> list[c.Message]:
    text, images = shaping.result_content([c.TextBlock(text="the chart:"), IMAGE])
    return [
        c.UserMessage(blocks=[c.TextBlock(text="draw")]),
        c.AIMessage(blocks=[c.ToolUseBlock(id="t1", name="chart")]),
        shaping.tool_result_message("t1", text, is_error=False, images=images),
    ]


def test_anthropic_sends_the_image_with_the_result() -> None:
    _, messages = anthropic.convert_messages("", _history())
    [result] = messages[-1]["content"]
    assert result["type"] == "tool_result" and result["tool_use_id"] == "t1"
    assert result["content"] == [
        {"type": "text", "text": "the chart:\n[image 1: image/png, 8 bytes]"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}},
    ]


def test_openai_sends_the_text_with_the_image_noted() -> None:
    messages = openai_compat.convert_messages("", _history())
    assert messages[-1] == {
        "role": "tool",
        "tool_call_id": "t1",
        "content": "the chart:\n[image 1: image/png, 8 bytes]",
    }
