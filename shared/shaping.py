"""Step shaping: everything the model-step does to turn a model reply and tool outcomes into a
committable step group, plus every model-visible tool-result error string (this is the one place).

* :func:`sanitize_step` splits a model reply into the stored copy (always valid in a StepDone)
  and its tool calls (the bytes the model sent, with the one strict-JSON verdict on them).
* :func:`bounded_diagnostic`, :func:`result_preview` and :func:`truncate_result` bound text for
  summaries, live previews and stored results. All of them are UTF-8 safe: invalid UTF-8 and lone
  surrogates become U+FFFD and no cut ever splits a code point.
"""

from __future__ import annotations

import math
import re
import uuid
from collections.abc import Callable, Sequence
from typing import Final

import msgspec

from shared.content import (
    AIMessage,
    Block,
    ImageBlock,
    RefusalBlock,
    TextBlock,
    ThinkingBlock,
    ToolResultMessage,
    ToolUseBlock,
    Usage,
)
from shared.events import RawToolUse
from shared.toolcall import ToolCall, strict_error
from shared.validate import PREVIEW_MAX_BYTES, PREVIEW_MAX_LINES, SUMMARY_MAX_BYTES

__all__ = [
    "EMPTY_RESULT",
    "INTERRUPTED_NOTICE",
    "INVALID_JSON_ARGUMENTS",
    "INVALID_TOOL_CALL_ID",
    "PREVIEW_CUT_BYTES",
    "TOOL_CALL_CANCELED",
    "TRUNCATED_MARKER",
    "TRUNCATED_NOTICE",
    "bounded_diagnostic",
    "flatten_to_text",
    "fork_no_source_result",
    "format_seconds",
    "image_note",
    "image_size",
    "invalid_arguments",
    "is_empty_response",
    "mint_tool_use_id",
    "omit_images",
    "permission_denied",
    "result_content",
    "result_preview",
    "safe_prefix",
    "sanitize_ai_message",
    "sanitize_step",
    "summary_for_call",
    "tool_crashed",
    "tool_error",
    "tool_result_message",
    "tool_timed_out",
    "tool_unavailable",
    "truncate_result",
    "unknown_tool",
]

# --- model-visible strings ------------------------------------------------------------------------

INVALID_JSON_ARGUMENTS: Final = "error: invalid tool arguments (not valid JSON)"
EMPTY_RESULT: Final = "error: empty result"
TOOL_CALL_CANCELED: Final = "error: tool call canceled"
INVALID_TOOL_CALL_ID: Final = "error: invalid tool call (missing or duplicate id)"
TRUNCATED_NOTICE: Final = (
    "[truncated: the stream failed before this reply completed; the content above may be incomplete]"
)
INTERRUPTED_NOTICE: Final = (
    "[interrupted: this reply was stopped before it completed; the content above is what had arrived]"
)

TRUNCATED_MARKER: Final = "… [truncated]"
_MARKER_BYTES: Final = len(TRUNCATED_MARKER.encode())  # 15
PREVIEW_CUT_BYTES: Final = PREVIEW_MAX_BYTES - _MARKER_BYTES  # 2033: the kept prefix of a cut preview


def unknown_tool(name: str) -> str:
    return bounded_diagnostic(f"error: unknown tool: {name}")


def invalid_arguments(message: str) -> str:
    return bounded_diagnostic(f"error: invalid tool arguments: {message}")


def permission_denied(reason: str = "") -> str:
    """``error: permission denied: <reason>`` (or without a reason)."""
    return bounded_diagnostic(f"error: permission denied: {reason}" if reason else "error: permission denied")


def format_seconds(seconds: float) -> str:
    """``30`` for whole seconds, else up to 3 decimals (``2.5``, ``0.125``)."""
    if not math.isfinite(seconds):
        return str(seconds)
    text = f"{seconds:.3f}".rstrip("0").rstrip(".")
    return "0" if text in ("", "-0") else text


def tool_timed_out(seconds: float) -> str:
    return f"error: tool timed out after {format_seconds(seconds)}s"


def tool_error(message: str) -> str:
    """A tool's own error, as the model sees it."""
    return bounded_diagnostic(f"error: {message}")


