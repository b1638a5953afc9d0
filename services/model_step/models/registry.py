"""Selecting a model: the one module that knows every adapter (each adapter imports only the base).

An adapter is imported when first asked for, so a process loads only the providers it uses (the
HTTP ones bring the HTTP client).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import PurePath
from typing import Final

from services.model_step.models.base import Model, ModelError
from services.model_step.models.config import provider_config
from shared.settings import Settings

MODEL_SPECS: Final = ("demo", "scripted:<path>", "openai:<model>", "anthropic:<model>")


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


def spec_problem(spec: str) -> str:
    """What is wrong with a model spec's form ("" when nothing): checked where a loop is started, so
    a typo is an error there, not a turn that fails later. Whether the provider answers is not."""
    kind, sep, rest = spec.strip().partition(":")
    if spec.strip() == "demo" or (sep and kind in ("scripted", "openai", "anthropic") and rest.strip()):
        return ""
    shown = spec if len(spec) <= 80 else spec[:80] + "…"
    return f"unknown model {shown!r}: expected one of {', '.join(MODEL_SPECS)}"


def model_id(spec: str) -> str:
    """How spans, metrics and logs name the model of ``spec``: the spec itself, but a scripted model by
    its file's name (``scripted:s.json``): a path says where a test kept its script, not which
    model answered, and would give every temporary directory a metric series of its own."""
    kind, sep, rest = spec.strip().partition(":")
    if sep and kind == "scripted" and rest:
        return f"scripted:{PurePath(rest).name}"
    return spec


__all__ = ["MODEL_SPECS", "model_id", "resolve_model", "spec_problem"]
