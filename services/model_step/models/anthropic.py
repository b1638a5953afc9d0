"""The Anthropic Messages adapter (streaming), over httpx (no SDK).

``POST {LW_ANTHROPIC_BASE_URL}/v1/messages`` with ``stream: true``, headers ``x-api-key`` and
``anthropic-version: 2023-06-01``. Events → chunks:

* ``message_start`` (input / cache usage), ``content_block_start`` (text; tool_use → id + name;
  thinking), ``content_block_delta`` (text_delta, input_json_delta → argument fragment verbatim,
  thinking_delta, signature_delta), ``content_block_stop``, ``message_delta`` (stop_reason,
  cumulative output usage), ``message_stop`` (the end), ``ping`` (ignored), ``error`` (→
  ModelStreamError). Block indices are Anthropic's content-block indices.
* A tool_use block that received no ``input_json_delta`` text gets the ``input`` of its start
  event (``{}``), so a tool without arguments is valid JSON.
* Unknown event, block and delta types are skipped (the API adds new ones); ``redacted_thinking``
  blocks are not kept (the content model has no field for their opaque data).
* A stream that ends without ``message_stop`` was cut: ModelStreamError.

Request: the system prompt (plus any SystemMessage text) top-level; user text and images;
assistant blocks in order: signed thinking (unsigned thinking is dropped — the API refuses it),
non-empty text, tool_use with the stored input JSON; consecutive tool results as ``tool_result``
blocks with ``is_error`` in one user message; consecutive same-role messages merged.
``max_tokens`` defaults to 4096 (the API requires one); ``LW_ANTHROPIC_THINKING_BUDGET`` > 0
enables extended thinking (max_tokens is raised above the budget if needed).
"""

from __future__ import annotations

from typing import Any, Final

import msgspec

from services.model_step.models.base import ModelChunk, ModelRequest, ToolDef
from services.model_step.models.errors import ModelStreamError
from services.model_step.models.httpstream import HttpStreamingModel, clean
from shared.content import (
    AIMessage,
    Block,
    ImageBlock,
    Message,
    RefusalBlock,
    SystemMessage,
    TextBlock,
    ThinkingBlock,
    ToolResultMessage,
    ToolUseBlock,
    Usage,
)

API_VERSION: Final = "2023-06-01"
DEFAULT_MAX_TOKENS: Final = 4096
EMPTY_SCHEMA: Final[dict[str, Any]] = {"type": "object", "properties": {}}

# --- wire shapes of the stream events (unknown fields ignored; wrong types are a hard error) -----


class _Head(msgspec.Struct):
    type: str


class _Usage(msgspec.Struct):
    input_tokens: int | None = None
    output_tokens: int | None = None
    cache_read_input_tokens: int | None = None
    cache_creation_input_tokens: int | None = None


class _Message(msgspec.Struct):
    usage: _Usage | None = None


class _MessageStart(msgspec.Struct):
    message: _Message


class _ContentBlock(msgspec.Struct):
    type: str
    text: str | None = None
    id: str | None = None
    name: str | None = None
    input: msgspec.Raw = msgspec.field(default_factory=lambda: msgspec.Raw(b""))  # Raw | None is unsupported
    thinking: str | None = None
    signature: str | None = None


class _BlockStart(msgspec.Struct):
    index: int
    content_block: _ContentBlock


class _Delta(msgspec.Struct):
    type: str
    text: str | None = None
    partial_json: str | None = None
    thinking: str | None = None
    signature: str | None = None


class _BlockDelta(msgspec.Struct):
    index: int
    delta: _Delta


class _BlockStop(msgspec.Struct):
    index: int


class _MessageDeltaBody(msgspec.Struct):
    stop_reason: str | None = None


class _MessageDelta(msgspec.Struct):
    delta: _MessageDeltaBody | None = None
    usage: _Usage | None = None


class _ErrorBody(msgspec.Struct):
    type: str = ""
    message: str = ""


class _ErrorEvent(msgspec.Struct):
    error: _ErrorBody


_EVENT_TYPES: Final[dict[str, type[msgspec.Struct]]] = {
    "message_start": _MessageStart,
    "content_block_start": _BlockStart,
    "content_block_delta": _BlockDelta,
    "content_block_stop": _BlockStop,
    "message_delta": _MessageDelta,
    "error": _ErrorEvent,
}


