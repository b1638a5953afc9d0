"""The demo model: offline, deterministic, rule-based, labelled as not an LLM."""

from __future__ import annotations

import json
import re

import msgspec
import pytest

from services.model_step.models import resolve_model
from services.model_step.models.accumulator import StreamAccumulator
from services.model_step.models.base import ModelChunk, ModelRequest, ToolDef
from services.model_step.models.demo import LABEL, DemoModel, choose_calls
from shared.content import AIMessage, Message, ToolUseBlock, Usage, text_of, tool_result, tool_uses, user_text

TOOLS = [ToolDef(name=n, description=n) for n in ("calculator", "clock", "kv_memory", "read_file", "sleep")]
TOKYO = "what is 17*23 and what time is it in Tokyo?"


async def run(request: ModelRequest) -> tuple[list[ModelChunk], StreamAccumulator]:
    chunks = [c async for c in DemoModel().stream(request)]
    acc = StreamAccumulator()
    for c in chunks:
        acc.add(c)
    return chunks, acc


@pytest.mark.anyio
async def test_tokyo_example_is_one_step_with_two_tool_uses_then_a_text_answer_with_391() -> None:
    history: list[Message] = [user_text(TOKYO)]
    chunks, acc = await run(ModelRequest(messages=history, tools=TOOLS))
    step = acc.message()
    uses = tool_uses(step)
    assert [(u.id, u.name, json.loads(bytes(u.input))) for u in uses] == [
        ("toolu_demo_1", "calculator", {"expression": "17*23"}),
        ("toolu_demo_2", "clock", {"timezone": "Asia/Tokyo"}),
    ]
    assert text_of(step).startswith(LABEL)
    assert acc.finish_reason == "tool_use"
    assert acc.usage is not None and acc.usage.input_tokens > 0 and acc.usage.output_tokens > 0
    # Streamed in pieces: several text chunks, arguments split across fragments of both calls.
    assert sum(c.kind == "text" for c in chunks) >= 2
    for i in (0, 1):
        assert sum(c.kind == "tool_use" and c.index == i and c.text != "" for c in chunks) >= 2

    history += [step, tool_result("toolu_demo_1", "391"), tool_result("toolu_demo_2", "2026-01-01T09:30:00+09:00")]
    chunks, acc = await run(ModelRequest(messages=history, tools=TOOLS))
    answer = acc.message()
    assert tool_uses(answer) == []
    assert "391" in text_of(answer) and "Asia/Tokyo" in text_of(answer) and "09:30" in text_of(answer)
    assert text_of(answer).startswith(LABEL)
    assert sum(c.kind == "text" for c in chunks) >= 3
    assert acc.finish_reason == "end_turn"
    # "Usage" counts words: the whole conversation in, the answer out.
    words_in = sum(len(re.findall(r"\w+", text_of(m))) for m in history)
    assert acc.usage == Usage(input_tokens=words_in, output_tokens=len(re.findall(r"\w+", text_of(answer))))


@pytest.mark.anyio
async def test_deterministic() -> None:
    request = ModelRequest(messages=[user_text(TOKYO)], tools=TOOLS)
    first, _ = await run(request)
    second, _ = await run(request)
    assert first == second


@pytest.mark.anyio
async def test_only_offers_tools_present_in_the_request() -> None:
    _, acc = await run(ModelRequest(messages=[user_text(TOKYO)], tools=[ToolDef(name="clock")]))
    assert [u.name for u in tool_uses(acc.message())] == ["clock"]
    _, acc = await run(ModelRequest(messages=[user_text(TOKYO)], tools=[]))
    msg = acc.message()
    assert tool_uses(msg) == [] and "none matched" in text_of(msg) and acc.finish_reason == "end_turn"


@pytest.mark.anyio
async def test_no_matching_words_answers_in_text() -> None:
    _, acc = await run(ModelRequest(messages=[user_text("hello, how are you?")], tools=TOOLS))
    assert tool_uses(acc.message()) == [] and text_of(acc.message()).startswith(LABEL)