def tool_crashed(message: str) -> str:
    return bounded_diagnostic(f"error: tool crashed: {message}")


def tool_refused(message: str) -> str:
    return bounded_diagnostic(f"error: tool call refused: {message}")


def agent_cycle(name: str, chain: Sequence[str]) -> str:
    """An agent call refused because that agent already runs in the calling chain (``chain``:
    the agents the calling loop runs under, outermost first)."""
    return tool_refused(
        f"sub-agent cycle: {name} already runs in this loop's calling chain ({' → '.join([*chain, name])})"
    )


def agent_too_deep(name: str, chain: Sequence[str], max_depth: int) -> str:
    """An agent call refused because its child loop would nest deeper than ``max_depth``."""
    return tool_refused(
        f"sub-agent depth: {name} would run {len(chain) + 1} levels deep ({' → '.join([*chain, name])}); "
        f"at most {max_depth} nested sub-agents (LW_AGENT_MAX_DEPTH)"
    )


def outcome_unknown(name: str) -> str:
    return bounded_diagnostic(
        f"error: outcome unknown: {name} stopped while running and is not idempotent; not retried"
    )


def fork_no_source_result(name: str) -> str:
    return bounded_diagnostic(
        f"error: not run: {name} was left to the source loop of this fork, which had no result of it for the fork"
    )


RETRYING: Final = "; retrying in "


def retry_notice(attempt: int, attempts: int, status: str, message: str, backoff: float) -> str:
    """The ToolCallProgress text of an attempt that got no answer and is sent again."""
    return bounded_diagnostic(
        f"attempt {attempt}/{attempts} failed ({status}: {message}){RETRYING}{format_seconds(backoff)}s"
    )


def tool_unavailable(name: str, reason: str = "no live workers") -> str:
    return bounded_diagnostic(f"error: tool unavailable: {name} ({reason})")


# --- UTF-8 safe text helpers ----------------------------------------------------------------------

_SURROGATE_RE: Final = re.compile("[\ud800-\udfff]")
# Unicode category Cc: C0 controls (incl. \t, \n, \r), DEL and the C1 controls.
_CONTROLS_TO_SPACE: Final = {c: " " for c in (*range(0x20), *range(0x7F, 0xA0))}


def _clean(text: str | bytes | bytearray | memoryview) -> str:
    """Valid Unicode text: invalid UTF-8 and lone surrogates become U+FFFD."""
    if isinstance(text, str):
        # (an ASCII string, the usual one, holds no surrogate: isascii() is a flag, not a scan)
        return text if text.isascii() else _SURROGATE_RE.sub("\ufffd", text)
    return bytes(text).decode("utf-8", errors="replace")


def _clean_head(text: str | bytes, chars: int) -> str:
    """``_clean(text)[:chars]`` without touching the rest of a huge input.

    Every code point takes at least one byte, so a result bounded to ``chars - 1`` bytes never needs
    more; ``4 * (chars + 1)`` bytes always decode to at least ``chars`` whole code points first.
    """
    if isinstance(text, str):
        return _clean(text[:chars])
    return _clean(text[: 4 * (chars + 1)])[:chars]


def _cut_head(data: bytes, limit: int) -> bytes:
    """The longest prefix of valid UTF-8 ``data`` within ``limit`` bytes that ends on a code point."""
    if limit >= len(data):
        return data
    n = max(limit, 0)
    while n > 0 and (data[n] & 0xC0) == 0x80:  # never keep half of a code point
        n -= 1
    return data[:n]


def _cut_tail(data: bytes, limit: int) -> bytes:
    """The longest suffix of valid UTF-8 ``data`` within ``limit`` bytes that starts on a code point."""
    if limit >= len(data):
        return data
    start = len(data) - max(limit, 0)
    while start < len(data) and (data[start] & 0xC0) == 0x80:
        start += 1
    return data[start:]


