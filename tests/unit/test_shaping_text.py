"""Step shaping's texts: the model-visible strings and every bound (UTF-8 safe): diagnostics, call
summaries, the preview caps, the truncation suite and a result's text."""

from __future__ import annotations

import re
import time

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared import events as ev
from shared import shaping
from shared.content import (
    Block,
    ImageBlock,
    RefusalBlock,
    TextBlock,
    ThinkingBlock,
    ToolResultMessage,
    ToolUseBlock,
)
from shared.validate import PREVIEW_MAX_BYTES, PREVIEW_MAX_LINES, SUMMARY_MAX_BYTES, validate_event
from tests.unit.test_validate import valid_event

MARKER = "… [truncated]"
WIDE = ["é", "€", "😀"]  # 2-, 3- and 4-byte code points
CONTROLS = "".join(chr(c) for c in (*range(0x20), *range(0x7F, 0xA0)))


def nbytes(s: str) -> int:
    return len(s.encode())


def tu(id_: str = "t1", name: str = "calculator", raw: bytes = b'{"expression":"1+2"}') -> ToolUseBlock:
    return ToolUseBlock(id=id_, name=name, input=msgspec.Raw(raw))


# --- model-visible strings ------------------------------------------------------------------------


def test_fixed_strings() -> None:
    assert shaping.INVALID_JSON_ARGUMENTS == "error: invalid tool arguments (not valid JSON)"
    assert shaping.EMPTY_RESULT == "error: empty result"
    assert shaping.TOOL_CALL_CANCELED == "error: tool call canceled"
    assert shaping.INVALID_TOOL_CALL_ID == "error: invalid tool call (missing or duplicate id)"
    assert shaping.TRUNCATED_NOTICE == (
        "[truncated: the stream failed before this reply completed; the content above may be incomplete]"
    )
    assert shaping.INTERRUPTED_NOTICE == (
        "[interrupted: this reply was stopped before it completed; the content above is what had arrived]"
    )
    assert shaping.TRUNCATED_MARKER == MARKER
    assert shaping.PREVIEW_CUT_BYTES == 2033
    # shaping bounds are validation's bounds (design: summary ≤ 1024 B, preview ≤ 2048 B and ≤ 20 lines)
    assert (SUMMARY_MAX_BYTES, PREVIEW_MAX_BYTES, PREVIEW_MAX_LINES) == (1024, 2048, 20)
    assert nbytes(MARKER) == PREVIEW_MAX_BYTES - shaping.PREVIEW_CUT_BYTES == 15


def test_formatted_strings() -> None:
    assert shaping.unknown_tool("calculator") == "error: unknown tool: calculator"
    assert shaping.invalid_arguments("x must be a number") == "error: invalid tool arguments: x must be a number"
    assert shaping.permission_denied("policy denies rm") == "error: permission denied: policy denies rm"
    assert shaping.permission_denied() == "error: permission denied"
    assert shaping.tool_error("division by zero") == "error: division by zero"
    assert shaping.tool_crashed("worker exited") == "error: tool crashed: worker exited"
    assert shaping.tool_unavailable("calculator") == "error: tool unavailable: calculator (no live workers)"


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(30, "30"), (30.0, "30"), (2.5, "2.5"), (0.125, "0.125"), (1.23456, "1.235"), (0.0001, "0"), (100, "100")],
)
def test_tool_timed_out(seconds: float, text: str) -> None:
    assert shaping.tool_timed_out(seconds) == f"error: tool timed out after {text}s"


def test_error_strings_are_bounded_single_lines() -> None:
    for fn in (shaping.tool_error, shaping.tool_crashed, shaping.unknown_tool, shaping.invalid_arguments):
        out = fn("line1\nline2\t" + "x" * 5000)
        assert "\n" not in out and "\t" not in out
        assert nbytes(out) <= SUMMARY_MAX_BYTES and out.endswith(MARKER)
        assert out.startswith("error: ")