class _Folder:
    def __init__(self, label: str, secret: str) -> None:
        self.label = label
        self.secret = secret  # removed from any error text taken from the stream
        self.done = False
        self.stop_reason: str | None = None
        self.usage: _Usage | None = None
        self.blocks: dict[int, str] = {}  # index → block type
        self.tool_start_input: dict[int, str] = {}
        self.tool_args: dict[int, int] = {}

    def complete(self) -> bool:
        return self.done

    def on_data(self, data: str) -> list[ModelChunk]:
        try:
            head = msgspec.json.decode(data, type=_Head)
            shape = _EVENT_TYPES.get(head.type)
            event: msgspec.Struct | None = None if shape is None else msgspec.json.decode(data, type=shape)
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            raise ModelStreamError(clean(f"{self.label}: undecodable stream event: {e}", self.secret)) from None
        if head.type == "message_stop":
            self.done = True
            return []
        if isinstance(event, _ErrorEvent):
            detail = clean(f"{event.error.type}: {event.error.message}", self.secret)
            raise ModelStreamError(f"{self.label}: server error in stream: {detail}")
        if isinstance(event, _MessageStart):
            self._usage(event.message.usage)
        elif isinstance(event, _MessageDelta):
            if event.delta is not None and event.delta.stop_reason:
                self.stop_reason = event.delta.stop_reason
            self._usage(event.usage)
        elif isinstance(event, _BlockStart):
            return self._start(event)
        elif isinstance(event, _BlockDelta):
            return self._delta(event)
        elif isinstance(event, _BlockStop):
            return self._stop(event.index)
        # ping and unknown event types carry nothing to fold.
        return []

    def _usage(self, u: _Usage | None) -> None:
        if u is None:
            return
        if self.usage is None:
            self.usage = _Usage()
        # message_delta counts are cumulative: a later value replaces the earlier one.
        for f in _Usage.__struct_fields__:
            value = getattr(u, f)
            if value is not None:
                setattr(self.usage, f, value)

    def _start(self, event: _BlockStart) -> list[ModelChunk]:
        block, i = event.content_block, event.index
        self.blocks[i] = block.type
        if block.type == "text":
            return [ModelChunk(kind="text", text=block.text)] if block.text else []
        if block.type == "tool_use":
            start_input = bytes(block.input).decode("utf-8", "replace")
            # The start carries the full input only when it is complete ({} for no arguments).
            self.tool_start_input[i] = start_input if start_input.strip() else "{}"
            self.tool_args[i] = 0
            return [ModelChunk(kind="tool_use", index=i, id=block.id or "", name=block.name or "")]
        if block.type == "thinking":
            out = [ModelChunk(kind="thinking", index=i, text=block.thinking or "")]
            if block.signature:
                out.append(ModelChunk(kind="signature", index=i, text=block.signature))
            return out
        return []

    def _stop(self, i: int) -> list[ModelChunk]:
        if self.blocks.get(i) == "tool_use" and self.tool_args.get(i, 0) == 0:
            return [ModelChunk(kind="tool_use", index=i, text=self.tool_start_input.get(i, "{}"))]
        return []

    def _delta(self, event: _BlockDelta) -> list[ModelChunk]:
        d, i = event.delta, event.index
        if d.type == "text_delta" and d.text:
            return [ModelChunk(kind="text", text=d.text)]
        if d.type == "input_json_delta":
            fragment = d.partial_json or ""
            self.tool_args[i] = self.tool_args.get(i, 0) + len(fragment)
            return [ModelChunk(kind="tool_use", index=i, text=fragment)] if fragment else []
        if d.type == "thinking_delta" and d.thinking:
            return [ModelChunk(kind="thinking", index=i, text=d.thinking)]
        if d.type == "signature_delta" and d.signature:
            return [ModelChunk(kind="signature", index=i, text=d.signature)]
        return []

    def closing(self) -> list[ModelChunk]:
        out: list[ModelChunk] = []
        if self.usage is not None:
            u = self.usage
            usage = Usage(
                input_tokens=max(0, u.input_tokens or 0),
                output_tokens=max(0, u.output_tokens or 0),
                cache_read_tokens=max(0, u.cache_read_input_tokens or 0),
                cache_creation_tokens=max(0, u.cache_creation_input_tokens or 0),
            )
            out.append(ModelChunk(kind="usage", usage=usage))
        if self.stop_reason is not None:
            out.append(ModelChunk(kind="finish", finish_reason=self.stop_reason))
        return out


