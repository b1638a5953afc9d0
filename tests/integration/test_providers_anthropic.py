"""The Anthropic Messages adapter against a local server replaying recorded event streams."""

from __future__ import annotations

from collections.abc import Iterator

import msgspec
import pytest

from services.model_step.models import resolve_model
from services.model_step.models.accumulator import StreamAccumulator
from services.model_step.models.anthropic import AnthropicModel
from services.model_step.models.base import ModelRequest, ModelStreamError, ToolDef
from services.model_step.models.config import ProviderConfig
from shared.content import (
    AIMessage,
    Message,
    SystemMessage,
    TextBlock,
    ThinkingBlock,
    ToolUseBlock,
    Usage,
    text_of,
    tool_result,
    tool_uses,
    user_text,
)
from tests.fakeproviders import FakeProvider, Reply, anthropic_stream, collect, load_frames, sse

KEY = "sk-ant-test-ANTHROPIC-5ecret-0123456789"
TOKYO = "what is 17*23 and what time is it in Tokyo?"


@pytest.fixture
def fake() -> Iterator[FakeProvider]:
    with FakeProvider("anthropic") as server:
        yield server


def model_for(fake: FakeProvider, **overrides: object) -> AnthropicModel:
    cfg = {"base_url": fake.base_url, "api_key": KEY, "backoff_seconds": 0.01, "backoff_cap_seconds": 0.05}
    cfg.update(overrides)
    return AnthropicModel("claude-test", ProviderConfig(**cfg))  # type: ignore[arg-type]


def request(*messages: Message, **kw: object) -> ModelRequest:
    return ModelRequest(model="claude-test", messages=list(messages) or [user_text(TOKYO)], **kw)  # type: ignore[arg-type]


def uses(acc: StreamAccumulator) -> list[tuple[str, str, str]]:
    return [(u.id, u.name, bytes(u.input).decode()) for u in tool_uses(acc.message())]


@pytest.mark.anyio
async def test_tool_use_arguments_in_several_fragments(fake: FakeProvider) -> None:
    fake.enqueue(Reply(frames=load_frames("anthropic/tool_use_fragments.sse")))
    chunks, acc = await collect(model_for(fake), request())
    assert sum(c.kind == "tool_use" and c.text != "" for c in chunks) == 3
    assert uses(acc) == [("toolu_01T1x1fJ34qAmk2tNTrN7Up6", "calculator", '{"expression": "17*23"}')]
    assert text_of(acc.message()) == "Let me calculate that."
    assert acc.finish_reason == "tool_use"
    assert acc.usage == Usage(input_tokens=472, output_tokens=89)


@pytest.mark.anyio
async def test_parallel_tool_uses_and_one_without_arguments(fake: FakeProvider) -> None:
    fake.enqueue(Reply(frames=load_frames("anthropic/parallel_tools.sse")))
    _, acc = await collect(model_for(fake), request())
    assert uses(acc) == [
        ("toolu_01A", "calculator", '{"expression": "17*23"}'),
        ("toolu_01B", "clock", '{"timezone": "Asia/Tokyo"}'),
        ("toolu_01C", "kv_memory", "{}"),  # no input_json_delta: the start's input
    ]
    assert acc.usage == Usage(input_tokens=472, output_tokens=131)


@pytest.mark.anyio
async def test_malformed_arguments_are_passed_on_verbatim(fake: FakeProvider) -> None:
    fake.enqueue(Reply(frames=load_frames("anthropic/malformed_args.sse")))
    _, acc = await collect(model_for(fake), request())
    assert [(r.id, r.input) for r in acc.raw_tool_uses()] == [("toolu_01M", '{"expression": 17*23,')]


@pytest.mark.anyio
async def test_text_only_answer_with_cache_usage(fake: FakeProvider) -> None:
    fake.enqueue(Reply(frames=load_frames("anthropic/text_only.sse")))
    chunks, acc = await collect(model_for(fake), request())
    assert [c.text for c in chunks if c.kind == "text"] == ["17 times 23", " is 391,", " and in Tokyo it is 09:30."]
    assert acc.finish_reason == "end_turn" and tool_uses(acc.message()) == []
    assert acc.usage == Usage(input_tokens=610, output_tokens=17, cache_read_tokens=300, cache_creation_tokens=20)


@pytest.mark.anyio
@pytest.mark.parametrize("cut", [True, False], ids=["connection-dropped", "body-ended"])
async def test_stream_cut_mid_tool_use_is_a_stream_error_after_the_prefix(fake: FakeProvider, cut: bool) -> None:
    fake.enqueue(Reply(frames=load_frames("anthropic/cut_mid_tool.sse"), cut=cut))
    got = []
    with pytest.raises(ModelStreamError) as info:
        async for c in model_for(fake).stream(request()):
            got.append(c)
    assert [c.text for c in got if c.kind == "text"] == ["Checking the clock."]
    assert KEY not in str(info.value)


@pytest.mark.anyio
async def test_error_event(fake: FakeProvider) -> None:
    fake.enqueue(Reply(frames=load_frames("anthropic/error_event.sse")))
    got = []
    with pytest.raises(ModelStreamError, match="overloaded_error: Overloaded"):
        async for c in model_for(fake).stream(request()):
            got.append(c)
    assert [c.text for c in got] == ["The answer"]