# --- bounded_diagnostic / summary_for_call ----------------------------------------------------------


def test_bounded_diagnostic_short_text_unchanged() -> None:
    assert shaping.bounded_diagnostic("calculator 1+2") == "calculator 1+2"
    assert shaping.bounded_diagnostic("") == ""
    assert shaping.bounded_diagnostic("x" * SUMMARY_MAX_BYTES) == "x" * SUMMARY_MAX_BYTES


def test_bounded_diagnostic_controls_and_invalid_utf8() -> None:
    assert shaping.bounded_diagnostic("a" + CONTROLS + "b") == "a" + " " * len(CONTROLS) + "b"
    assert shaping.bounded_diagnostic(b"ok \xff\xfe end") == "ok \ufffd\ufffd end"
    assert shaping.bounded_diagnostic(b"\xe2\x82") == "\ufffd"
    assert shaping.bounded_diagnostic("lone \ud800 surrogate") == "lone \ufffd surrogate"
    assert shaping.bounded_diagnostic("tab\there\r\nnext") == "tab here  next"


def test_bounded_diagnostic_cut_ascii() -> None:
    out = shaping.bounded_diagnostic("x" * (SUMMARY_MAX_BYTES + 1))
    assert nbytes(out) == SUMMARY_MAX_BYTES and out == "x" * (SUMMARY_MAX_BYTES - 15) + MARKER


@pytest.mark.parametrize("wide", WIDE)
@pytest.mark.parametrize("pad", range(4))
def test_bounded_diagnostic_never_splits_a_code_point(wide: str, pad: int) -> None:
    text = "a" * pad + wide * 2000
    out = shaping.bounded_diagnostic(text)
    assert out.endswith(MARKER)
    kept = out[: -len(MARKER)]
    assert text.startswith(kept)
    assert SUMMARY_MAX_BYTES - 15 - len(wide.encode()) < nbytes(kept) <= SUMMARY_MAX_BYTES - 15
    out.encode()  # valid UTF-8, no surrogates


@pytest.mark.parametrize("limit", [0, 1, 5, 14, 15, 16, 17, 100])
def test_bounded_diagnostic_small_limits(limit: int) -> None:
    for text in ("x" * 200, "€" * 200):
        out = shaping.bounded_diagnostic(text, limit)
        assert nbytes(out) <= limit
        assert text.startswith(out.removesuffix(MARKER))


def test_bounded_diagnostic_huge_input_is_fast() -> None:
    start = time.monotonic()
    out = shaping.bounded_diagnostic(("ab\n€" * 2_000_000).encode())
    assert nbytes(out) <= SUMMARY_MAX_BYTES and time.monotonic() - start < 2


def test_summary_for_call() -> None:
    assert shaping.summary_for_call("calculator", '{"expression":"1+2"}') == 'calculator {"expression":"1+2"}'
    assert shaping.summary_for_call("calculator", "") == "calculator"
    assert shaping.summary_for_call("calc", '{\n  "a": 1\n}') == 'calc {   "a": 1 }'
    big = shaping.summary_for_call("calc", "x" * 10_000)
    assert nbytes(big) <= SUMMARY_MAX_BYTES and big.endswith(MARKER)
    validate_event(valid_event(ev.ToolCallStarted, summary=big))


# --- result_preview -------------------------------------------------------------------------------


def _preview_ok(out: str) -> None:
    assert nbytes(out) <= PREVIEW_MAX_BYTES and out.count("\n") + 1 <= PREVIEW_MAX_LINES
    validate_event(valid_event(ev.ToolCallCompleted, result_preview=out))


def test_preview_short_unchanged() -> None:
    for text in ("", "3", "a\nb\n", "\n".join(["l"] * PREVIEW_MAX_LINES), "x" * PREVIEW_MAX_BYTES, "tab\tcr\r"):
        assert shaping.result_preview(text) == text


