"""Step shaping of model replies: sanitisation (malformed tool args: the stored AIMessage input is
sanitized to {}, the raw executable view kept; refusal and redacted thinking), empty replies and the
safe prefix of a cut reply."""

from __future__ import annotations

import re

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared import events as ev
from shared import shaping
from shared.codec import decode_event, encode_event
from shared.content import (
    AIMessage,
    Block,
    ImageBlock,
    RefusalBlock,
    TextBlock,
    ThinkingBlock,
    ToolUseBlock,
    Usage,
)
from shared.strictjson import EMBEDDED_MAX_DEPTH
from shared.validate import step_group_ok, validate_event
from tests.unit.test_validate import valid_event

MINTED = re.compile(r"lw_[0-9a-f]{32}\Z")


def tu(id_: str = "t1", name: str = "calculator", raw: bytes = b'{"expression":"1+2"}') -> ToolUseBlock:
    return ToolUseBlock(id=id_, name=name, input=msgspec.Raw(raw))


def committed(stored: AIMessage, raw: list[ev.RawToolUse]) -> ev.StepDone:
    """The StepDone a model-step would commit: the stored copy and one result per tool use."""
    results = [shaping.tool_result_message(c.id, "ok", is_error=c.minted_id) for c in raw]
    return valid_event(ev.StepDone, messages=[stored, *results])  # type: ignore[return-value]


def assert_commits(stored: AIMessage, raw: list[ev.RawToolUse]) -> None:
    step = committed(stored, raw)
    assert step_group_ok(step.messages)
    validate_event(step)
    assert decode_event(encode_event(step)) == step


# --- sanitize_ai_message ------------------------------------------------------------------------


def test_valid_tool_use_is_kept_byte_for_byte() -> None:
    raw_input = b'{"expression": "1+2",  "nested": {"a": [1, 2.5, null]}}'
    msg = AIMessage(blocks=[TextBlock(text="calc"), tu("t1", raw=raw_input)], usage=Usage(input_tokens=3))
    stored, raw = shaping.sanitize_ai_message(msg)
    assert stored == msg
    assert stored is not msg and stored.blocks is not msg.blocks and stored.usage is not msg.usage
    assert raw == [ev.RawToolUse(id="t1", name="calculator", input=raw_input.decode())]
    assert_commits(stored, raw)


def test_malformed_tool_args_stored_as_empty_object_raw_view_kept() -> None:
    # Malformed tool args: the stored AIMessage input is sanitized to {}, the raw executable view kept.
    msg = AIMessage(blocks=[tu("t1", raw=b"{not valid json")])
    stored, raw = shaping.sanitize_ai_message(msg)
    assert stored.blocks is not None
    block = stored.blocks[0]
    assert isinstance(block, ToolUseBlock)
    assert bytes(block.input) == b"{}" and block.id == "t1" and block.name == "calculator"
    assert raw == [ev.RawToolUse(id="t1", name="calculator", input="{not valid json", minted_id=False)]
    assert_commits(stored, raw)


BAD_INPUTS = [
    b"",
    b"{",
    b'{"a":1}{"b":2}',
    b'{"a":1,"a":2}',
    b'{"a":1,"A":2}',
    b'{"a":{"x":1,"X":2}}',
    b'{"a":NaN}',
    b'{"a":Infinity}',
    b'{"a":"\xff"}',
    b'{"a":"\\ud800"}',
    b"[" * (EMBEDDED_MAX_DEPTH + 1) + b"]" * (EMBEDDED_MAX_DEPTH + 1),
    b"\xef\xbb\xbf{}",
    b"{'a': 1}",
]


@pytest.mark.parametrize("bad", BAD_INPUTS, ids=range(len(BAD_INPUTS)))
def test_non_strict_input_is_stored_as_empty_object(bad: bytes) -> None:
    stored, raw = shaping.sanitize_ai_message(AIMessage(blocks=[tu("t1", raw=bad)]))
    assert stored.blocks is not None
    block = stored.blocks[0]
    assert isinstance(block, ToolUseBlock) and bytes(block.input) == b"{}"
    assert raw[0].input == bad.strip(b" \t\n\r").decode("utf-8", errors="replace")
    assert not raw[0].minted_id
    assert_commits(stored, raw)


@pytest.mark.parametrize(
    "good", [b"null", b"[]", b'"text"', b"12", b"[" * EMBEDDED_MAX_DEPTH + b"]" * EMBEDDED_MAX_DEPTH]
)
def test_any_strict_json_value_is_kept(good: bytes) -> None:
    stored, raw = shaping.sanitize_ai_message(AIMessage(blocks=[tu("t1", raw=good)]))
    assert stored.blocks is not None
    assert bytes(stored.blocks[0].input) == good  # type: ignore[union-attr]
    assert_commits(stored, raw)


def test_empty_name_is_stored_with_empty_input() -> None:
    stored, raw = shaping.sanitize_ai_message(AIMessage(blocks=[tu("t1", name="")]))
    assert stored.blocks == [ToolUseBlock(id="t1", name="", input=msgspec.Raw(b"{}"))]
    assert raw == [ev.RawToolUse(id="t1", name="", input='{"expression":"1+2"}')]
    assert_commits(stored, raw)


