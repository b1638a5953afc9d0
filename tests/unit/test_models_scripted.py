"""The scripted model: chunk replay by history position, every directive, script validation."""

from __future__ import annotations

import json
import time
from pathlib import Path

import anyio
import pytest

from services.model_step.models import resolve_model
from services.model_step.models.accumulator import StreamAccumulator
from services.model_step.models.base import (
    ModelChunk,
    ModelError,
    ModelRequest,
    ModelStreamError,
    ModelUnavailableError,
)
from services.model_step.models.scripted import ScriptedModel, ScriptError
from shared.content import AIMessage, Message, ToolUseBlock, text_of, tool_result, tool_uses, user_text

SCRIPTS = Path(__file__).parents[1] / "fixtures" / "scripts"


def req(*messages: Message) -> ModelRequest:
    return ModelRequest(messages=list(messages) or [user_text("hi")])


async def collect(model: ScriptedModel, request: ModelRequest) -> list[ModelChunk]:
    return [c async for c in model.stream(request)]


def folded(chunks: list[ModelChunk]) -> StreamAccumulator:
    acc = StreamAccumulator()
    for c in chunks:
        acc.add(c)
    return acc


@pytest.mark.anyio
async def test_response_k_for_a_history_with_k_assistant_messages() -> None:
    model = ScriptedModel.from_data(["zero", "one", "two"])
    assert text_of(folded(await collect(model, req(user_text("q")))).message()) == "zero"
    history: list[Message] = [user_text("q"), AIMessage(), tool_result("x", "r"), AIMessage()]
    assert text_of(folded(await collect(model, req(*history))).message()) == "two"
    # Same position, same response: a re-run after a crash replays it.
    assert await collect(model, req(*history)) == await collect(model, req(*history))


@pytest.mark.anyio
async def test_exhausted_script_and_repeat_last() -> None:
    two: list[Message] = [user_text("q"), AIMessage()]
    with pytest.raises(ModelUnavailableError, match="no response #1"):
        await collect(ScriptedModel.from_data(["only"]), req(*two))
    repeat = ScriptedModel.from_data({"responses": ["a", "last"], "repeat_last": True})
    assert text_of(folded(await collect(repeat, req(*two, AIMessage(), AIMessage()))).message()) == "last"


@pytest.mark.anyio
async def test_by_first_user_text() -> None:
    model = ScriptedModel.from_data({"responses": ["default"], "by_first_user_text": {"special": ["chosen"]}})
    assert text_of(folded(await collect(model, req(user_text("special")))).message()) == "chosen"
    assert text_of(folded(await collect(model, req(user_text("other")))).message()) == "default"


@pytest.mark.anyio
async def test_parallel_calls_with_split_arguments_file() -> None:
    model = resolve_model(f"scripted:{SCRIPTS / 'parallel_split_args.json'}")
    assert isinstance(model, ScriptedModel)
    acc = folded(await collect(model, req(user_text("q"))))
    uses = tool_uses(acc.message())
    assert [(u.id, u.name, json.loads(bytes(u.input))) for u in uses] == [
        ("call_calc_0", "calculator", {"expression": "17*23"}),  # {k} → the response position
        ("call_clock_0", "clock", {"timezone": "Asia/Tokyo"}),
    ]
    assert text_of(acc.message()) == "Two tools at once." and acc.finish_reason == "tool_use"


@pytest.mark.anyio
async def test_malformed_tool_json_is_replayed_verbatim() -> None:
    model = ScriptedModel.from_file(SCRIPTS / "malformed_tool_json.json")
    acc = folded(await collect(model, req(user_text("q"))))
    [raw] = acc.raw_tool_uses()
    assert (raw.id, raw.name, raw.input) == ("call_bad_0", "calculator", "{not valid json")
    history: list[Message] = [user_text("q"), AIMessage(blocks=[ToolUseBlock(id="call_bad_0", name="calculator")])]
    acc = folded(await collect(model, req(*history, tool_result("call_bad_0", "error: invalid", is_error=True))))
    assert "391" in text_of(acc.message())


@pytest.mark.anyio
async def test_empty_response() -> None:
    acc = folded(await collect(ScriptedModel.from_file(SCRIPTS / "empty_response.json"), req()))
    assert not acc.has_content and acc.finish_reason == "end_turn"


@pytest.mark.anyio
async def test_error_directive_fails_mid_stream_after_the_chunks_before_it() -> None:
    model = ScriptedModel.from_file(SCRIPTS / "truncated_stream.json")
    got: list[ModelChunk] = []
    with pytest.raises(ModelStreamError, match="connection reset by peer"):
        async for c in model.stream(req()):
            got.append(c)
    assert [c.kind for c in got] == ["text", "text", "tool_use", "tool_use"]


@pytest.mark.anyio
async def test_unavailable_directive_fails_before_any_chunk() -> None:
    model = ScriptedModel.from_data([[{"unavailable": "rate limited"}]])
    got: list[ModelChunk] = []
    with pytest.raises(ModelUnavailableError, match="rate limited"):
        async for c in model.stream(req()):
            got.append(c)
    assert got == []


@pytest.mark.anyio
async def test_sleep_directive_pauses_between_chunks() -> None:
    model = ScriptedModel.from_data([[{"text": "a"}, {"sleep": 0.2}, {"text": "b"}]])
    stamps: list[float] = []
    async for _ in model.stream(req()):
        stamps.append(time.monotonic())
    assert len(stamps) == 2 and stamps[1] - stamps[0] >= 0.19


@pytest.mark.anyio
async def test_hang_directive_waits_until_cancelled() -> None:
    model = ScriptedModel.from_data([[{"text": "partial"}, {"hang": True}, {"text": "never"}]])
    got: list[str] = []
    start = time.monotonic()
    with anyio.move_on_after(0.3) as scope:
        async for c in model.stream(req()):
            got.append(c.text)
    assert scope.cancelled_caught and got == ["partial"]
    assert time.monotonic() - start < 2


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"responses": [[{"kind": "video"}]]}, "unknown chunk kind"),
        ([[{"kind": "text", "text": 3}]], "not a chunk"),
        ([[{"kind": "text", "colour": "red"}]], "not a chunk"),
        ([[{"text": "a"}, {"unavailable": "late"}]], "unavailable must be the first item"),
        ([[{"sleep": -1}]], "sleep takes"),
        ([[{"hang": "yes"}]], "hang takes true"),
        ([[{"error": "x", "text": "y"}]], "must be alone"),
        ([["not an object"]], "must be an object"),
        ({"responses": [], "extra": 1}, "unknown keys"),
        ({"responses": [], "repeat_last": "yes"}, "repeat_last"),
        (42, "a script is a list"),
        ([{"kind": "text"}], "a response must be a list"),
    ],
)
def test_malformed_scripts_are_clear_errors(data: object, message: str) -> None:
    with pytest.raises(ScriptError, match=message):
        ScriptedModel.from_data(data)


def test_unreadable_and_non_json_files(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="cannot read"):
        resolve_model(f"scripted:{tmp_path / 'missing.json'}")
    bad = tmp_path / "bad.json"
    bad.write_text("[not json")
    with pytest.raises(ModelError, match="not valid JSON"):
        resolve_model(f"scripted:{bad}")
    yml = tmp_path / "script.yaml"
    yml.write_text("- - text: hi\n")
    try:
        import yaml  # type: ignore[import-untyped]  # noqa: F401
    except ImportError:
        with pytest.raises(ModelError, match="PyYAML"):
            resolve_model(f"scripted:{yml}")
    else:
        assert isinstance(resolve_model(f"scripted:{yml}"), ScriptedModel)
