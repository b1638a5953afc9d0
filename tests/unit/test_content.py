"""The content model: tagged unions, None vs [], usage arithmetic and ownership (clone independence).

Ownership: mutating a decoded StepDone (or a clone) never changes another copy.
"""

from __future__ import annotations

import json

import msgspec
import pytest

from shared import events as ev
from shared.codec import decode_event, encode_event
from shared.content import (
    UINT64_MAX,
    AIMessage,
    Block,
    ImageBlock,
    Message,
    RefusalBlock,
    Role,
    SystemMessage,
    TextBlock,
    ThinkingBlock,
    ToolResultMessage,
    ToolUseBlock,
    Usage,
    UserMessage,
    ai_text,
    clone,
    clone_blocks,
    clone_messages,
    role_of,
    text_of,
    tool_result,
    tool_uses,
    user_text,
)
from shared.errors import LoopwireError, UsageOverflowError
from tests.unit.test_validate import valid_event

BLOCKS: list[tuple[Block, dict[str, object]]] = [
    (TextBlock(text="hi"), {"type": "text", "text": "hi"}),
    (RefusalBlock(text="no"), {"type": "refusal", "text": "no"}),
    (ThinkingBlock(thinking="hmm", signature="sig"), {"type": "thinking", "thinking": "hmm", "signature": "sig"}),
    (
        ToolUseBlock(id="t1", name="calc", input=msgspec.Raw(b'{"a":[1,2]}')),
        {"type": "tool_use", "id": "t1", "name": "calc", "input": {"a": [1, 2]}},
    ),
    (ImageBlock(media_type="image/png", data="AAAA"), {"type": "image", "media_type": "image/png", "data": "AAAA"}),
]
MESSAGES: list[tuple[Message, str]] = [
    (UserMessage(blocks=[TextBlock(text="q")]), "user"),
    (SystemMessage(blocks=[TextBlock(text="s")]), "system"),
    (AIMessage(blocks=[TextBlock(text="a")], usage=Usage(input_tokens=1)), "assistant"),
    (ToolResultMessage(tool_use_id="t1", blocks=[TextBlock(text="r")], is_error=True), "tool"),
]


@pytest.mark.parametrize(("block", "wire"), BLOCKS, ids=[type(b).__name__ for b, _ in BLOCKS])
def test_blocks_are_tagged_by_type(block: Block, wire: dict[str, object]) -> None:
    data = msgspec.json.encode(block)
    assert json.loads(data) == wire
    assert msgspec.json.decode(data, type=Block) == block


def test_tool_use_input_is_embedded_json_not_a_string() -> None:
    data = msgspec.json.encode(ToolUseBlock(id="t", name="n", input=msgspec.Raw(b'{"x": 1}')))
    assert data == b'{"type":"tool_use","id":"t","name":"n","input":{"x": 1}}'


def test_tool_use_input_whitespace_is_not_part_of_the_value() -> None:
    # Decoding yields the value without surrounding whitespace; construction trims it too, so a
    # block always equals its own round trip.
    block = ToolUseBlock(id="t", name="n", input=msgspec.Raw(b' \n{"x": 1}\t '))
    assert bytes(block.input) == b'{"x": 1}'
    assert msgspec.json.decode(msgspec.json.encode(block), type=Block) == block == clone(block)


@pytest.mark.parametrize(("message", "role"), MESSAGES, ids=[m[1] for m in MESSAGES])
def test_messages_are_tagged_by_role(message: Message, role: str) -> None:
    data = msgspec.json.encode(message)
    assert json.loads(data)["role"] == role
    back = msgspec.json.decode(data, type=Message)
    assert back == message and type(back) is type(message)
    assert role_of(message) is Role(role)