# --- request building -----------------------------------------------------------------------------


def _text_of(blocks: list[Block] | None) -> str:
    return "".join(b.text for b in (blocks or ()) if isinstance(b, TextBlock | RefusalBlock))


def _image(b: ImageBlock) -> dict[str, Any]:
    if b.url:
        return {"type": "image", "source": {"type": "url", "url": b.url}}
    return {"type": "image", "source": {"type": "base64", "media_type": b.media_type, "data": b.data or ""}}


def _user_blocks(blocks: list[Block] | None) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for b in blocks or ():
        if isinstance(b, TextBlock | RefusalBlock) and b.text:
            out.append({"type": "text", "text": b.text})
        elif isinstance(b, ImageBlock):
            out.append(_image(b))
    return out


def _assistant_blocks(blocks: list[Block] | None) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for b in blocks or ():
        if isinstance(b, ThinkingBlock):
            if b.signature:
                out.append({"type": "thinking", "thinking": b.thinking, "signature": b.signature})
        elif isinstance(b, TextBlock | RefusalBlock):
            if b.text:
                out.append({"type": "text", "text": b.text})
        elif isinstance(b, ToolUseBlock):
            raw = bytes(b.input)
            out.append({"type": "tool_use", "id": b.id, "name": b.name, "input": msgspec.Raw(raw or b"{}")})
    return out


def _tool_result(m: ToolResultMessage) -> dict[str, Any]:
    # A result with images is sent as content blocks (the API takes text and images there).
    images = [_image(b) for b in m.blocks or () if isinstance(b, ImageBlock)]
    content: str | list[dict[str, Any]] = _text_of(m.blocks)
    if images:
        content = [{"type": "text", "text": content}, *images] if content else images
    out: dict[str, Any] = {"type": "tool_result", "tool_use_id": m.tool_use_id, "content": content}
    if m.is_error:
        out["is_error"] = True
    return out


def convert_messages(system: str, messages: list[Message]) -> tuple[str, list[dict[str, Any]]]:
    """(top-level system text, Anthropic messages) for a history."""
    systems = [system] if system else []
    out: list[dict[str, Any]] = []
    for m in messages:
        if isinstance(m, SystemMessage):
            if text := _text_of(m.blocks):
                systems.append(text)
            continue
        if isinstance(m, AIMessage):
            role, content = "assistant", _assistant_blocks(m.blocks)
        elif isinstance(m, ToolResultMessage):
            role, content = "user", [_tool_result(m)]
        else:
            role, content = "user", _user_blocks(m.blocks)
        if not content:
            continue  # the API refuses empty messages
        if out and out[-1]["role"] == role:
            out[-1]["content"].extend(content)
        else:
            out.append({"role": role, "content": content})
    return "\n\n".join(systems), out


def convert_tools(tools: list[ToolDef]) -> list[dict[str, Any]]:
    return [
        {"name": t.name, "description": t.description, "input_schema": t.input_schema or EMPTY_SCHEMA} for t in tools
    ]


class AnthropicModel(HttpStreamingModel):
    """``anthropic:<model>``: the Messages API, streaming."""

    provider = "anthropic"
    incomplete = "message_stop"

    @property
    def url(self) -> str:
        return f"{self._config.base_url}/v1/messages"

    def request_body(self, request: ModelRequest) -> dict[str, Any]:
        system, messages = convert_messages(request.system, request.messages)
        max_tokens = request.max_tokens if request.max_tokens > 0 else DEFAULT_MAX_TOKENS
        body: dict[str, Any] = {"model": request.model or self._model, "max_tokens": max_tokens, "stream": True}
        budget = self._config.thinking_budget
        if budget > 0:
            body["thinking"] = {"type": "enabled", "budget_tokens": budget}
            body["max_tokens"] = max(max_tokens, budget + 1024)  # the API wants max_tokens > budget
        if system:
            body["system"] = system
        body["messages"] = messages
        if request.tools:
            body["tools"] = convert_tools(request.tools)
        return body

    def _headers(self) -> dict[str, str]:
        headers = {
            "content-type": "application/json",
            "accept": "text/event-stream",
            "anthropic-version": API_VERSION,
        }
        if self._config.api_key:
            headers["x-api-key"] = self._config.api_key
        return headers

    def _folder(self) -> _Folder:
        return _Folder(self._label, self._config.api_key)