def test_preview_line_cap() -> None:
    text = "\n".join(f"line {i}" for i in range(100))
    out = shaping.result_preview(text)
    assert out == "\n".join(f"line {i}" for i in range(PREVIEW_MAX_LINES)) + MARKER
    _preview_ok(out)
    # 20 lines and a trailing newline make 21 lines: cut.
    out = shaping.result_preview("l\n" * PREVIEW_MAX_LINES)
    assert out == "\n".join(["l"] * PREVIEW_MAX_LINES) + MARKER
    _preview_ok(out)
    out = shaping.result_preview("\n" * 1000)
    assert out == "\n" * (PREVIEW_MAX_LINES - 1) + MARKER
    _preview_ok(out)


def test_preview_byte_cap() -> None:
    out = shaping.result_preview("x" * 3000)
    assert out == "x" * 2033 + MARKER and nbytes(out) == PREVIEW_MAX_BYTES
    out = shaping.result_preview("x" * (PREVIEW_MAX_BYTES + 1))
    assert out == "x" * 2033 + MARKER
    # long lines and many lines: both caps hold
    out = shaping.result_preview(("y" * 500 + "\n") * 50)
    assert out.endswith(MARKER) and nbytes(out) <= PREVIEW_MAX_BYTES
    _preview_ok(out)


@pytest.mark.parametrize("wide", WIDE)
@pytest.mark.parametrize("pad", range(4))
def test_preview_never_splits_a_code_point(wide: str, pad: int) -> None:
    text = "a" * pad + wide * 3000
    out = shaping.result_preview(text)
    kept = out.removesuffix(MARKER)
    assert out.endswith(MARKER) and text.startswith(kept)
    assert 2033 - len(wide.encode()) < nbytes(kept) <= 2033
    _preview_ok(out)


def test_preview_normalises_invalid_text() -> None:
    assert shaping.result_preview(b"ok \xff") == "ok \ufffd"
    assert shaping.result_preview("x\ud800y") == "x\ufffdy"
    _preview_ok(shaping.result_preview(b"\xf0\x9f\x98" * 2000))


def test_preview_huge_input_is_fast() -> None:
    start = time.monotonic()
    _preview_ok(shaping.result_preview("z" * 20_000_000 + "\n" * 20))
    _preview_ok(shaping.result_preview("row\n" * 2_000_000))
    assert time.monotonic() - start < 3


# --- truncate_result ------------------------------------------------------------------------------

_OMITTED = re.compile(r"\n\[tool output truncated: omitted (\d+) of (\d+) bytes\]\n")


def _split(out: str) -> tuple[str, int, int, str]:
    m = _OMITTED.search(out)
    assert m is not None, out
    return out[: m.start()], int(m.group(1)), int(m.group(2)), out[m.end() :]


def test_truncate_unbounded_and_fitting() -> None:
    text = "x" * 100_000
    assert shaping.truncate_result(text, 0) == text
    assert shaping.truncate_result(text, 100_000) == text
    assert shaping.truncate_result("", 256) == ""
    with pytest.raises(ValueError):
        shaping.truncate_result("x", -1)


def test_truncate_keeps_head_and_tail() -> None:
    text = "".join(f"{i:05d}\n" for i in range(2000))  # 12000 bytes
    out = shaping.truncate_result(text, 1000)
    head, omitted, total, tail = _split(out)
    assert nbytes(out) == 1000  # the budget is used exactly for ASCII
    assert total == 12_000 and omitted == total - nbytes(head) - nbytes(tail)
    assert text.startswith(head) and text.endswith(tail)
    assert abs(nbytes(head) - nbytes(tail)) <= 1