def test_wire_field_names_are_snake_case() -> None:
    doc = json.loads(msgspec.json.encode(MESSAGES[3][0]))
    assert doc == {"role": "tool", "tool_use_id": "t1", "blocks": [{"type": "text", "text": "r"}], "is_error": True}
    usage = Usage(input_tokens=1, output_tokens=2, cache_read_tokens=3, cache_creation_tokens=4, reasoning_tokens=5)
    assert set(json.loads(msgspec.json.encode(usage))) == {
        "input_tokens",
        "output_tokens",
        "cache_read_tokens",
        "cache_creation_tokens",
        "reasoning_tokens",
    }


def test_unknown_tags_are_refused() -> None:
    with pytest.raises(msgspec.ValidationError):
        msgspec.json.decode(b'{"type":"audio"}', type=Block)
    with pytest.raises(msgspec.ValidationError):
        msgspec.json.decode(b'{"role":"alien"}', type=Message)
    with pytest.raises(msgspec.ValidationError):
        msgspec.json.decode(b'{"type":"text","text":"x","extra":1}', type=Block)


def test_role_of_unknown_object() -> None:
    assert role_of(object()) is None and role_of({"role": "user"}) is None


def test_helpers() -> None:
    ai = AIMessage(
        blocks=[
            TextBlock(text="a"),
            ThinkingBlock(thinking="hidden"),
            ToolUseBlock(id="t1"),
            RefusalBlock(text="b"),
            ToolUseBlock(id="t2"),
        ]
    )
    assert text_of(ai) == "ab" and text_of(AIMessage()) == ""
    assert [b.id for b in tool_uses(ai)] == ["t1", "t2"] and tool_uses(AIMessage()) == []
    assert user_text("x") == UserMessage(blocks=[TextBlock(text="x")])
    assert ai_text("y", Usage(output_tokens=1)) == AIMessage(blocks=[TextBlock(text="y")], usage=Usage(output_tokens=1))
    assert tool_result("t", "z", is_error=True) == ToolResultMessage(
        tool_use_id="t", blocks=[TextBlock(text="z")], is_error=True
    )


# --- None vs [] -------------------------------------------------------------------------------------


@pytest.mark.parametrize("blocks", [None, []], ids=["none", "empty"])
def test_none_and_empty_survive_encode_decode_and_clone(blocks: list[Block] | None) -> None:
    for message in (UserMessage(blocks=blocks), AIMessage(blocks=blocks), ToolResultMessage(blocks=blocks)):
        data = msgspec.json.encode(message)
        assert ('"blocks"' in data.decode()) is (blocks is not None)
        back = msgspec.json.decode(data, type=Message)
        assert back.blocks == blocks and (back.blocks is None) is (blocks is None)
        assert clone(message).blocks == blocks and (clone(message).blocks is None) is (blocks is None)
    assert clone_blocks(blocks) == blocks and (clone_blocks(blocks) is None) is (blocks is None)
    assert (clone_messages(None) is None) and clone_messages([]) == []


def test_none_and_empty_survive_the_durable_envelope() -> None:
    for blocks in (None, []):
        step = valid_event(ev.StepDone, messages=[AIMessage(blocks=blocks)])
        back = decode_event(encode_event(step))
        assert isinstance(back, ev.StepDone)
        assert back.messages[0].blocks == blocks and (back.messages[0].blocks is None) is (blocks is None)
    for tools in (None, []):
        started = valid_event(ev.LoopStarted, tools=tools)
        back_started = decode_event(encode_event(started))
        assert isinstance(back_started, ev.LoopStarted) and back_started.tools == tools
        assert (back_started.tools is None) is (tools is None)
    for message in (None, ai_text("x")):
        done = decode_event(encode_event(valid_event(ev.TurnDone, message=message, usage=None)))
        assert isinstance(done, ev.TurnDone) and done.message == message and done.usage is None
    zero = decode_event(encode_event(valid_event(ev.TurnDone, usage=Usage())))
    assert isinstance(zero, ev.TurnDone) and zero.usage == Usage()  # a zero usage is not an absent one


# --- Usage ------------------------------------------------------------------------------------------


