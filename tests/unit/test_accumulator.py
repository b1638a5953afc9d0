"""StreamAccumulator: the folding rules for streamed chunks."""

from __future__ import annotations

import msgspec
import pytest

from services.model_step.models.accumulator import StreamAccumulator
from services.model_step.models.base import ModelChunk, ModelError
from shared.content import RefusalBlock, TextBlock, ThinkingBlock, ToolUseBlock, Usage


def fold(*chunks: ModelChunk) -> StreamAccumulator:
    acc = StreamAccumulator()
    for c in chunks:
        acc.add(c)
    return acc


def tool(index: int, text: str = "", id: str = "", name: str = "") -> ModelChunk:
    return ModelChunk(kind="tool_use", index=index, text=text, id=id, name=name)


def shape(acc: StreamAccumulator) -> list[tuple[str, ...]]:
    out: list[tuple[str, ...]] = []
    for b in acc.message().blocks or []:
        if isinstance(b, TextBlock):
            out.append(("text", b.text))
        elif isinstance(b, RefusalBlock):
            out.append(("refusal", b.text))
        elif isinstance(b, ThinkingBlock):
            out.append(("thinking", b.thinking, b.signature))
        elif isinstance(b, ToolUseBlock):
            out.append(("tool_use", b.id, b.name, bytes(b.input).decode()))
    return out


def test_text_chunks_concatenate_into_one_block_whatever_their_index() -> None:
    acc = fold(ModelChunk(text="Hel"), ModelChunk(text="lo", index=3), ModelChunk(text=", world"))
    assert shape(acc) == [("text", "Hello, world")]


def test_interleaved_tool_fragments_fold_by_index_verbatim() -> None:
    acc = fold(
        tool(0, id="a", name="calculator"),
        tool(1, id="b", name="clock"),
        tool(0, '{"expr'),
        tool(1, '{"timezone":'),
        tool(0, 'ession": "1+1"}'),
        tool(1, ' "UTC"}'),
    )
    assert shape(acc) == [
        ("tool_use", "a", "calculator", '{"expression": "1+1"}'),
        ("tool_use", "b", "clock", '{"timezone": "UTC"}'),
    ]


def test_blocks_in_order_of_first_arrival_and_late_lower_index_goes_before_higher() -> None:
    acc = fold(
        tool(5, "{}", id="t5", name="x"),
        ModelChunk(text="between"),
        tool(2, "{}", id="t2", name="y"),  # arrives later, lower index: before t5
        tool(9, "{}", id="t9", name="z"),  # higher: after t5
        tool(7, "{}", id="t7", name="w"),  # between t5 and t9
    )
    assert [s[:2] for s in shape(acc)] == [
        ("tool_use", "t2"),
        ("tool_use", "t5"),
        ("text", "between"),
        ("tool_use", "t7"),
        ("tool_use", "t9"),
    ]


def test_negative_and_huge_indices_are_safe_and_ordered() -> None:
    huge = 2**62
    acc = fold(
        tool(huge, "{}", id="h", name="a"), tool(-(2**40), "{}", id="n", name="b"), tool(0, "{}", id="z", name="c")
    )
    assert [s[1] for s in shape(acc)] == ["n", "z", "h"]


def test_last_non_empty_id_and_name_win() -> None:
    acc = fold(tool(0, id="first", name="one"), tool(0, "{", id="", name=""), tool(0, "}", id="second"))
    assert shape(acc) == [("tool_use", "second", "one", "{}")]


def test_malformed_and_empty_arguments_are_kept_raw() -> None:
    acc = fold(tool(0, "{not valid", id="a", name="calc"), tool(1, id="b", name="clock"))
    msg = acc.message()
    blocks = msg.blocks or []
    assert isinstance(blocks[0], ToolUseBlock) and bytes(blocks[0].input) == b"{not valid"
    assert isinstance(blocks[1], ToolUseBlock) and bytes(blocks[1].input) == b""
    raw = acc.raw_tool_uses()
    assert [(r.id, r.name, r.input) for r in raw] == [("a", "calc", "{not valid"), ("b", "clock", "")]


def test_thinking_blocks_per_index_with_signatures() -> None:
    acc = fold(
        ModelChunk(kind="thinking", index=0, text="first "),
        ModelChunk(kind="thinking", index=1, text="second"),
        ModelChunk(kind="thinking", index=0, text="thought"),
        ModelChunk(kind="signature", index=0, text="sig-old"),
        ModelChunk(kind="signature", index=0, text="sig-0"),
        ModelChunk(kind="signature", index=3, text="sig-3"),  # a signature alone opens its block
        ModelChunk(text="answer"),
    )
    assert shape(acc) == [
        ("thinking", "first thought", "sig-0"),
        ("thinking", "second", ""),
        ("thinking", "", "sig-3"),
        ("text", "answer"),
    ]


def test_refusal_is_a_single_block_apart_from_text() -> None:
    acc = fold(
        ModelChunk(kind="refusal", text="I can't "), ModelChunk(text="x"), ModelChunk(kind="refusal", text="help")
    )
    assert shape(acc) == [("refusal", "I can't help"), ("text", "x")]


def test_usage_and_finish_reason() -> None:
    acc = fold(ModelChunk(text="hi"))
    assert acc.message().usage is None and acc.finish_reason == ""
    acc.add(ModelChunk(kind="usage", usage=Usage(input_tokens=1)))
    acc.add(ModelChunk(kind="usage", usage=Usage(input_tokens=10, output_tokens=3)))
    acc.add(ModelChunk(kind="finish", finish_reason="end_turn"))
    assert acc.usage == Usage(input_tokens=10, output_tokens=3)
    assert acc.message().usage == Usage(input_tokens=10, output_tokens=3)
    assert acc.finish_reason == "end_turn"
    assert shape(acc) == [("text", "hi")]  # usage and finish add no block


def test_message_is_a_fresh_independent_object() -> None:
    acc = fold(ModelChunk(text="a"), ModelChunk(kind="usage", usage=Usage(output_tokens=1)), tool(0, "{}", "i", "n"))
    m1, m2 = acc.message(), acc.message()
    assert m1 == m2 and m1 is not m2
    assert m1.usage is not acc.usage and m1.usage is not m2.usage
    assert msgspec.json.encode(m1) == msgspec.json.encode(m2)


@pytest.mark.parametrize(
    ("chunks", "expected"),
    [
        ([], False),
        ([ModelChunk(text="")], False),
        ([ModelChunk(kind="usage", usage=Usage(input_tokens=3)), ModelChunk(kind="finish", finish_reason="x")], False),
        ([ModelChunk(kind="thinking", index=0, text="")], False),
        ([ModelChunk(text=" ")], True),
        ([ModelChunk(kind="refusal", text="")], True),
        ([ModelChunk(kind="thinking", text="hmm")], True),
        ([ModelChunk(kind="signature", text="sig")], True),
        ([tool(0)], True),
    ],
)
def test_has_content(chunks: list[ModelChunk], expected: bool) -> None:
    assert fold(*chunks).has_content is expected


def test_unknown_chunk_kind_is_a_typed_error() -> None:
    with pytest.raises(ModelError, match="unknown model chunk kind"):
        fold(ModelChunk(kind="audio"))