@pytest.mark.parametrize("wide", WIDE)
@pytest.mark.parametrize("pad", range(4))
def test_truncate_never_splits_a_code_point(wide: str, pad: int) -> None:
    text = "a" * pad + wide * 500 + "b" * pad
    for max_bytes in range(256, 300):
        out = shaping.truncate_result(text, max_bytes)
        head, omitted, total, tail = _split(out)
        assert nbytes(out) <= max_bytes
        assert total == nbytes(text) and omitted == total - nbytes(head) - nbytes(tail)
        assert text.startswith(head) and text.endswith(tail)
        assert nbytes(out) > max_bytes - 2 * len(wide.encode())  # no budget wasted beyond alignment


def test_truncate_tiny_budget_keeps_only_the_head() -> None:
    out = shaping.truncate_result("€" * 100, 20)
    assert out == "€" * 6


def test_truncate_normalises_invalid_text() -> None:
    assert shaping.truncate_result("a\ud800b", 0) == "a\ufffdb"
    out = shaping.truncate_result("\ud800" * 1000, 256)
    assert nbytes(out) <= 256 and "\ud800" not in out


def test_truncate_huge_input_is_fast() -> None:
    start = time.monotonic()
    out = shaping.truncate_result("€" * 5_000_000, 1024 * 1024)
    assert nbytes(out) <= 1024 * 1024 and _split(out)[2] == 15_000_000
    assert time.monotonic() - start < 3


# --- flatten_to_text / tool_result_message ------------------------------------------------------------


def test_flatten_to_text() -> None:
    blocks: list[Block] = [
        TextBlock(text="a"),
        RefusalBlock(text="b"),
        ImageBlock(media_type="image/png"),
        ThinkingBlock(thinking="t"),
        tu("t1"),
        TextBlock(text="c"),
    ]
    assert shaping.flatten_to_text(blocks) == (
        "a\nb\n[image 1: image/png, 0 bytes]\n[unsupported thinking]\n[unsupported tool_use]\nc"
    )
    assert shaping.flatten_to_text(None) == ""
    assert shaping.flatten_to_text([]) == ""


def test_tool_result_message() -> None:
    m = shaping.tool_result_message("t1", "3", is_error=False)
    assert m == ToolResultMessage(tool_use_id="t1", blocks=[TextBlock(text="3")], is_error=False)
    m = shaping.tool_result_message("t1", shaping.EMPTY_RESULT, is_error=True)
    assert m.is_error and m.blocks == [TextBlock(text="error: empty result")]
    m = shaping.tool_result_message("t1", "x" * 5000, is_error=False, max_bytes=256)
    assert m.blocks is not None and len(m.blocks) == 1
    assert nbytes(m.blocks[0].text) <= 256 and "[tool output truncated: omitted" in m.blocks[0].text  # type: ignore[union-attr]
    m = shaping.tool_result_message("t1", "bad \ud800", is_error=False)
    assert m.blocks == [TextBlock(text="bad \ufffd")]


# --- properties: the bounds always hold -------------------------------------------------------------

_text = st.text(alphabet=st.characters(codec=None, exclude_categories=()), max_size=3000)
_any_text = st.one_of(_text, st.binary(max_size=3000), st.text(alphabet="\n€😀x\r\t", max_size=3000))


@settings(max_examples=200, deadline=None)
@given(text=_any_text, limit=st.integers(0, 1200))
def test_property_bounded_diagnostic(text: str | bytes, limit: int) -> None:
    out = shaping.bounded_diagnostic(text, limit)
    assert nbytes(out) <= limit
    assert not any(c in CONTROLS for c in out)
    clean = shaping.bounded_diagnostic(text, 10**9)
    assert clean.startswith(out.removesuffix(MARKER))


def _norm(text: str | bytes) -> str:
    return (
        text.decode("utf-8", errors="replace") if isinstance(text, bytes) else re.sub("[\ud800-\udfff]", "\ufffd", text)
    )