@pytest.mark.anyio
async def test_tool_use_ids_continue_across_the_loop_and_follow_the_last_user_message() -> None:
    first = AIMessage(blocks=[ToolUseBlock(id="toolu_demo_1", name="clock"), ToolUseBlock(id="toolu_demo_2", name="x")])
    history: list[Message] = [
        user_text("what time is it?"),
        first,
        tool_result("toolu_demo_1", "12:00"),
        tool_result("toolu_demo_2", "ok"),
        AIMessage(blocks=[]),
        user_text("remember that my colour is blue"),  # no results after it yet: pick tools again
    ]
    _, acc = await run(ModelRequest(messages=history, tools=TOOLS))
    uses = tool_uses(acc.message())
    assert [(u.id, u.name) for u in uses] == [("toolu_demo_3", "kv_memory")]
    assert json.loads(bytes(uses[0].input)) == {"action": "remember", "key": "colour", "value": "blue"}


@pytest.mark.anyio
async def test_error_results_are_reported() -> None:
    history: list[Message] = [
        user_text("read missing.txt"),
        AIMessage(
            blocks=[ToolUseBlock(id="toolu_demo_1", name="read_file", input=msgspec.Raw(b'{"path":"missing.txt"}'))]
        ),
        tool_result("toolu_demo_1", "error: no such file", is_error=True),
    ]
    _, acc = await run(ModelRequest(messages=history, tools=TOOLS))
    assert "read_file failed: error: no such file" in text_of(acc.message())


@pytest.mark.parametrize(
    ("text", "calls"),
    [
        (TOKYO, [("calculator", {"expression": "17*23"}), ("clock", {"timezone": "Asia/Tokyo"})]),
        ("what is (3+4) * 5?", [("calculator", {"expression": "(3+4) * 5"})]),
        ("12 times 7", [("calculator", {"expression": "12 * 7"})]),
        (
            "time in London and New York",
            [("clock", {"timezone": "Europe/London"}), ("clock", {"timezone": "America/New_York"})],
        ),
        ("what's the date?", [("clock", {"timezone": "UTC"})]),
        ("the time in Europe/Lisbon", [("clock", {"timezone": "Europe/Lisbon"})]),
        ("remember that my car is red", [("kv_memory", {"action": "remember", "key": "car", "value": "red"})]),
        ("what is my car?", [("kv_memory", {"action": "recall", "key": "car", "value": ""})]),
        ("list memories", [("kv_memory", {"action": "list", "key": "", "value": ""})]),
        ("please read docs/models.md", [("read_file", {"path": "docs/models.md"})]),
        ("Tokyo is nice", []),
    ],
)
def test_choose_calls(text: str, calls: list[tuple[str, dict[str, str]]]) -> None:
    assert choose_calls(text, ["calculator", "clock", "kv_memory", "read_file"]) == calls


def test_resolve_demo_and_label() -> None:
    model = resolve_model("demo")
    assert isinstance(model, DemoModel) and model.name == "demo"
    assert "not an LLM" in LABEL and "not an LLM" in (DemoModel.__doc__ or "")


SHOUT = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}
SUM = {
    "type": "object",
    "properties": {"a": {"type": "number"}, "b": {"type": "integer"}, "mode": {"enum": ["fast", "slow"]}},
    "required": ["a", "b", "mode"],
}


@pytest.mark.parametrize(
    ("text", "calls"),
    [
        ('shout "hello there"', [("shout", {"text": "hello there"})]),
        ("please shout: good morning", [("shout", {"text": "good morning"})]),
        ("use everything_echo to say hi", [("everything_echo", {"message": "to say hi"})]),
        ("add 2.5 and 4 with everything_get-sum", [("everything_get-sum", {"a": 2.5, "b": 4, "mode": "fast"})]),
        ("what is 2*3? then SHOUT 'done'", [("calculator", {"expression": "2*3"}), ("shout", {"text": "done"})]),
        ("shouting is not the tool's name", []),
    ],
    ids=["quoted", "after-name", "mcp-echo", "numbers-enum", "with-builtin", "no-whole-word"],
)
def test_any_offered_tool_the_words_name_is_called(text: str, calls: list[tuple[str, dict[str, object]]]) -> None:
    schemas = {
        "shout": SHOUT,
        "everything_echo": {"type": "object", "properties": {"message": {"type": "string"}}, "required": ["message"]},
        "everything_get-sum": SUM,
    }
    assert choose_calls(text, ["calculator", *schemas], schemas) == calls