@pytest.mark.anyio
async def test_thinking_with_signature_round_trips(fake: FakeProvider) -> None:
    fake.enqueue(Reply(frames=load_frames("anthropic/thinking_tool.sse")))
    _, acc = await collect(model_for(fake), request())
    step = acc.message()
    blocks = step.blocks or []
    assert isinstance(blocks[0], ThinkingBlock)
    assert blocks[0].thinking == "The user wants 17*23. I should use the calculator."
    assert blocks[0].signature == "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds"
    assert uses(acc) == [("toolu_01K", "calculator", '{"expression": "17*23"}')]

    fake.enqueue(Reply(frames=load_frames("anthropic/text_only.sse")))
    await collect(model_for(fake), request(user_text(TOKYO), step, tool_result("toolu_01K", "391")))
    sent = fake.requests[1].json()["messages"]
    assert sent[1] == {
        "role": "assistant",
        "content": [
            {
                "type": "thinking",
                "thinking": "The user wants 17*23. I should use the calculator.",
                "signature": "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds",
            },
            {"type": "tool_use", "id": "toolu_01K", "name": "calculator", "input": {"expression": "17*23"}},
        ],
    }


@pytest.mark.anyio
async def test_request_body_history_tools_max_tokens_and_auth(fake: FakeProvider) -> None:
    fake.enqueue(Reply(frames=load_frames("anthropic/text_only.sse")))
    step = AIMessage(
        blocks=[
            ThinkingBlock(thinking="unsigned thinking is never sent"),
            TextBlock(text="Let me check."),
            TextBlock(text=""),
            ToolUseBlock(id="call_1", name="calculator", input=msgspec.Raw(b'{"expression":"17*23"}')),
            ToolUseBlock(id="call_2", name="clock", input=msgspec.Raw(b'{"timezone":"Asia/Tokyo"}')),
        ]
    )
    history: list[Message] = [
        SystemMessage(blocks=[TextBlock(text="Answer in English.")]),
        user_text(TOKYO),
        step,
        tool_result("call_1", "391"),
        tool_result("call_2", "error: unknown timezone", is_error=True),
        user_text("and be quick"),  # folded input after the results: same user message
    ]
    tools = [
        ToolDef(
            name="calculator",
            description="Evaluate",
            input_schema={"type": "object", "properties": {"expression": {"type": "string"}}},
        ),
        ToolDef(name="clock", description="Current time"),
    ]
    await collect(model_for(fake), request(*history, system="You are terse.", tools=tools, max_tokens=77))
    [sent] = fake.requests
    assert sent.path == "/v1/messages"
    assert sent.headers["x-api-key"] == KEY and sent.headers["anthropic-version"] == "2023-06-01"
    assert "authorization" not in sent.headers
    body = sent.json()
    assert body["model"] == "claude-test" and body["stream"] is True and body["max_tokens"] == 77
    assert body["system"] == "You are terse.\n\nAnswer in English."
    assert "thinking" not in body
    assert body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": TOKYO}]},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Let me check."},
                {"type": "tool_use", "id": "call_1", "name": "calculator", "input": {"expression": "17*23"}},
                {"type": "tool_use", "id": "call_2", "name": "clock", "input": {"timezone": "Asia/Tokyo"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "call_1", "content": "391"},
                {
                    "type": "tool_result",
                    "tool_use_id": "call_2",
                    "content": "error: unknown timezone",
                    "is_error": True,
                },
                {"type": "text", "text": "and be quick"},
            ],
        },
    ]
    assert body["tools"] == [
        {"name": "calculator", "description": "Evaluate", "input_schema": tools[0].input_schema},
        {"name": "clock", "description": "Current time", "input_schema": {"type": "object", "properties": {}}},
    ]


@pytest.mark.anyio
async def test_default_max_tokens_and_thinking_budget(fake: FakeProvider) -> None:
    fake.enqueue(
        Reply(frames=load_frames("anthropic/text_only.sse")), Reply(frames=load_frames("anthropic/text_only.sse"))
    )
    await collect(model_for(fake), request(max_tokens=0))
    body = fake.requests[0].json()
    assert body["max_tokens"] == 4096 and "system" not in body and "tools" not in body
    await collect(model_for(fake, thinking_budget=8000), request(max_tokens=1000))
    body = fake.requests[1].json()
    assert body["thinking"] == {"type": "enabled", "budget_tokens": 8000} and body["max_tokens"] == 9024


@pytest.mark.anyio
async def test_unknown_events_and_blocks_are_skipped_but_never_undecodable_ones(fake: FakeProvider) -> None:
    frames = anthropic_stream(text=["hi"])
    extra = [
        sse({"type": "some_future_event", "x": 1}, "some_future_event"),
        sse({"type": "content_block_start", "index": 7, "content_block": {"type": "redacted_thinking", "data": "x"}}),
        sse({"type": "content_block_delta", "index": 1, "delta": {"type": "citations_delta", "citation": {}}}),
    ]
    fake.enqueue(Reply(frames=frames[:1] + extra + frames[1:]))
    _, acc = await collect(model_for(fake), request())
    assert [type(b).__name__ for b in acc.message().blocks or []] == ["TextBlock"]


@pytest.mark.anyio
async def test_resolve_model_from_env_points_at_the_server(fake: FakeProvider) -> None:
    fake.enqueue(Reply(frames=load_frames("anthropic/parallel_tools.sse")))
    model = resolve_model("anthropic:claude-local", env=fake.env(api_key=KEY))
    _, acc = await collect(model, ModelRequest(messages=[user_text(TOKYO)]))
    assert len(tool_uses(acc.message())) == 3
    assert fake.requests[0].json()["model"] == "claude-local"
