"""A small YAML emitter for the AsyncAPI document: block style, every string double-quoted (JSON-escaped)."""

from __future__ import annotations

import json
import re
from typing import Any, Final

_PLAIN_KEY: Final = re.compile(r"^[A-Za-z_$][A-Za-z0-9_$.-]*$")
_RESERVED: Final = frozenset({"true", "false", "null", "yes", "no", "on", "off", "y", "n", "~"})


def _scalar(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return json.dumps(value)
    return json.dumps(str(value), ensure_ascii=False)


def _key(key: str) -> str:
    return key if _PLAIN_KEY.match(key) and key.lower() not in _RESERVED else json.dumps(key, ensure_ascii=False)


def _yaml_lines(value: Any, indent: int) -> list[str]:
    pad = " " * indent
    lines: list[str] = []
    if isinstance(value, dict):
        for k, v in value.items():
            if isinstance(v, dict | list) and v:
                lines.append(f"{pad}{_key(str(k))}:")
                lines.extend(_yaml_lines(v, indent + 2))
            else:
                lines.append(f"{pad}{_key(str(k))}: {_inline(v)}")
    elif isinstance(value, list):
        for item in value:
            if isinstance(item, dict | list) and item:
                sub = _yaml_lines(item, indent + 2)
                lines.append(f"{pad}- {sub[0].lstrip()}")
                lines.extend(sub[1:])
            else:
                lines.append(f"{pad}- {_inline(item)}")
    else:
        lines.append(f"{pad}{_inline(value)}")
    return lines


def _inline(value: Any) -> str:
    if isinstance(value, dict):
        return "{}"
    if isinstance(value, list):
        return "[]"
    return _scalar(value)


def to_yaml(value: Any, header: str = "") -> str:
    """Block-style YAML that any YAML 1.2 parser reads back as ``value`` (strings are JSON-quoted)."""
    head = "".join(f"# {line}\n" for line in header.splitlines())
    return head + "\n".join(_yaml_lines(value, 0)) + "\n"
