"""Strict JSON: valid UTF-8, valid JSON, and no duplicate object keys (case-insensitive) at any depth.

One definition used by the codec (decode), validation (tool_use inputs) and step shaping
(sanitising model tool arguments), so nothing the model-step accepts is refused on replay.
"""

from __future__ import annotations

import json
from typing import Any


class StrictJSONError(ValueError):
    """Why a document is not strict JSON."""


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs) or len({k.casefold() for k in out}) != len(out):
        seen: set[str] = set()
        for k, _ in pairs:
            if k.casefold() in seen:
                raise StrictJSONError(f"duplicate key {k!r}")
            seen.add(k.casefold())
    return out


def _no_constants(name: str) -> Any:
    # NaN / Infinity are not JSON.
    raise StrictJSONError(f"{name} is not valid JSON")


def loads(data: bytes | str) -> Any:
    """Parse strictly; raises :class:`StrictJSONError` with the reason."""
    if isinstance(data, bytes | bytearray | memoryview):
        try:
            text = bytes(data).decode("utf-8")
        except UnicodeDecodeError as e:
            raise StrictJSONError(f"invalid UTF-8 at byte {e.start}") from None
    else:
        text = data
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constants)
    except StrictJSONError:
        raise
    except (ValueError, RecursionError) as e:
        raise StrictJSONError(f"not valid JSON: {e}") from None


def is_strict(data: bytes | str) -> bool:
    try:
        loads(data)
    except StrictJSONError:
        return False
    return True