def test_empty_id_is_minted_in_both_views() -> None:
    stored, raw = shaping.sanitize_ai_message(AIMessage(blocks=[tu("")]))
    assert stored.blocks is not None
    block = stored.blocks[0]
    assert isinstance(block, ToolUseBlock)
    assert MINTED.match(block.id) and raw[0].id == block.id and raw[0].minted_id
    assert bytes(block.input) == b"{}"  # a minted call never runs; its arguments are not kept
    assert raw[0].input == '{"expression":"1+2"}' and raw[0].name == "calculator"
    assert_commits(stored, raw)


def test_repeated_ids_are_minted_and_distinct() -> None:
    msg = AIMessage(blocks=[tu("a"), tu("b"), tu("a"), tu("a"), tu(""), tu("")])
    stored, raw = shaping.sanitize_ai_message(msg)
    ids = [c.id for c in raw]
    assert ids[:2] == ["a", "b"] and len(set(ids)) == 6
    assert [c.minted_id for c in raw] == [False, False, True, True, True, True]
    assert all(MINTED.match(i) for i in ids[2:])
    assert [b.id for b in stored.blocks or () if isinstance(b, ToolUseBlock)] == ids
    stored_inputs = [bytes(b.input) for b in stored.blocks or () if isinstance(b, ToolUseBlock)]
    assert stored_inputs == [b'{"expression":"1+2"}'] * 2 + [b"{}"] * 4
    assert_commits(stored, raw)


def test_a_model_id_shaped_like_a_minted_one_is_not_special() -> None:
    fake = "lw_" + "0" * 32
    stored, raw = shaping.sanitize_ai_message(AIMessage(blocks=[tu(fake)]))
    assert raw[0].id == fake and not raw[0].minted_id
    assert_commits(stored, raw)


def test_block_filtering_and_order() -> None:
    msg = AIMessage(
        blocks=[
            TextBlock(text=""),
            ThinkingBlock(thinking="", signature=""),
            ThinkingBlock(thinking="plan", signature=""),
            ThinkingBlock(thinking="", signature="redacted-sig"),
            RefusalBlock(text=""),
            TextBlock(text="hello"),
            ImageBlock(media_type="image/png", url="https://x/y.png"),
            tu("t1"),
            RefusalBlock(text="I can't"),
        ]
    )
    stored, raw = shaping.sanitize_ai_message(msg)
    assert stored.blocks == [
        ThinkingBlock(thinking="plan"),
        ThinkingBlock(signature="redacted-sig"),
        RefusalBlock(text=""),
        TextBlock(text="hello"),
        ImageBlock(media_type="image/png", url="https://x/y.png"),
        tu("t1"),
        RefusalBlock(text="I can't"),
    ]
    assert [c.id for c in raw] == ["t1"]
    assert_commits(stored, raw)


def test_none_and_empty_blocks_are_kept_apart() -> None:
    assert shaping.sanitize_ai_message(AIMessage()) == (AIMessage(), [])
    assert shaping.sanitize_ai_message(AIMessage(blocks=[])) == (AIMessage(blocks=[]), [])
    stored, _ = shaping.sanitize_ai_message(AIMessage(blocks=[TextBlock(text="")]))
    assert stored.blocks == []


def test_stored_copy_is_independent() -> None:
    msg = AIMessage(blocks=[TextBlock(text="a"), tu("t1")], usage=Usage(output_tokens=2))
    stored, raw = shaping.sanitize_ai_message(msg)
    assert stored.blocks is not None and msg.blocks is not None and stored.usage is not None
    assert all(s is not o for s, o in zip(stored.blocks, msg.blocks, strict=True))
    stored.blocks[0].text = "changed"  # type: ignore[union-attr]
    stored.blocks.append(TextBlock(text="more"))
    stored.usage.output_tokens = 99
    raw[0].input = "changed"
    assert msg == AIMessage(blocks=[TextBlock(text="a"), tu("t1")], usage=Usage(output_tokens=2))
    msg.blocks.clear()
    assert len(stored.blocks) == 3


def test_lone_surrogates_never_make_a_message_unencodable() -> None:
    # A provider adapter parsing JSON with the json module can hand us lone surrogates.
    msg = AIMessage(
        blocks=[
            TextBlock(text="bad \ud800 text"),
            ThinkingBlock(thinking="\udfff", signature="s\ud800"),
            RefusalBlock(text="\ud83d"),
            tu("id\ud800", name="calc\udc00"),
            ImageBlock(media_type="image/\ud800", data="\ud800"),
        ]
    )
    stored, raw = shaping.sanitize_ai_message(msg)
    assert stored.blocks is not None
    assert stored.blocks[0] == TextBlock(text="bad \ufffd text")
    assert raw[0].id == "id\ufffd" and raw[0].name == "calc\ufffd"
    assert stored.blocks[3] == ToolUseBlock(
        id="id\ufffd", name="calc\ufffd", input=msgspec.Raw(b'{"expression":"1+2"}')
    )
    assert_commits(stored, raw)


