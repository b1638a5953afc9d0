"""Selecting a model: the one module that knows every adapter (each adapter imports only the base).

An adapter is imported when first asked for, so a process loads only the providers it uses (the
HTTP ones bring the HTTP client).
"""

from __future__ import annotations

from collections.abc import Mapping

from services.model_step.models.base import Model, ModelError
from services.model_step.models.config import provider_config
from shared.modelspec import MODEL_SPECS
from shared.settings import Settings


def resolve_model(spec: str, settings: Settings | None = None, *, env: Mapping[str, str] | None = None) -> Model:
    """The model for a spec: ``demo``, ``scripted:<path>``, ``openai:<model>``, ``anthropic:<model>``.

    Provider configuration (base URL, API key) comes from ``settings`` when it carries the
    provider fields, else from ``env`` (default ``os.environ``); see ``models/config.py``.
    Raises :class:`ModelError` for an unknown spec or a bad scripted file.
    """
    spec = spec.strip()
    kind, sep, rest = spec.partition(":")
    if spec == "demo":
        from services.model_step.models.demo import DemoModel

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


__all__ = ["MODEL_SPECS", "resolve_model"]