@settings(max_examples=200, deadline=None)
@given(text=_any_text)
def test_property_result_preview(text: str | bytes) -> None:
    out = shaping.result_preview(text)
    _preview_ok(out)
    norm = _norm(text)
    if out != norm:  # cut: a code-point aligned prefix of at most 2033 bytes, then the marker
        kept = out.removesuffix(MARKER)
        assert out.endswith(MARKER) and norm.startswith(kept) and nbytes(kept) <= 2033


@settings(max_examples=200, deadline=None)
@given(text=st.one_of(_text, st.text(alphabet="€😀x", max_size=3000)), max_bytes=st.integers(0, 2000))
def test_property_truncate_result(text: str, max_bytes: int) -> None:
    out = shaping.truncate_result(text, max_bytes)
    out.encode()  # always valid UTF-8
    norm = _norm(text)
    if max_bytes == 0 or nbytes(norm) <= max_bytes:
        assert out == norm
        return
    assert nbytes(out) <= max_bytes
    if _OMITTED.search(out) is None:  # a budget too small for the marker keeps the head only
        assert norm.startswith(out)
        return
    head, omitted, total, tail = _split(out)
    assert total == nbytes(norm) and omitted + nbytes(head) + nbytes(tail) == total
    assert norm.startswith(head) and norm.endswith(tail)


PNG_4K = ImageBlock(media_type="image/png", data="A" * 5464)  # 5,464 base64 chars: 4,098 bytes


def test_result_content_separates_items_and_notes_each_image_where_it_stood() -> None:
    blocks: list[Block] = [
        TextBlock(text="Here's the image:"),
        PNG_4K,
        TextBlock(text="The image above is 4 KB."),
        ImageBlock(media_type="image/jpeg", url="https://example.com/a.jpg"),
    ]
    text, images = shaping.result_content(blocks)
    assert text == (
        "Here's the image:\n[image 1: image/png, 4.0 KB]\nThe image above is 4 KB.\n"
        "[image 2: image/jpeg, https://example.com/a.jpg]"
    )
    assert images == [blocks[1], blocks[3]]
    text, images = shaping.result_content(blocks, omit_images_why="too big")
    assert images == [] and "[image 1: image/png, 4.0 KB, omitted: too big]" in text
    kept_text, kept = shaping.omit_images(*shaping.result_content(blocks), "no room", lambda im: im.data is not None)
    assert kept == [blocks[3]]
    assert "[image 1: image/png, 4.0 KB, omitted: no room]" in kept_text
    assert "[image 2: image/jpeg, https://example.com/a.jpg]" in kept_text
    message = shaping.tool_result_message("t1", text, is_error=False, images=[PNG_4K])
    assert message.blocks == [TextBlock(text=text), PNG_4K]


def test_a_result_cut_twice_states_the_original_size() -> None:
    original = "".join(f"line {i:07d}\n" for i in range(5_242_880 // 13))  # 13 bytes a line
    total = len(original.encode())
    first = shaping.truncate_result(original, 522_240)  # a worker's cut to a NATS message
    second = shaping.truncate_result(first, 16_384)  # then the caller's, to the record
    assert len(second.encode()) <= 16_384
    markers = re.findall(r"\[tool output truncated: omitted (\d+) of (\d+) bytes\]", second)
    assert len(markers) == 1, "one notice, not two stacked"
    omitted, of = map(int, markers[0])
    assert of == total
    kept = len(second.encode()) - len(f"\n[tool output truncated: omitted {omitted} of {of} bytes]\n".encode())
    assert omitted == total - kept
    head, tail = second.split(f"\n[tool output truncated: omitted {omitted} of {of} bytes]\n")
    assert original.startswith(head) and original.endswith(tail)
    # A result that only quotes such a line is cut as any text (its figures do not add up).
    quoted = "x" * 1000 + "\n[tool output truncated: omitted 5 of 10 bytes]\n" + "y" * 1000
    cut = shaping.truncate_result(quoted, 400)
    assert f"of {len(quoted)} bytes]" in cut