def bounded_diagnostic(text: str | bytes, limit: int = SUMMARY_MAX_BYTES) -> str:
    """One line of at most ``limit`` UTF-8 bytes (marker included) with no control characters.

    Invalid UTF-8 becomes U+FFFD and every control character (``\\n``, ``\\t``, DEL, C1...) a space.
    When cut, the kept prefix is followed by ``… [truncated]``.
    """
    clean = _clean_head(text, limit + 1).translate(_CONTROLS_TO_SPACE)
    data = clean.encode()
    if len(data) <= limit:
        return clean
    if limit < _MARKER_BYTES:  # no room for the marker: a bare cut still honours the bound
        return _cut_head(data, limit).decode()
    return _cut_head(data, limit - _MARKER_BYTES).decode() + TRUNCATED_MARKER


def summary_for_call(name: str, raw_input: str) -> str:
    """The ToolCallStarted summary: ``calculator {"expression":"1+2"}``, bounded."""
    return bounded_diagnostic(f"{name} {raw_input}" if raw_input else name)


def result_preview(text: str | bytes) -> str:
    """The ToolCallCompleted preview: ≤ 2048 bytes and ≤ 20 lines.

    When cut, the kept prefix (≤ 2033 bytes, ≤ 20 lines, ending on a code point) is followed by
    ``… [truncated]`` on its last line.
    """
    clean = _clean_head(text, PREVIEW_MAX_BYTES + 1)
    data = clean.encode()
    newlines = clean.count("\n")
    if len(data) <= PREVIEW_MAX_BYTES and newlines < PREVIEW_MAX_LINES:
        return clean
    prefix = clean
    if newlines >= PREVIEW_MAX_LINES:
        # Keep the first PREVIEW_MAX_LINES lines, without the newline ending the last kept one.
        end = -1
        for _ in range(PREVIEW_MAX_LINES):
            end = clean.index("\n", end + 1)
        prefix = clean[:end]
    return _cut_head(prefix.encode(), PREVIEW_CUT_BYTES).decode() + TRUNCATED_MARKER


def _omission_marker(omitted: int, total: int) -> bytes:
    return f"\n[tool output truncated: omitted {omitted} of {total} bytes]\n".encode()


_MARKER_RE: Final = re.compile(rb"\n\[tool output truncated: omitted ([0-9]{1,19}) of ([0-9]{1,19}) bytes\]\n")


def _earlier_cut(data: bytes) -> tuple[bytes, bytes, int] | None:
    """(head, tail, original size) of a result an earlier :func:`truncate_result` cut, else None.

    Only a marker whose figures add up (the bytes around it plus the omitted ones make the original
    size) counts, so tool output that merely quotes such a line is cut like any other text.
    """
    for m in _MARKER_RE.finditer(data):
        omitted, total = int(m[1]), int(m[2])
        if len(data) - len(m[0]) + omitted == total:
            return data[: m.start()], data[m.end() :], total
    return None


