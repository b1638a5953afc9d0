"""The OpenAI-compatible adapter against a local server replaying recorded chat-completion streams."""

from __future__ import annotations

import json
from collections.abc import Iterator

import msgspec
import pytest

from services.model_step.models import resolve_model
from services.model_step.models.base import ModelRequest, ModelStreamError, ToolDef
from services.model_step.models.config import ProviderConfig
from services.model_step.models.openai_compat import OpenAICompatModel
from shared.content import (
    AIMessage,
    ImageBlock,
    Message,
    TextBlock,
    ThinkingBlock,
    ToolUseBlock,
    Usage,
    UserMessage,
    text_of,
    tool_result,
    tool_uses,
    user_text,
)
from tests.fakeproviders import FakeProvider, Reply, collect, load_frames, openai_stream, sse

KEY = "sk-test-OPENAI-5ecret-key-0123456789"
TOKYO = "what is 17*23 and what time is it in Tokyo?"


@pytest.fixture
def fake() -> Iterator[FakeProvider]:
    with FakeProvider("openai") as server:
        yield server


def model_for(fake: FakeProvider, **overrides: object) -> OpenAICompatModel:
    cfg = {"base_url": fake.base_url, "api_key": KEY, "backoff_seconds": 0.01, "backoff_cap_seconds": 0.05}
    cfg.update(overrides)
    return OpenAICompatModel("gpt-test", ProviderConfig(**cfg))  # type: ignore[arg-type]


def request(*messages: Message, **kw: object) -> ModelRequest:
    return ModelRequest(model="gpt-test", messages=list(messages) or [user_text(TOKYO)], **kw)  # type: ignore[arg-type]


def uses(acc: object) -> list[tuple[str, str, str]]:
    return [(u.id, u.name, bytes(u.input).decode()) for u in tool_uses(acc.message())]  # type: ignore[attr-defined]


@pytest.mark.anyio
async def test_tool_call_arguments_in_several_fragments(fake: FakeProvider) -> None:
    fake.enqueue(Reply(frames=load_frames("openai/tool_call_fragments.sse")))
    chunks, acc = await collect(model_for(fake), request())
    assert sum(c.kind == "tool_use" and c.text != "" for c in chunks) == 4
    assert uses(acc) == [("call_Qm1x8", "calculator", '{"expression":"17*23"}')]
    assert text_of(acc.message()) == "Let me calculate that."
    assert acc.finish_reason == "tool_use"
    assert acc.usage == Usage(input_tokens=82, output_tokens=24)


@pytest.mark.anyio
async def test_two_parallel_tool_calls_and_cached_usage(fake: FakeProvider) -> None:
    fake.enqueue(Reply(frames=load_frames("openai/parallel_tools.sse")))
    _, acc = await collect(model_for(fake), request())
    assert uses(acc) == [
        ("call_A1", "calculator", '{"expression": "17*23"}'),
        ("call_B2", "clock", '{"timezone": "Asia/Tokyo"}'),
    ]
    # prompt_tokens 120 of which 64 cached: kept apart, the context total is unchanged.
    assert acc.usage == Usage(input_tokens=56, cache_read_tokens=64, output_tokens=52)
    assert acc.usage.context_tokens == 120


@pytest.mark.anyio
async def test_malformed_arguments_are_passed_on_verbatim(fake: FakeProvider) -> None:
    fake.enqueue(Reply(frames=load_frames("openai/malformed_args.sse")))
    _, acc = await collect(model_for(fake), request())
    assert [(r.id, r.name, r.input) for r in acc.raw_tool_uses()] == [
        ("call_M1", "calculator", '{"expression": 17*23,')
    ]


@pytest.mark.anyio
async def test_text_only_answer_with_usage(fake: FakeProvider) -> None:
    fake.enqueue(Reply(frames=load_frames("openai/text_only.sse")))
    chunks, acc = await collect(model_for(fake), request())
    assert [c.text for c in chunks if c.kind == "text"] == ["17 times 23", " is 391,", " and in Tokyo it is 09:30."]
    assert tool_uses(acc.message()) == [] and acc.finish_reason == "end_turn"
    assert acc.usage == Usage(input_tokens=82, cache_read_tokens=128, output_tokens=17, reasoning_tokens=4)


@pytest.mark.anyio
@pytest.mark.parametrize("cut", [True, False], ids=["connection-dropped", "body-ended"])
async def test_stream_cut_mid_tool_call_is_a_stream_error_after_the_prefix(fake: FakeProvider, cut: bool) -> None:
    fake.enqueue(Reply(frames=load_frames("openai/cut_mid_tool.sse"), cut=cut))
    got = []
    with pytest.raises(ModelStreamError) as info:
        async for c in model_for(fake).stream(request()):
            got.append(c)
    assert [c.text for c in got if c.kind == "text"] == ["Checking the clock."]
    assert "openai:gpt-test" in str(info.value) and KEY not in str(info.value)


@pytest.mark.anyio
async def test_error_event_in_the_stream(fake: FakeProvider) -> None:
    fake.enqueue(Reply(frames=load_frames("openai/error_event.sse")))
    got = []
    with pytest.raises(ModelStreamError, match="server_error: The server had an error"):
        async for c in model_for(fake).stream(request()):
            got.append(c)
    assert [c.text for c in got] == ["The answer"]


@pytest.mark.anyio
async def test_finish_reason_without_done_is_complete_and_tool_without_arguments_gets_braces(
    fake: FakeProvider,
) -> None:
    # Some servers omit [DONE]; a finish_reason then marks the end. Empty arguments become {}.
    fake.enqueue(Reply(frames=openai_stream(tool_calls=[("c1", "clock", [])], done=False, usage=None)))
    _, acc = await collect(model_for(fake), request())
    assert uses(acc) == [("c1", "clock", "{}")] and acc.usage is None


