"""Folding streamed chunks into one assistant message (block by block).

* Blocks appear in order of first arrival per (kind, index) key; a later-arriving lower index of
  the same kind is inserted before the higher ones already there.
* Text and refusal are single blocks (every text chunk is appended, whatever its index).
* Each thinking index is one block; ``signature`` chunks set its signature (last one wins).
* Each tool_use index is one block: the last non-empty id / name wins, argument fragments are
  concatenated verbatim. Any int index (negative, huge) is safe.

:meth:`StreamAccumulator.message` is *unsanitised*: a tool_use input is ``msgspec.Raw`` of the
exact concatenated bytes, possibly invalid JSON (``shared.shaping.sanitize_ai_message`` makes the
stored copy; :meth:`StreamAccumulator.raw_tool_uses` is the executable view).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

import msgspec

from services.model_step.models.base import ModelChunk, ModelError
from shared import shaping
from shared.content import AIMessage, Block, RefusalBlock, TextBlock, ThinkingBlock, ToolUseBlock, Usage
from shared.events import RawToolUse


@dataclass(slots=True)
class _Slot:
    """One block under construction."""

    kind: str
    parts: list[str] = field(default_factory=list)
    signature: str = ""
    id: str = ""
    name: str = ""


# Kinds with one block per index; text and refusal have a single block each.
_INDEXED = ("thinking", "tool_use")


class StreamAccumulator:
    """Folds :class:`ModelChunk` values into an :class:`AIMessage`, usage and finish reason."""

    def __init__(self) -> None:
        self._order: list[tuple[str, int]] = []  # block keys in message order
        self._slots: dict[tuple[str, int], _Slot] = {}
        # Sorted indices seen per indexed kind, to place a late lower index before higher ones.
        self._indices: dict[str, list[int]] = {k: [] for k in _INDEXED}
        self.usage: Usage | None = None
        self.finish_reason: str = ""
        self.chunks: int = 0

    def _slot(self, kind: str, index: int) -> _Slot:
        key = (kind, index if kind in _INDEXED else 0)
        slot = self._slots.get(key)
        if slot is not None:
            return slot
        slot = self._slots[key] = _Slot(kind)
        if kind in _INDEXED:
            seen = self._indices[kind]
            pos = bisect.bisect_right(seen, index)
            if pos < len(seen):
                # A higher index of this kind is already placed: go right before the lowest of those.
                self._order.insert(self._order.index((kind, seen[pos])), key)
            else:
                self._order.append(key)
            seen.insert(pos, index)
        else:
            self._order.append(key)
        return slot

    def add(self, chunk: ModelChunk) -> None:
        kind = chunk.kind
        self.chunks += 1
        if kind in ("text", "refusal", "thinking"):
            self._slot(kind, chunk.index).parts.append(chunk.text)
        elif kind == "signature":
            self._slot("thinking", chunk.index).signature = chunk.text
        elif kind == "tool_use":
            slot = self._slot(kind, chunk.index)
            if chunk.id:
                slot.id = chunk.id
            if chunk.name:
                slot.name = chunk.name
            slot.parts.append(chunk.text)
        elif kind == "usage":
            self.usage = chunk.usage
        elif kind == "finish":
            self.finish_reason = chunk.finish_reason
        else:
            raise ModelError(f"unknown model chunk kind {kind[:40]!r}")

    def _block(self, slot: _Slot) -> Block:
        text = "".join(slot.parts)
        if slot.kind == "text":
            return TextBlock(text=text)
        if slot.kind == "refusal":
            return RefusalBlock(text=text)
        if slot.kind == "thinking":
            return ThinkingBlock(thinking=text, signature=slot.signature)
        return ToolUseBlock(id=slot.id, name=slot.name, input=msgspec.Raw(text.encode()))

    def message(self) -> AIMessage:
        """The folded assistant message (a fresh object each call), with the usage if any was sent."""
        usage = None if self.usage is None else msgspec.structs.replace(self.usage)  # a copy
        return AIMessage(blocks=[self._block(self._slots[k]) for k in self._order], usage=usage)

    def raw_tool_uses(self) -> list[RawToolUse]:
        """The executable view: each tool use in message order with its exact argument text."""
        return [
            RawToolUse(id=s.id, name=s.name, input="".join(s.parts))
            for k in self._order
            if (s := self._slots[k]).kind == "tool_use"
        ]

    @property
    def has_content(self) -> bool:
        """False for an empty response (the rule is :func:`shared.shaping.is_empty_response`)."""
        return not shaping.is_empty_response(self.message())