def truncate_result(text: str, max_bytes: int) -> str:
    """Shape a tool result to ``max_bytes`` UTF-8 bytes (0 = unbounded).

    A longer result keeps a head and a tail (halves of what the marker leaves) around
    ``\\n[tool output truncated: omitted X of Y bytes]\\n``; X and Y count UTF-8 bytes. A result that
    an earlier cut left (a worker's, to fit a NATS message) is cut from its kept head and tail, and
    the one marker then counts against the original size. A bound too small for the marker keeps
    only the head.
    """
    if max_bytes < 0:
        raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
    clean = _clean(text)
    if max_bytes == 0:
        return clean
    data = clean.encode()
    if len(data) <= max_bytes:
        return clean
    earlier = _earlier_cut(data)
    head_of, tail_of, total = earlier if earlier is not None else (data, data, len(data))

    def shape(budget: int) -> tuple[bytes, bytes, int]:
        head = _cut_head(head_of, budget // 2)
        tail = _cut_tail(tail_of, budget - budget // 2)
        return head, tail, total - len(head) - len(tail)

    longest = len(_omission_marker(total, total))  # omitted <= total: this marker is never shorter
    if max_bytes < longest:
        return _cut_head(data, max_bytes).decode()
    head, tail, omitted = shape(max_bytes - longest)
    # A shorter omitted count frees a few bytes; use them when the result still fits.
    slack = longest - len(_omission_marker(omitted, total))
    if slack:
        h2, t2, o2 = shape(max_bytes - longest + slack)
        if len(h2) + len(t2) + len(_omission_marker(o2, total)) <= max_bytes:
            head, tail, omitted = h2, t2, o2
    return (head + _omission_marker(omitted, total) + tail).decode()


def _size_text(n: int) -> str:
    if n < 1024:
        return f"{n} bytes"
    if n < 1024 * 1024:
        return f"{n / 1024:.1f} KB"
    return f"{n / (1024 * 1024):.1f} MB"


def image_size(image: ImageBlock) -> int:
    """The bytes an image's base64 data decodes to (0 for an image given by URL)."""
    data = image.data or ""
    return len(data) * 3 // 4 - data[-2:].count("=")


def image_note(number: int, image: ImageBlock, omitted: str = "") -> str:
    """Where a result's image ``number`` (from 1) stood among its text; with ``omitted``, why the
    image itself is not in the result: ``[image 1: image/png, 1.2 MB, omitted: <why>]``."""
    what = image.url if image.url else _size_text(image_size(image))
    end = f", omitted: {omitted}]" if omitted else "]"
    return f"[image {number}: {image.media_type or 'unknown type'}, {what}{end}"


def result_content(blocks: Sequence[Block] | None, *, omit_images_why: str = "") -> tuple[str, list[ImageBlock]]:
    """A tool's result blocks as (text, images): text and refusal items one per line, each image
    noted where it stood (:func:`image_note`) and returned apart to follow the text as image blocks.
    With ``omit_images_why``, no image is returned and each note says why it was omitted."""
    parts: list[str] = []
    images: list[ImageBlock] = []
    for b in blocks or ():
        if isinstance(b, TextBlock | RefusalBlock):
            parts.append(b.text)
        elif isinstance(b, ImageBlock):
            number = len(images) + 1
            images.append(b)
            parts.append(image_note(number, b, omit_images_why))
        else:
            parts.append(f"[unsupported {type(b).__struct_config__.tag}]")
    return "\n".join(parts), [] if omit_images_why else images


def flatten_to_text(blocks: Sequence[Block] | None) -> str:
    """Text and refusal items one per line; each image a note of its type and size; any other block
    ``[unsupported <type>]``."""
    return result_content(blocks)[0]


def omit_images(
    text: str, images: Sequence[ImageBlock], why: str, which: Callable[[ImageBlock], bool] = lambda _: True
) -> tuple[str, list[ImageBlock]]:
    """Leave out the ``images`` that ``which`` picks (all by default): ``text`` with their notes (numbered
    from 1, as :func:`result_content` made them) saying ``why``, and the images kept."""
    kept: list[ImageBlock] = []
    for number, image in enumerate(images, 1):
        if which(image):
            text = text.replace(image_note(number, image), image_note(number, image, why), 1)
        else:
            kept.append(image)
    return text, kept


def tool_result_message(
    tool_use_id: str, text: str, *, is_error: bool, max_bytes: int = 0, images: Sequence[ImageBlock] = ()
) -> ToolResultMessage:
    """One tool-role message: a TextBlock shaped to ``max_bytes`` (0 = unbounded), then ``images``."""
    blocks: list[Block] = [TextBlock(text=truncate_result(text, max_bytes)), *images]
    return ToolResultMessage(tool_use_id=tool_use_id, blocks=blocks, is_error=is_error)


# --- model replies --------------------------------------------------------------------------------


def mint_tool_use_id() -> str:
    """An id for a tool use that came without one (or with a repeated one): ``lw_<32 hex>``."""
    return f"lw_{uuid.uuid4().hex}"


def _raw_input_bytes(value: object) -> bytes | None:
    if isinstance(value, msgspec.Raw | bytes | bytearray | memoryview):
        return bytes(value)
    if isinstance(value, str):
        return value.encode("utf-8", "surrogatepass")
    return None


def _clean_str(value: object) -> str:
    return _clean(value) if isinstance(value, str) else ""


def _clean_block(b: Block) -> Block | None:
    """An independent copy of a non-tool block with encodable strings; None for unknown objects."""
    if isinstance(b, TextBlock):
        return TextBlock(text=_clean_str(b.text))
    if isinstance(b, RefusalBlock):
        return RefusalBlock(text=_clean_str(b.text))
    if isinstance(b, ThinkingBlock):
        return ThinkingBlock(thinking=_clean_str(b.thinking), signature=_clean_str(b.signature))
    if isinstance(b, ImageBlock):
        return ImageBlock(
            media_type=_clean_str(b.media_type),
            url=None if b.url is None else _clean_str(b.url),
            data=None if b.data is None else _clean_str(b.data),
        )
    return None


def _copy_usage(usage: Usage | None) -> Usage | None:
    return None if usage is None else msgspec.structs.replace(usage)


def sanitize_step(msg: AIMessage) -> tuple[AIMessage, list[ToolCall]]:
    """Split a model reply into (stored copy, its tool calls).

    The stored copy is an independent deep copy in which empty text and thinking with neither text
    nor signature are dropped, refusals kept, and every string is valid Unicode. A tool_use whose id
    is empty or repeats an earlier one gets a minted id (in both views, ``minted_id=True``); one
    whose id was minted, whose name is empty or whose input is not strict JSON is stored with input
    ``{}``. The calls keep, per tool use in order, the id, the name, the original input and whether
    it is strict JSON (checked here, once for the whole model-step).
    The stored copy, followed by one result per tool use, always passes the StepDone group rule.
    """
    blocks: list[Block] | None = None if msg.blocks is None else []
    calls: list[ToolCall] = []
    seen: set[str] = set()
    for b in msg.blocks or ():
        if isinstance(b, ToolUseBlock):
            tool_id = _clean_str(b.id)
            name = _clean_str(b.name)
            data = _raw_input_bytes(b.input)
            minted = not tool_id or tool_id in seen
            while not tool_id or tool_id in seen:
                tool_id = mint_tool_use_id()
            seen.add(tool_id)
            invalid = "arguments are not text" if data is None else strict_error(data)
            keep = not minted and bool(name) and not invalid
            stored_input = msgspec.Raw(bytes(data) if keep and data is not None else b"{}")
            assert blocks is not None
            blocks.append(ToolUseBlock(id=tool_id, name=name, input=stored_input))
            text = "" if data is None else data.decode("utf-8", errors="replace")
            calls.append(
                ToolCall(id=tool_id, name=name, input=text, data=data or b"", invalid=invalid, minted_id=minted)
            )
            continue
        if isinstance(b, TextBlock) and not b.text:
            continue
        if isinstance(b, ThinkingBlock) and not b.thinking and not b.signature:
            continue
        copy = _clean_block(b)
        if copy is not None:
            assert blocks is not None
            blocks.append(copy)
    return AIMessage(blocks=blocks, usage=_copy_usage(msg.usage)), calls


def sanitize_ai_message(msg: AIMessage) -> tuple[AIMessage, list[RawToolUse]]:
    """:func:`sanitize_step` with the wire view of the calls (the bytes the model sent, as text)."""
    stored, calls = sanitize_step(msg)
    return stored, [c.raw() for c in calls]


def is_empty_response(msg: AIMessage) -> bool:
    """True when a reply has nothing to commit: no tool use, no non-empty text, no thinking with text
    or signature, and no refusal or image."""
    for b in msg.blocks or ():
        if isinstance(b, ToolUseBlock | RefusalBlock | ImageBlock):
            return False
        if isinstance(b, TextBlock) and b.text:
            return False
        if isinstance(b, ThinkingBlock) and (b.thinking or b.signature):
            return False
    return True


def safe_prefix(msg: AIMessage | None, notice: str) -> AIMessage | None:
    """What a stream that failed mid-way may commit: non-empty text, refusals and sealed thinking
    (non-empty signature), then a TextBlock with ``notice``; None when nothing survives. Tool uses,
    unsealed thinking and images are dropped; no usage is attached."""
    if msg is None:
        return None
    kept: list[Block] = []
    for b in msg.blocks or ():
        keep = (
            (isinstance(b, TextBlock) and bool(b.text))
            or isinstance(b, RefusalBlock)
            or (isinstance(b, ThinkingBlock) and bool(b.signature))
        )
        copy = _clean_block(b) if keep else None
        if copy is not None:
            kept.append(copy)
    if not kept:
        return None
    kept.append(TextBlock(text=notice))
    return AIMessage(blocks=kept)
