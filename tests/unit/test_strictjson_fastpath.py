"""Strict JSON's msgspec fast path says yes only where the full parse does."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared import strictjson
from shared.strictjson import EMBEDDED_MAX_DEPTH, StrictJSONError


def _full(data: bytes, max_depth: int = EMBEDDED_MAX_DEPTH) -> bool:
    try:
        strictjson.loads(data, max_depth=max_depth)
    except StrictJSONError:
        return False
    return True


_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=12)
_docs = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=20,
)


def _spellings(doc: object, draw: st.DataObject) -> bytes:
    """The document as a model might write it: spacing, escapes, and keys repeated or recased."""
    separators = draw.draw(st.sampled_from([(",", ":"), (", ", ": ")]))
    text = json.dumps(doc, ensure_ascii=draw.draw(st.booleans()), separators=separators)
    edit = draw.draw(st.sampled_from(["none", "dup", "case", "cut", "byte"]))
    if edit == "dup" and text.startswith("{") and text != "{}":
        text = text[:-1] + "," + text[1:]  # every key twice
    elif edit == "case" and text.startswith("{") and text != "{}":
        text = text[:-1] + "," + text[1:].upper()
    raw = text.encode()
    if edit == "cut" and raw:
        raw = raw[: draw.draw(st.integers(0, len(raw) - 1))]
    elif edit == "byte" and raw:
        i = draw.draw(st.integers(0, len(raw) - 1))
        raw = raw[:i] + bytes([draw.draw(st.integers(0, 255))]) + raw[i + 1 :]
    return raw


@settings(max_examples=600, deadline=None)
@given(_docs, st.data())
def test_the_fast_path_accepts_only_what_the_full_parse_accepts(doc: object, draw: st.DataObject) -> None:
    raw = _spellings(doc, draw)
    if strictjson._plainly_strict(raw, EMBEDDED_MAX_DEPTH):
        assert _full(raw)
    assert strictjson.is_strict(raw) == _full(raw)


@pytest.mark.parametrize(
    ("raw", "ok"),
    [
        (b'{"expression": "(17 + 4) * 3"}', True),
        (b'{"a": 1, "a": 2}', False),
        (b'{"a": {"k": 1, "K": 2}}', False),
        (b'[{"x": [1, {"y": 1, "Y": 1}]}]', False),
        (b'{"a": "\\u00e9"}', True),  # re-encodes differently: decided by the full parse
        (b'{"a": 1e400}', True),
        (b'{"a": NaN}', False),
        (b"\xef\xbb\xbf{}", False),
        (b'{"a": "\xff"}', False),
        (b'{"a": "\\ud800"}', False),
        (b"[" * 300 + b"]" * 300, False),
        (b"12345678901234567890123456789", True),
    ],
)
def test_known_cases(raw: bytes, ok: bool) -> None:
    assert strictjson.is_strict(raw) is ok
    assert _full(raw) is ok
