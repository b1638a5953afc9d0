"""The provider interface every model implements: request, streamed chunks, typed errors.

A model turns a :class:`ModelRequest` (system prompt, full history, live tools) into an async
stream of :class:`ModelChunk`. The caller folds the chunks with
:class:`~services.model_step.models.accumulator.StreamAccumulator` and publishes each chunk as a
TokenDelta before folding it. The adapters import this module; it imports none of them (the
registry of adapters, ``resolve_model``, is :mod:`services.model_step.models.registry`).

Errors: :class:`ModelUnavailableError` means no chunk was produced (the stream could not start,
after retries); :class:`ModelStreamError` means the stream failed part-way (the caller keeps only
the safe prefix). No error text ever contains an API key.

Cancellation: every model is an async generator that holds its HTTP stream (if any) in an
``async with``; cancelling the consuming task, or ``aclose()`` on the iterator, closes it at once.
Callers that may stop early should wrap the iterator in ``contextlib.aclosing``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Final, Protocol, TypeGuard

import msgspec

from services.model_step.models.errors import ModelError, ModelStreamError, ModelUnavailableError
from shared.content import Message, Usage
from shared.wiretypes import CHUNK_KINDS as DELTA_CHUNK_KINDS
from shared.wiretypes import ChunkKind

# --- chunks -------------------------------------------------------------------------------------

# The kinds published as TokenDelta (the wire vocabulary), then the two that only end a stream.
DELTA_KINDS: Final = frozenset(DELTA_CHUNK_KINDS)
CHUNK_KINDS: Final = (*DELTA_CHUNK_KINDS, "usage", "finish")


def is_delta(kind: str) -> TypeGuard[ChunkKind]:
    """A chunk of this kind is published as a TokenDelta (usage and finish are not)."""
    return kind in DELTA_KINDS


# Normalised finish reasons (adapters map the provider's value; anything else passes through raw).
FINISH_END_TURN: Final = "end_turn"
FINISH_TOOL_USE: Final = "tool_use"
FINISH_MAX_TOKENS: Final = "max_tokens"
FINISH_REFUSAL: Final = "refusal"
FINISH_STOP_SEQUENCE: Final = "stop_sequence"


class ModelChunk(msgspec.Struct, omit_defaults=True, forbid_unknown_fields=True, kw_only=True):
    """One streamed fragment of a model response.

    * ``text`` / ``refusal``: ``text`` is appended to the message's single text / refusal block.
    * ``thinking``: ``text`` is appended to thinking block ``index``.
    * ``signature``: ``text`` is the signature of thinking block ``index`` (last one wins).
    * ``tool_use``: fragment of tool use ``index``; a non-empty ``id`` / ``name`` sets them and
      ``text`` is a piece of the arguments JSON, concatenated verbatim.
    * ``usage``: ``usage`` holds the request's token counts (last one wins).
    * ``finish``: ``finish_reason`` (see the ``FINISH_*`` constants).
    """

    kind: str = "text"
    text: str = ""
    index: int = 0
    id: str = ""
    name: str = ""
    usage: Usage | None = None
    finish_reason: str = ""


# --- requests -----------------------------------------------------------------------------------


# (input_schema is a JSON Schema of any JSON values: msgspec has no JSON-value type that also makes a schema.)
class ToolDef(msgspec.Struct, omit_defaults=True, forbid_unknown_fields=True, kw_only=True):  # type: ignore[explicit-any]
    """A tool offered to the model: its JSON Schema is passed to the provider as is."""

    name: str
    description: str = ""
    input_schema: dict[str, Any] = msgspec.field(default_factory=dict)  # type: ignore[explicit-any]


DEFAULT_TIMEOUT_SECONDS: Final = 120.0


class ModelRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """One model call.

    ``model`` is the provider's model name (the part after ``openai:`` / ``anthropic:``).
    ``messages`` is the full history: user messages, assistant messages with tool_use blocks and
    the tool results. They are the loop's folded history itself, not copies (a copy per step cost
    more than the rest of building the request): an adapter reads them and never changes them.
    ``max_tokens`` 0 = the provider's default. ``timeout_seconds`` bounds the connection, the wait
    for the response headers and every gap between received bytes (not the whole generation, which
    may legitimately be long).
    """

    model: str = ""
    system: str = ""
    messages: list[Message] = msgspec.field(default_factory=list)
    tools: list[ToolDef] = msgspec.field(default_factory=list)
    max_tokens: int = 0
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS
    # Context compaction (docs/context.md): a request for a summary of the conversation, and, in a
    # step's request, how many assistant messages of the history an earlier summary stands for.
    compaction: bool = False
    summarised: int = 0


class Model(Protocol):
    """A streaming model. ``stream`` is an async generator: nothing happens until iterated.

    ``name`` is its spec as shown (``openai:gpt-4o``); ``model`` the provider's model name sent in
    the request ("" for models that are not a provider's).
    """

    name: str
    model: str

    def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]: ...


class ModelFactory(Protocol):
    """The model for a spec (``demo``, ``openai:<model>``...); raises :class:`ModelError` for a bad one."""

    def __call__(self, spec: str, /) -> Model: ...


__all__ = [
    "CHUNK_KINDS",
    "DEFAULT_TIMEOUT_SECONDS",
    "DELTA_KINDS",
    "FINISH_END_TURN",
    "FINISH_MAX_TOKENS",
    "FINISH_REFUSAL",
    "FINISH_STOP_SEQUENCE",
    "FINISH_TOOL_USE",
    "Model",
    "ModelChunk",
    "ModelError",
    "ModelFactory",
    "ModelRequest",
    "ModelStreamError",
    "ModelUnavailableError",
    "ToolDef",
    "is_delta",
]