def test_input_given_as_text_or_bytes_is_tolerated() -> None:
    # Wrongly typed inputs from a careless adapter are treated like bytes, never crash.
    for value in ('{"a":1}', b'{"a":1}', bytearray(b'{"a":1}')):
        block = ToolUseBlock(id="t1", name="x")
        block.input = value  # type: ignore[assignment]
        stored, raw = shaping.sanitize_ai_message(AIMessage(blocks=[block]))
        assert raw[0].input == '{"a":1}'
        assert_commits(stored, raw)
    block = ToolUseBlock(id="t1", name="x")
    block.input = 5  # type: ignore[assignment]
    stored, raw = shaping.sanitize_ai_message(AIMessage(blocks=[block]))
    assert raw[0].input == "" and bytes(stored.blocks[0].input) == b"{}"  # type: ignore[index,union-attr]
    assert_commits(stored, raw)


_ids = st.sampled_from(["", "a", "b", "lw_x", "\ud800", "t1"])
_inputs = st.one_of(
    st.sampled_from([b"{}", b'{"a":1}', b"{bad", b"", b'{"a":1,"a":2}', b"\xff", b"null", b" [1] "]),
    st.binary(max_size=20),
)
_blocks: st.SearchStrategy[Block] = st.one_of(
    st.builds(TextBlock, text=st.text(max_size=5)),
    st.builds(RefusalBlock, text=st.text(max_size=5)),
    st.builds(ThinkingBlock, thinking=st.text(max_size=3), signature=st.sampled_from(["", "sig"])),
    st.builds(ImageBlock, media_type=st.just("image/png"), data=st.none() | st.just("AA==")),
    st.builds(lambda i, n, b: tu(i, n, b), _ids, st.sampled_from(["", "calculator", "x y"]), _inputs),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(blocks=st.none() | st.lists(_blocks, max_size=8))
def test_property_stored_copy_always_commits(blocks: list[Block] | None) -> None:
    msg = AIMessage(blocks=blocks)
    stored, raw = shaping.sanitize_ai_message(msg)
    uses = [b for b in stored.blocks or () if isinstance(b, ToolUseBlock)]
    assert [u.id for u in uses] == [c.id for c in raw]
    assert len(raw) == sum(isinstance(b, ToolUseBlock) for b in blocks or ())
    assert_commits(stored, raw)
    assert shaping.is_empty_response(stored) == shaping.is_empty_response(msg)


# --- is_empty_response ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("blocks", "empty"),
    [
        (None, True),
        ([], True),
        ([TextBlock(text="")], True),
        ([ThinkingBlock()], True),
        ([TextBlock(text=""), ThinkingBlock()], True),
        ([TextBlock(text=" ")], False),
        ([ThinkingBlock(thinking="x")], False),
        ([ThinkingBlock(signature="s")], False),
        ([RefusalBlock()], False),
        ([ImageBlock()], False),
        ([tu("")], False),
        ([tu("t1", raw=b"{bad")], False),
    ],
)
def test_is_empty_response(blocks: list[Block] | None, empty: bool) -> None:
    assert shaping.is_empty_response(AIMessage(blocks=blocks)) is empty


# --- safe_prefix ------------------------------------------------------------------------------------


def test_safe_prefix_keeps_only_safe_content() -> None:
    msg = AIMessage(
        blocks=[
            ThinkingBlock(thinking="unsealed"),
            ThinkingBlock(thinking="sealed", signature="sig"),
            TextBlock(text=""),
            TextBlock(text="partial answer"),
            tu("t1"),
            ImageBlock(media_type="image/png"),
            RefusalBlock(text="no"),
        ],
        usage=Usage(input_tokens=5),
    )
    out = shaping.safe_prefix(msg, shaping.TRUNCATED_NOTICE)
    assert out == AIMessage(
        blocks=[
            ThinkingBlock(thinking="sealed", signature="sig"),
            TextBlock(text="partial answer"),
            RefusalBlock(text="no"),
            TextBlock(text=shaping.TRUNCATED_NOTICE),
        ]
    )
    assert out.usage is None
    assert msg.blocks is not None and len(msg.blocks) == 7  # the input is untouched
    assert out.blocks is not None and out.blocks[1] is not msg.blocks[3]
    validate_event(valid_event(ev.StepDone, messages=[out]))


@pytest.mark.parametrize(
    "blocks",
    [None, [], [TextBlock(text="")], [tu("t1")], [ThinkingBlock(thinking="x")], [ImageBlock(media_type="image/png")]],
)
def test_safe_prefix_nothing_survives(blocks: list[Block] | None) -> None:
    assert shaping.safe_prefix(AIMessage(blocks=blocks), shaping.INTERRUPTED_NOTICE) is None


def test_safe_prefix_of_no_message() -> None:
    assert shaping.safe_prefix(None, shaping.TRUNCATED_NOTICE) is None
