"""Messages, content blocks and usage: the conversation model every service shares.

Wire shape: blocks are tagged by ``"type"``, messages by ``"role"``; field names are snake_case;
a tool_use ``input`` is embedded raw JSON (not a string). ``None`` (absent) and ``[]`` (present,
empty) are different values and survive encode/decode and :func:`clone`.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final, TypeVar

import msgspec

from shared.errors import UsageOverflowError
from shared.wiretypes import UINT64_MAX, TokenCount

__all__ = ["UINT64_MAX"]
_JSON_SPACE: Final = b" \t\n\r"


class Role(StrEnum):
    USER = "user"
    ASSISTANT = "assistant"
    SYSTEM = "system"
    TOOL = "tool"


# --- blocks -----------------------------------------------------------------------------------


class _BlockBase(msgspec.Struct, tag_field="type", omit_defaults=True, forbid_unknown_fields=True, kw_only=True):
    pass


class TextBlock(_BlockBase, tag="text"):
    text: str = ""


class RefusalBlock(_BlockBase, tag="refusal"):
    """A refusal is kept apart from prose so it never decodes as an ordinary answer."""

    text: str = ""


class ThinkingBlock(_BlockBase, tag="thinking"):
    thinking: str = ""
    # Providers sign reasoning so it can be sent back verbatim; "" means unsigned (not sealed).
    signature: str = ""


class ToolUseBlock(_BlockBase, tag="tool_use"):
    id: str = ""
    name: str = ""
    input: msgspec.Raw = msgspec.field(default_factory=lambda: msgspec.Raw(b"{}"))

    def __post_init__(self) -> None:
        # Decoding yields an embedded value without the JSON whitespace around it; trim it here too,
        # so every block equals its own round trip (and its clone).
        raw = self.input
        if isinstance(raw, msgspec.Raw) and len(raw):
            view = memoryview(raw)
            if view[0] in _JSON_SPACE or view[-1] in _JSON_SPACE:
                self.input = msgspec.Raw(bytes(view).strip(_JSON_SPACE))


class ImageBlock(_BlockBase, tag="image"):
    media_type: str = ""
    url: str | None = None
    data: str | None = None  # base64


Block = TextBlock | RefusalBlock | ThinkingBlock | ToolUseBlock | ImageBlock


# --- usage ------------------------------------------------------------------------------------


class Usage(msgspec.Struct, omit_defaults=True, forbid_unknown_fields=True, kw_only=True):
    input_tokens: TokenCount = 0
    output_tokens: TokenCount = 0
    cache_read_tokens: TokenCount = 0
    cache_creation_tokens: TokenCount = 0
    reasoning_tokens: TokenCount = 0  # a subset of output_tokens by convention; never enforced

    def add(self, other: Usage) -> Usage:
        """Sum two usages; raises :class:`UsageOverflowError` past uint64 instead of wrapping."""
        # Spelled out (not a getattr loop over the fields): the history fold adds usages for every
        # step it reads back, and this runs ~3x faster. Fields are checked in declaration order.
        totals = (
            ("input_tokens", self.input_tokens + other.input_tokens),
            ("output_tokens", self.output_tokens + other.output_tokens),
            ("cache_read_tokens", self.cache_read_tokens + other.cache_read_tokens),
            ("cache_creation_tokens", self.cache_creation_tokens + other.cache_creation_tokens),
            ("reasoning_tokens", self.reasoning_tokens + other.reasoning_tokens),
        )
        for name, total in totals:
            if total > UINT64_MAX or total < 0:
                raise UsageOverflowError(name)
        return Usage(
            input_tokens=totals[0][1],
            output_tokens=totals[1][1],
            cache_read_tokens=totals[2][1],
            cache_creation_tokens=totals[3][1],
            reasoning_tokens=totals[4][1],
        )

    @property
    def context_tokens(self) -> int:
        return self.input_tokens + self.cache_read_tokens + self.cache_creation_tokens


# --- messages ---------------------------------------------------------------------------------


class _MessageBase(msgspec.Struct, tag_field="role", omit_defaults=True, forbid_unknown_fields=True, kw_only=True):
    pass


class UserMessage(_MessageBase, tag="user"):
    blocks: list[Block] | None = None


class SystemMessage(_MessageBase, tag="system"):
    blocks: list[Block] | None = None


class AIMessage(_MessageBase, tag="assistant"):
    blocks: list[Block] | None = None
    usage: Usage | None = None


class ToolResultMessage(_MessageBase, tag="tool"):
    tool_use_id: str = ""
    blocks: list[Block] | None = None
    is_error: bool = False


Message = UserMessage | SystemMessage | AIMessage | ToolResultMessage

ROLE_OF: Final[dict[type, Role]] = {
    UserMessage: Role.USER,
    SystemMessage: Role.SYSTEM,
    AIMessage: Role.ASSISTANT,
    ToolResultMessage: Role.TOOL,
}


def role_of(message: object) -> Role | None:
    """The role of a message object, or None when it is not one of ours."""
    return ROLE_OF.get(type(message))


# --- constructors and views ---------------------------------------------------------------------


def user_text(text: str) -> UserMessage:
    return UserMessage(blocks=[TextBlock(text=text)])


def ai_text(text: str, usage: Usage | None = None) -> AIMessage:
    return AIMessage(blocks=[TextBlock(text=text)], usage=usage)


def tool_result(tool_use_id: str, text: str, *, is_error: bool = False) -> ToolResultMessage:
    return ToolResultMessage(tool_use_id=tool_use_id, blocks=[TextBlock(text=text)], is_error=is_error)


def text_of(message: Message) -> str:
    """The concatenated text blocks of a message (refusals included, thinking excluded)."""
    return "".join(b.text for b in (message.blocks or ()) if isinstance(b, TextBlock | RefusalBlock))


def tool_uses(message: AIMessage) -> list[ToolUseBlock]:
    return [b for b in (message.blocks or ()) if isinstance(b, ToolUseBlock)]


# --- deep clones --------------------------------------------------------------------------------

T = TypeVar("T", bound=msgspec.Struct)


def clone(value: T) -> T:
    """A deep, independent copy of any content struct (or event), keeping None vs [] apart.

    Implemented as a msgspec round trip: C-fast, and Raw tool inputs get their own buffer.
    """
    return msgspec.json.decode(msgspec.json.encode(value), type=type(value))


def clone_messages(messages: list[Message] | None) -> list[Message] | None:
    if messages is None:
        return None
    return msgspec.json.decode(msgspec.json.encode(messages), type=list[Message])


def clone_blocks(blocks: list[Block] | None) -> list[Block] | None:
    if blocks is None:
        return None
    return msgspec.json.decode(msgspec.json.encode(blocks), type=list[Block])
