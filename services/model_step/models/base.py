"""The provider interface every model implements: request, streamed chunks, typed errors.

A model turns a :class:`ModelRequest` (system prompt, full history, live tools) into an async
stream of :class:`ModelChunk`. The caller folds the chunks with :class:`StreamAccumulator`
(re-exported here) and publishes each chunk as a TokenDelta before folding it.

Errors: :class:`ModelUnavailableError` means no chunk was produced (the stream could not start,
after retries); :class:`ModelStreamError` means the stream failed part-way (the caller keeps only
the safe prefix). No error text ever contains an API key.

Cancellation: every model is an async generator that holds its HTTP stream (if any) in an
``async with``; cancelling the consuming task, or ``aclose()`` on the iterator, closes it at once.
Callers that may stop early should wrap the iterator in ``contextlib.aclosing``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any, Final, Protocol

import msgspec

from services.model_step.models.config import provider_config
from services.model_step.models.errors import ModelError, ModelStreamError, ModelUnavailableError
from shared.content import Message, Usage

if TYPE_CHECKING:
    from shared.settings import Settings

# --- chunks -------------------------------------------------------------------------------------

CHUNK_KINDS: Final = ("text", "refusal", "thinking", "signature", "tool_use", "usage", "finish")

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


class ToolDef(msgspec.Struct, omit_defaults=True, forbid_unknown_fields=True, kw_only=True):
    """A tool offered to the model: its JSON Schema is passed to the provider as is."""

    name: str
    description: str = ""
    input_schema: dict[str, Any] = msgspec.field(default_factory=dict)


DEFAULT_TIMEOUT_SECONDS: Final = 120.0


class ModelRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """One model call.

    ``model`` is the provider's model name (the part after ``openai:`` / ``anthropic:``).
    ``messages`` is the full history: user messages, assistant messages with tool_use blocks and
    the tool results. ``max_tokens`` 0 = the provider's default. ``timeout_seconds`` bounds the
    connection, the wait for the response headers and every gap between received bytes (not the
    whole generation, which may legitimately be long).
    """

    model: str = ""
    system: str = ""
    messages: list[Message] = msgspec.field(default_factory=list)
    tools: list[ToolDef] = msgspec.field(default_factory=list)
    max_tokens: int = 0
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS


class Model(Protocol):
    """A streaming model. ``stream`` is an async generator: nothing happens until iterated."""

    name: str

    def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]: ...


# --- selecting a model --------------------------------------------------------------------------

MODEL_SPECS: Final = ("demo", "scripted:<path>", "openai:<model>", "anthropic:<model>")


def resolve_model(spec: str, settings: Settings | None = None, *, env: Mapping[str, str] | None = None) -> Model:
    """The model for a spec: ``demo``, ``scripted:<path>``, ``openai:<model>``, ``anthropic:<model>``.

    Provider configuration (base URL, API key) comes from ``settings`` when it carries the
    provider fields, else from ``env`` (default ``os.environ``); see ``models/config.py``.
    Raises :class:`ModelError` for an unknown spec or a bad scripted file.
    """
    # The models are imported here because they import this module.
    spec = spec.strip()
    kind, sep, rest = spec.partition(":")
    if spec == "demo":
        from services.model_step.models.demo import DemoModel
        from shared.settings import Settings

        st = settings if settings is not None else Settings.from_env(env)
        return DemoModel(chunk_delay=st.demo_chunk_delay)
    if sep and kind == "scripted" and rest:
        from services.model_step.models.scripted import ScriptedModel

        return ScriptedModel.from_file(rest)
    if sep and kind == "openai" and rest:
        from services.model_step.models.openai_compat import OpenAICompatModel

        return OpenAICompatModel(rest, provider_config("openai", settings, env))
    if sep and kind == "anthropic" and rest:
        from services.model_step.models.anthropic import AnthropicModel

        return AnthropicModel(rest, provider_config("anthropic", settings, env))
    shown = spec if len(spec) <= 80 else spec[:80] + "…"
    raise ModelError(f"unknown model {shown!r}: expected one of {', '.join(MODEL_SPECS)}")


# Re-exported so the whole interface is importable from this module; the accumulator module
# imports nothing from here at run time, so there is no import cycle.
from services.model_step.models.accumulator import StreamAccumulator  # noqa: E402

__all__ = [
    "CHUNK_KINDS",
    "DEFAULT_TIMEOUT_SECONDS",
    "FINISH_END_TURN",
    "FINISH_MAX_TOKENS",
    "FINISH_REFUSAL",
    "FINISH_STOP_SEQUENCE",
    "FINISH_TOOL_USE",
    "Model",
    "ModelChunk",
    "ModelError",
    "ModelRequest",
    "ModelStreamError",
    "ModelUnavailableError",
    "StreamAccumulator",
    "ToolDef",
    "resolve_model",
]