@pytest.mark.anyio
async def test_reasoning_and_refusal_deltas(fake: FakeProvider) -> None:
    base = {"id": "x", "object": "chat.completion.chunk", "model": "m"}
    frames = [
        sse({**base, "choices": [{"index": 0, "delta": {"reasoning_content": "thinking..."}}]}),
        sse({**base, "choices": [{"index": 0, "delta": {"refusal": "I can't do that."}}]}),
        sse({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "content_filter"}]}),
        b"data: [DONE]\n\n",
    ]
    fake.enqueue(Reply(frames=frames))
    _, acc = await collect(model_for(fake), request())
    blocks = acc.message().blocks
    assert [type(b).__name__ for b in blocks] == ["ThinkingBlock", "RefusalBlock"]
    assert acc.finish_reason == "refusal"


@pytest.mark.anyio
async def test_request_body_history_tools_max_tokens_and_auth(fake: FakeProvider) -> None:
    fake.enqueue(Reply(frames=load_frames("openai/text_only.sse")))
    step = AIMessage(
        blocks=[
            ThinkingBlock(thinking="not sent to chat completions", signature="s"),
            TextBlock(text="Let me check."),
            ToolUseBlock(id="call_1", name="calculator", input=msgspec.Raw(b'{"expression":"17*23"}')),
            ToolUseBlock(id="call_2", name="clock", input=msgspec.Raw(b'{"timezone":"Asia/Tokyo"}')),
        ],
        usage=Usage(input_tokens=1),
    )
    history: list[Message] = [
        user_text(TOKYO),
        step,
        tool_result("call_1", "391"),
        tool_result("call_2", "unknown timezone", is_error=True),
        UserMessage(blocks=[TextBlock(text="and this?"), ImageBlock(media_type="image/png", data="iVBOR")]),
    ]
    tools = [
        ToolDef(
            name="calculator",
            description="Evaluate an arithmetic expression",
            input_schema={
                "type": "object",
                "properties": {"expression": {"type": "string"}},
                "required": ["expression"],
            },
        ),
        ToolDef(name="clock", description="Current time"),
    ]
    await collect(model_for(fake), request(*history, system="You are terse.", tools=tools, max_tokens=77))
    [sent] = fake.requests
    assert sent.path == "/v1/chat/completions"
    assert sent.headers["authorization"] == f"Bearer {KEY}"
    assert sent.headers["content-type"] == "application/json"
    body = sent.json()
    assert body["model"] == "gpt-test" and body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert body["max_tokens"] == 77
    assert body["messages"] == [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": TOKYO},
        {
            "role": "assistant",
            "content": "Let me check.",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "calculator", "arguments": '{"expression":"17*23"}'},
                },
                {
                    "id": "call_2",
                    "type": "function",
                    "function": {"name": "clock", "arguments": '{"timezone":"Asia/Tokyo"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "391"},
        {"role": "tool", "tool_call_id": "call_2", "content": "error: unknown timezone"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "and this?"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBOR"}},
            ],
        },
    ]
    assert body["tools"] == [
        {"type": "function", "function": {"name": t.name, "description": t.description, "parameters": p}}
        for t, p in ((tools[0], tools[0].input_schema), (tools[1], {"type": "object", "properties": {}}))
    ]


@pytest.mark.anyio
async def test_optional_fields_left_out_and_no_key_no_auth_header(fake: FakeProvider) -> None:
    fake.enqueue(Reply(frames=load_frames("openai/text_only.sse")))
    await collect(model_for(fake, api_key="", max_tokens_field="max_completion_tokens"), request(max_tokens=0))
    sent = fake.requests[0]
    body = sent.json()
    assert "authorization" not in sent.headers
    assert "tools" not in body and "max_tokens" not in body and "max_completion_tokens" not in body
    assert [m["role"] for m in body["messages"]] == ["user"]
    fake.enqueue(Reply(frames=load_frames("openai/text_only.sse")))
    await collect(model_for(fake, max_tokens_field="max_completion_tokens"), request(max_tokens=5))
    assert fake.requests[1].json()["max_completion_tokens"] == 5


@pytest.mark.anyio
async def test_resolve_model_from_env_points_at_the_server(fake: FakeProvider) -> None:
    fake.enqueue(Reply(frames=load_frames("openai/parallel_tools.sse")))
    model = resolve_model("openai:local-llama", env=fake.env(api_key=KEY))
    _, acc = await collect(model, ModelRequest(messages=[user_text(TOKYO)]))
    assert len(tool_uses(acc.message())) == 2
    assert json.loads(fake.requests[0].body)["model"] == "local-llama"


@pytest.mark.anyio
async def test_tool_calls_without_index_fold_by_id(fake: FakeProvider) -> None:
    # Some OpenAI-compatible servers send each call whole, without "index".
    def chunk(calls: list[dict[str, object]], finish: str | None = None) -> bytes:
        return sse({"choices": [{"index": 0, "delta": {"tool_calls": calls}, "finish_reason": finish}]})

    frames = [
        chunk([{"id": "a", "type": "function", "function": {"name": "calculator", "arguments": '{"expression":'}}]),
        chunk([{"function": {"arguments": ' "1+1"}'}}]),  # id-less continuation of "a"
        chunk([{"id": "b", "type": "function", "function": {"name": "clock", "arguments": "{}"}}]),
        chunk([{"id": "a", "function": {"arguments": ""}}], "tool_calls"),
        b"data: [DONE]\n\n",
    ]
    fake.enqueue(Reply(frames=frames))
    _, acc = await collect(model_for(fake), request())
    assert uses(acc) == [("a", "calculator", '{"expression": "1+1"}'), ("b", "clock", "{}")]
