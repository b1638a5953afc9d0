"""Strict JSON: valid UTF-8, valid JSON, and no duplicate object keys (case-insensitive) at any depth.

One definition used by the codec (decode), validation (tool_use inputs) and step shaping
(sanitising model tool arguments), so nothing the model-step accepts is refused on replay.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from typing import Any, Final

import msgspec

from shared.errors import StrictJSONError as StrictJSONError

MAX_DEPTH: Final = 256
"""Deepest nesting :func:`loads` accepts. Fixed, so acceptance never depends on the caller's stack."""

EMBEDDED_MAX_DEPTH: Final = MAX_DEPTH - 32
"""Deepest nesting :func:`is_strict` accepts: a value embedded in a record (a tool_use input) keeps
room for the record's own levels around it, so whatever validates on encode also decodes."""


def keys_distinct(keys: Collection[str]) -> bool:
    """No two of ``keys`` differ only in case (strict JSON counts those as duplicates)."""
    return len({k.casefold() for k in keys}) == len(keys)


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs) or not keys_distinct(out):
        seen: set[str] = set()
        for k, _ in pairs:
            if k.casefold() in seen:
                raise StrictJSONError(f"duplicate key {k!r}")
            seen.add(k.casefold())
    return out


def _no_constants(name: str) -> Any:
    # NaN / Infinity are not JSON.
    raise StrictJSONError(f"{name} is not valid JSON")


# One decoder for every call: json.loads(..., object_pairs_hook=...) builds a new JSONDecoder (and
# its scanner) per call, about half of a small document's parse (docs/benchmarks.md).
_DECODER: Final = json.JSONDecoder(object_pairs_hook=_no_duplicates, parse_constant=_no_constants)


def _depth_ok(doc: Any, max_depth: int) -> bool:
    """Nesting (``[]`` is depth 1) is at most ``max_depth``; iterative, so it never recurses."""
    if max_depth < 1:
        return False
    stack: list[tuple[Any, int]] = [(doc, 1)]
    while stack:
        value, depth = stack.pop()
        children = value.values() if isinstance(value, dict) else value
        for child in children:
            if isinstance(child, dict | list):
                if depth + 1 > max_depth:
                    return False
                stack.append((child, depth + 1))
    return True


def loads(data: bytes | str, *, max_depth: int = MAX_DEPTH) -> Any:
    """Parse strictly; raises :class:`StrictJSONError` with the reason."""
    if isinstance(data, bytes | bytearray | memoryview):
        raw = bytes(data)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise StrictJSONError(f"invalid UTF-8 at byte {e.start}") from None
    else:
        text = data
        try:
            raw = text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise StrictJSONError(f"not encodable as UTF-8 at character {e.start}") from None
    try:
        if text.startswith("\ufeff"):  # what json.loads says about a BOM, before it parses
            raise json.JSONDecodeError("Unexpected UTF-8 BOM (decode using utf-8-sig)", text, 0)
        doc = _DECODER.decode(text)
    except StrictJSONError:
        raise
    except (ValueError, RecursionError) as e:
        raise StrictJSONError(f"not valid JSON: {e}") from None
    # Counting brackets (strings included) bounds the depth from above and is C-fast; walk only if needed.
    if isinstance(doc, dict | list) and text.count("[") + text.count("{") > max_depth and not _depth_ok(doc, max_depth):
        raise StrictJSONError(f"nested deeper than {max_depth} levels")
    # Every record is decoded by msgspec on replay: refuse what it refuses (e.g. a lone surrogate escape
    # "\ud800", which the json module accepts), so nothing accepted here fails later.
    try:
        msgspec.json.decode(raw, type=msgspec.Raw)
    except (msgspec.DecodeError, RecursionError) as e:
        raise StrictJSONError(f"not valid JSON: {e}") from None
    return doc


_msgspec_decode: Final = msgspec.json.decode
_msgspec_encode: Final = msgspec.json.encode
_msgspec_format: Final = msgspec.json.format


def _plainly_strict(raw: bytes, max_depth: int) -> bool:
    """True when ``raw`` is certainly strict JSON within ``max_depth``; False means "ask :func:`loads`".

    msgspec parses in C and refuses what :func:`loads` refuses (invalid UTF-8, NaN, a BOM, lone
    surrogates) but keeps the last of duplicate keys without a word. Its re-encoding of what it
    parsed equals the input with the whitespace removed only when the input held no duplicate key
    (and no escape or number spelling that re-encodes differently: those take the full path too).
    Tool arguments are checked on every step, in the model-step and again in the committer, and
    this costs a fifth of the full path on a small document.
    """
    if raw.count(b"[") + raw.count(b"{") > max_depth:
        return False
    try:
        doc = _msgspec_decode(raw)
        if _msgspec_encode(doc) != _msgspec_format(raw, indent=-1):
            return False
    except (msgspec.DecodeError, msgspec.EncodeError, RecursionError, ValueError, TypeError):
        return False
    if not isinstance(doc, dict | list):
        return True
    stack: list[Any] = [doc]
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            if not keys_distinct(value):
                return False
            value = value.values()
        stack.extend(v for v in value if isinstance(v, dict | list))
    return True


def why_not_strict(data: bytes | str, *, max_depth: int = EMBEDDED_MAX_DEPTH) -> str:
    """Why ``data`` is not strict JSON that can be embedded in a record (see :data:`EMBEDDED_MAX_DEPTH`);
    "" when it is."""
    if isinstance(data, bytes) and _plainly_strict(data, max_depth):
        return ""
    try:
        loads(data, max_depth=max_depth)
    except StrictJSONError as e:
        return str(e) or "not valid JSON"
    return ""


def is_strict(data: bytes | str, *, max_depth: int = EMBEDDED_MAX_DEPTH) -> bool:
    """True when ``data`` is strict JSON that can be embedded in a record (see :data:`EMBEDDED_MAX_DEPTH`)."""
    return not why_not_strict(data, max_depth=max_depth)
