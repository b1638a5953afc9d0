"""The OpenAI-compatible chat-completions adapter (OpenAI, vLLM, Ollama, llama.cpp, LM Studio).

``POST {LW_OPENAI_BASE_URL}/chat/completions`` with ``stream: true`` and
``stream_options: {"include_usage": true}``, over httpx (no SDK). Stream → chunks:

* ``delta.content`` → text; ``delta.refusal`` → refusal; ``delta.reasoning_content`` /
  ``delta.reasoning`` (vLLM, Ollama, DeepSeek-style servers) → thinking block 0;
* ``delta.tool_calls[]`` → tool_use fragments folded by ``index`` (for a server that omits the
  index: a new id opens the next index, an id-less fragment continues the last call); id and name
  when present, ``function.arguments`` verbatim;
* ``finish_reason`` (stop → end_turn, tool_calls → tool_use, length → max_tokens,
  content_filter → refusal) and the final usage chunk; ``data: [DONE]`` ends the response.

A stream that ends with neither ``[DONE]`` nor a finish_reason was cut: ModelStreamError.
A tool call whose arguments stayed empty gets ``{}`` (what OpenAI itself sends for no arguments).

History conversion: the system prompt and SystemMessages → ``system`` messages; user text (and
images as ``image_url`` parts); assistant text + ``tool_calls`` (arguments = the stored input
JSON text; thinking is not sent); each ToolResultMessage → a ``tool`` message with
``tool_call_id``. An is_error result is sent as its text, which the model-step already starts
with ``error: ``; an error result without that prefix gets it here.
"""

from __future__ import annotations

from typing import Any, Final

import msgspec

from services.model_step.models.base import (
    FINISH_END_TURN,
    FINISH_MAX_TOKENS,
    FINISH_REFUSAL,
    FINISH_TOOL_USE,
    ModelChunk,
    ModelRequest,
    ToolDef,
)
from services.model_step.models.errors import ModelStreamError
from services.model_step.models.httpstream import HttpStreamingModel, clean
from shared.content import (
    AIMessage,
    ImageBlock,
    Message,
    RefusalBlock,
    SystemMessage,
    TextBlock,
    ToolResultMessage,
    ToolUseBlock,
    Usage,
    UserMessage,
)

FINISH_MAP: Final = {
    "stop": FINISH_END_TURN,
    "tool_calls": FINISH_TOOL_USE,
    "function_call": FINISH_TOOL_USE,
    "length": FINISH_MAX_TOKENS,
    "content_filter": FINISH_REFUSAL,
}

EMPTY_SCHEMA: Final[dict[str, Any]] = {"type": "object", "properties": {}}

# --- wire shapes of one stream chunk (unknown fields ignored; wrong types are a hard error) ------


class _Function(msgspec.Struct):
    name: str | None = None
    arguments: str | None = None


class _ToolCallDelta(msgspec.Struct):
    index: int | None = None
    id: str | None = None
    type: str | None = None
    function: _Function | None = None


class _Delta(msgspec.Struct):
    content: str | None = None
    refusal: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None
    tool_calls: list[_ToolCallDelta] | None = None


class _Choice(msgspec.Struct):
    index: int = 0
    delta: _Delta | None = None
    finish_reason: str | None = None


class _PromptDetails(msgspec.Struct):
    cached_tokens: int | None = None


class _CompletionDetails(msgspec.Struct):
    reasoning_tokens: int | None = None


class _Usage(msgspec.Struct):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    prompt_tokens_details: _PromptDetails | None = None
    completion_tokens_details: _CompletionDetails | None = None


class _Error(msgspec.Struct):
    message: str | None = None
    type: str | None = None


class _StreamChunk(msgspec.Struct):
    choices: list[_Choice] | None = None
    usage: _Usage | None = None
    error: _Error | str | None = None
    object: str | None = None  # vLLM streams {"object": "error", "message": ...}
    message: str | None = None


_decoder: Final = msgspec.json.Decoder(_StreamChunk)


def convert_usage(u: _Usage) -> Usage:
    cached = (u.prompt_tokens_details.cached_tokens if u.prompt_tokens_details else None) or 0
    reasoning = (u.completion_tokens_details.reasoning_tokens if u.completion_tokens_details else None) or 0
    prompt = u.prompt_tokens or 0
    # OpenAI counts cached tokens inside prompt_tokens; ours keeps them apart (context = sum).
    return Usage(
        input_tokens=max(0, prompt - cached),
        cache_read_tokens=max(0, cached),
        output_tokens=max(0, u.completion_tokens or 0),
        reasoning_tokens=max(0, reasoning),
    )