def test_usage_add() -> None:
    a = Usage(input_tokens=1, output_tokens=2, cache_read_tokens=3, cache_creation_tokens=4, reasoning_tokens=5)
    b = Usage(input_tokens=10, output_tokens=20, cache_read_tokens=30, cache_creation_tokens=40, reasoning_tokens=50)
    total = a.add(b)
    assert total == Usage(
        input_tokens=11, output_tokens=22, cache_read_tokens=33, cache_creation_tokens=44, reasoning_tokens=55
    )
    assert a == Usage(input_tokens=1, output_tokens=2, cache_read_tokens=3, cache_creation_tokens=4, reasoning_tokens=5)
    assert total is not a and total is not b
    assert total.context_tokens == 11 + 33 + 44
    assert Usage(output_tokens=UINT64_MAX).add(Usage()) == Usage(output_tokens=UINT64_MAX)


@pytest.mark.parametrize("field", list(Usage.__struct_fields__))
def test_usage_overflow(field: str) -> None:
    big = Usage(**{field: UINT64_MAX})
    with pytest.raises(UsageOverflowError) as info:
        big.add(Usage(**{field: 1}))
    assert info.value.field == field and isinstance(info.value, LoopwireError)
    with pytest.raises(UsageOverflowError):
        Usage(**{field: -5}).add(Usage(**{field: 1}))


# --- ownership: clones and decoded copies are independent ---------------------------------------------


def _step() -> ev.StepDone:
    ai = AIMessage(
        blocks=[TextBlock(text="calling"), ToolUseBlock(id="t1", name="calc", input=msgspec.Raw(b'{"e":"1+2"}'))],
        usage=Usage(input_tokens=7),
    )
    step = valid_event(ev.StepDone, messages=[ai, tool_result("t1", "3")])
    assert isinstance(step, ev.StepDone)
    return step


def _mutate(step: ev.StepDone) -> None:
    ai = step.messages[0]
    assert isinstance(ai, AIMessage) and ai.blocks is not None and ai.usage is not None
    text = ai.blocks[0]
    assert isinstance(text, TextBlock)
    text.text = "mutated"
    use = ai.blocks[1]
    assert isinstance(use, ToolUseBlock)
    use.input = msgspec.Raw(b'{"e":"rm -rf"}')
    use.id = "evil"
    ai.usage.input_tokens = 999
    ai.blocks.append(TextBlock(text="appended"))
    result = step.messages[1]
    assert isinstance(result, ToolResultMessage) and result.blocks is not None
    result.blocks[0] = TextBlock(text="changed")
    result.is_error = True
    step.messages.append(user_text("smuggled"))


def test_mutating_a_decoded_step_never_changes_another_copy() -> None:
    original = _step()
    data = encode_event(original)
    first, second = decode_event(data), decode_event(data)
    assert isinstance(first, ev.StepDone) and isinstance(second, ev.StepDone)
    _mutate(first)
    assert second == original == _step()
    assert decode_event(data) == _step()
    assert encode_event(original) == data


def test_mutating_the_original_after_encoding_changes_nothing_encoded() -> None:
    original = _step()
    data = encode_event(original)
    decoded = decode_event(data)
    _mutate(original)
    assert decoded == _step() and decode_event(data) == _step()


def test_clone_is_deep() -> None:
    original = _step()
    copy = clone(original)
    assert copy == original and copy is not original
    _mutate(copy)
    assert original == _step()
    copy2 = clone(original)
    _mutate(original)
    assert copy2 == _step()


def test_clone_messages_and_blocks_are_deep() -> None:
    messages = _step().messages
    copies = clone_messages(messages)
    assert copies == messages and copies is not messages
    assert copies is not None and all(c is not m for c, m in zip(copies, messages, strict=True))
    ai = messages[0]
    assert isinstance(ai, AIMessage) and ai.blocks is not None
    blocks = clone_blocks(ai.blocks)
    assert blocks == ai.blocks and blocks is not None
    blocks[0].text = "x"  # type: ignore[union-attr]
    assert ai.blocks[0] == TextBlock(text="calling")
    ai.blocks.clear()
    assert copies[0] == _step().messages[0]
