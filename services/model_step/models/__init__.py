"""Model providers for the model-step: the streaming interface and its implementations.

``resolve_model(spec, settings)`` picks one: ``demo`` (rule-based, not an LLM), ``scripted:<path>``
(replays a JSON script), ``openai:<model>`` (any OpenAI-compatible chat-completions server),
``anthropic:<model>`` (the Anthropic Messages API). See docs/models.md.
"""

from services.model_step.models.accumulator import StreamAccumulator
from services.model_step.models.base import (
    CHUNK_KINDS,
    FINISH_END_TURN,
    FINISH_MAX_TOKENS,
    FINISH_REFUSAL,
    FINISH_STOP_SEQUENCE,
    FINISH_TOOL_USE,
    Model,
    ModelChunk,
    ModelError,
    ModelRequest,
    ModelStreamError,
    ModelUnavailableError,
    ToolDef,
)
from services.model_step.models.registry import MODEL_SPECS, resolve_model

__all__ = [
    "CHUNK_KINDS",
    "FINISH_END_TURN",
    "FINISH_MAX_TOKENS",
    "FINISH_REFUSAL",
    "FINISH_STOP_SEQUENCE",
    "FINISH_TOOL_USE",
    "MODEL_SPECS",
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