class _Folder:
    """Turns decoded stream chunks into ModelChunks; knows when the response is complete."""

    def __init__(self, label: str, secret: str) -> None:
        self.label = label
        self.secret = secret  # removed from any error text taken from the stream
        self.done = False
        self.finish: str | None = None
        self.usage: Usage | None = None
        self.tool_args: dict[int, int] = {}  # tool index → argument characters received
        self.tool_ids: dict[str, int] = {}  # tool call id → index
        self.last_index: int | None = None

    def complete(self) -> bool:
        return self.done or self.finish is not None

    def on_data(self, data: str) -> list[ModelChunk]:
        label = self.label
        if data.strip() == "[DONE]":
            self.done = True
            return []
        try:
            chunk = _decoder.decode(data)
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            raise ModelStreamError(clean(f"{label}: undecodable stream event: {e}", self.secret)) from None
        if chunk.error is not None or chunk.object == "error":
            err = chunk.error
            if isinstance(err, _Error):
                text = ": ".join(p for p in (err.type, err.message) if p)
            else:
                text = err or chunk.message or ""
            raise ModelStreamError(f"{label}: server error in stream: {clean(text or 'unknown error', self.secret)}")
        out: list[ModelChunk] = []
        for choice in chunk.choices or ():
            if choice.index != 0:
                continue  # we ask for one choice; anything else is not ours to fold
            delta = choice.delta
            if delta is not None:
                self._delta(delta, out)
            if choice.finish_reason:
                self.finish = choice.finish_reason
        if chunk.usage is not None:
            self.usage = convert_usage(chunk.usage)
        return out

    def _delta(self, delta: _Delta, out: list[ModelChunk]) -> None:
        reasoning = delta.reasoning_content or delta.reasoning
        if reasoning:
            out.append(ModelChunk(kind="thinking", index=0, text=reasoning))
        if delta.content:
            out.append(ModelChunk(kind="text", text=delta.content))
        if delta.refusal:
            out.append(ModelChunk(kind="refusal", text=delta.refusal))
        for call in delta.tool_calls or ():
            index = self._index(call)
            fn = call.function
            args = (fn.arguments if fn else None) or ""
            self.tool_args[index] = self.tool_args.get(index, 0) + len(args)
            name = (fn.name if fn else None) or ""
            out.append(ModelChunk(kind="tool_use", index=index, id=call.id or "", name=name, text=args))

    def _index(self, call: _ToolCallDelta) -> int:
        """The call's index; a server that omits it gets one by id (a new id = the next index)."""
        if call.index is not None:
            index = call.index
        elif call.id and call.id in self.tool_ids:
            index = self.tool_ids[call.id]
        elif call.id or self.last_index is None:
            index = max(self.tool_args, default=-1) + 1
        else:
            index = self.last_index  # an id-less continuation fragment
        if call.id:
            self.tool_ids.setdefault(call.id, index)
        self.last_index = index
        return index

    def closing(self) -> list[ModelChunk]:
        out = [ModelChunk(kind="tool_use", index=i, text="{}") for i, n in sorted(self.tool_args.items()) if n == 0]
        if self.usage is not None:
            out.append(ModelChunk(kind="usage", usage=self.usage))
        if self.finish is not None:
            out.append(ModelChunk(kind="finish", finish_reason=FINISH_MAP.get(self.finish, self.finish)))
        return out


# --- request building -----------------------------------------------------------------------------


def _user_content(message: UserMessage | SystemMessage) -> str | list[dict[str, Any]]:
    blocks = message.blocks or []
    if not any(isinstance(b, ImageBlock) for b in blocks):
        return "\n\n".join(b.text for b in blocks if isinstance(b, TextBlock | RefusalBlock))
    parts: list[dict[str, Any]] = []
    for b in blocks:
        if isinstance(b, TextBlock | RefusalBlock):
            parts.append({"type": "text", "text": b.text})
        elif isinstance(b, ImageBlock):
            url = b.url or f"data:{b.media_type};base64,{b.data or ''}"
            parts.append({"type": "image_url", "image_url": {"url": url}})
    return parts


def _assistant(message: AIMessage) -> dict[str, Any]:
    blocks = message.blocks or []
    text = "".join(b.text for b in blocks if isinstance(b, TextBlock | RefusalBlock))
    calls = [
        {
            "id": b.id,
            "type": "function",
            "function": {"name": b.name, "arguments": bytes(b.input).decode("utf-8", "replace") or "{}"},
        }
        for b in blocks
        if isinstance(b, ToolUseBlock)
    ]
    out: dict[str, Any] = {"role": "assistant", "content": text if (text or not calls) else None}
    if calls:
        out["tool_calls"] = calls
    return out


def _tool_result(message: ToolResultMessage) -> dict[str, Any]:
    text = "".join(b.text for b in (message.blocks or ()) if isinstance(b, TextBlock | RefusalBlock))
    if message.is_error and not text.startswith("error"):
        text = "error: " + text
    return {"role": "tool", "tool_call_id": message.tool_use_id, "content": text}


def convert_messages(system: str, messages: list[Message]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if system:
        out.append({"role": "system", "content": system})
    for m in messages:
        if isinstance(m, AIMessage):
            out.append(_assistant(m))
        elif isinstance(m, ToolResultMessage):
            out.append(_tool_result(m))
        elif isinstance(m, SystemMessage):
            out.append({"role": "system", "content": _user_content(m)})
        else:
            out.append({"role": "user", "content": _user_content(m)})
    return out


def convert_tools(tools: list[ToolDef]) -> list[dict[str, Any]]:
    return [
        {
            "type": "function",
            "function": {"name": t.name, "description": t.description, "parameters": t.input_schema or EMPTY_SCHEMA},
        }
        for t in tools
    ]


class OpenAICompatModel(HttpStreamingModel):
    """``openai:<model>``: streaming chat completions against any OpenAI-compatible server."""

    provider = "openai"
    incomplete = "the response completed"

    @property
    def url(self) -> str:
        return f"{self._config.base_url}/chat/completions"

    def request_body(self, request: ModelRequest) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": request.model or self._model,
            "messages": convert_messages(request.system, request.messages),
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if request.tools:
            body["tools"] = convert_tools(request.tools)
        if request.max_tokens > 0:
            body[self._config.max_tokens_field] = request.max_tokens
        return body

    def _headers(self) -> dict[str, str]:
        headers = {"content-type": "application/json", "accept": "text/event-stream"}
        if self._config.api_key:
            headers["authorization"] = f"Bearer {self._config.api_key}"
        return headers

    def _folder(self) -> _Folder:
        return _Folder(self._label, self._config.api_key)
