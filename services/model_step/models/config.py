"""Provider configuration (base URLs, API keys) from settings or the environment.

The variables (to be listed in ``shared.settings.ENV_VARS``):

* ``LW_OPENAI_BASE_URL`` (default ``https://api.openai.com/v1``), ``LW_OPENAI_API_KEY`` (may be
  empty for local servers), ``LW_OPENAI_MAX_TOKENS_FIELD`` (``max_tokens``, the default every
  OpenAI-compatible server accepts, or ``max_completion_tokens`` for OpenAI's reasoning models);
* ``LW_ANTHROPIC_BASE_URL`` (default ``https://api.anthropic.com``), ``LW_ANTHROPIC_API_KEY``,
  ``LW_ANTHROPIC_THINKING_BUDGET`` (extended-thinking token budget; 0 = off, the default).

A ``Settings`` object that carries the matching snake_case fields (``openai_base_url``...) wins
over the environment; until then the environment is read directly.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from services.model_step.models.errors import ModelError

DEFAULTS: Final[dict[str, str]] = {
    "LW_OPENAI_BASE_URL": "https://api.openai.com/v1",
    "LW_OPENAI_API_KEY": "",
    "LW_OPENAI_MAX_TOKENS_FIELD": "max_tokens",
    "LW_ANTHROPIC_BASE_URL": "https://api.anthropic.com",
    "LW_ANTHROPIC_API_KEY": "",
    "LW_ANTHROPIC_THINKING_BUDGET": "0",
}

ENV_VARS: Final[dict[str, str]] = {
    "LW_OPENAI_BASE_URL": "OpenAI-compatible API base URL incl. /v1 (default https://api.openai.com/v1)",
    "LW_OPENAI_API_KEY": "API key of the OpenAI-compatible server (empty: no Authorization header)",
    "LW_OPENAI_MAX_TOKENS_FIELD": "request field for max tokens: max_tokens (default) or max_completion_tokens",
    "LW_ANTHROPIC_BASE_URL": "Anthropic API base URL (default https://api.anthropic.com)",
    "LW_ANTHROPIC_API_KEY": "Anthropic API key",
    "LW_ANTHROPIC_THINKING_BUDGET": "Anthropic extended-thinking budget in tokens (default 0 = off)",
}


@dataclass(frozen=True, slots=True)
class ProviderConfig:
    """Where and how to reach one provider. ``api_key`` never appears in the repr."""

    base_url: str
    api_key: str = field(default="", repr=False)
    max_tokens_field: str = "max_tokens"  # OpenAI-compatible only
    thinking_budget: int = 0  # Anthropic only
    # Retries before the stream starts (connection errors, 408/409/429/5xx).
    max_attempts: int = 4
    backoff_seconds: float = 0.5
    backoff_cap_seconds: float = 8.0
    max_retry_after_seconds: float = 60.0


def _value(var: str, settings: object | None, env: Mapping[str, str]) -> str:
    attr = var.removeprefix("LW_").lower()
    if settings is not None and hasattr(settings, attr):
        value = str(getattr(settings, attr)).strip()
    else:
        value = env.get(var, "").strip()
    return value or DEFAULTS[var]


def provider_config(
    provider: str, settings: object | None = None, env: Mapping[str, str] | None = None
) -> ProviderConfig:
    """The configuration of ``openai`` or ``anthropic``. Raises :class:`ModelError` for bad values."""
    e = os.environ if env is None else env
    if provider == "openai":
        field_name = _value("LW_OPENAI_MAX_TOKENS_FIELD", settings, e)
        if field_name not in ("max_tokens", "max_completion_tokens"):
            raise ModelError("LW_OPENAI_MAX_TOKENS_FIELD must be max_tokens or max_completion_tokens")
        return ProviderConfig(
            base_url=_value("LW_OPENAI_BASE_URL", settings, e).rstrip("/"),
            api_key=_value("LW_OPENAI_API_KEY", settings, e),
            max_tokens_field=field_name,
        )
    if provider == "anthropic":
        raw_budget = _value("LW_ANTHROPIC_THINKING_BUDGET", settings, e)
        try:
            budget = int(raw_budget)
        except ValueError:
            budget = -1
        if budget < 0:
            raise ModelError("LW_ANTHROPIC_THINKING_BUDGET must be a non-negative integer")
        return ProviderConfig(
            base_url=_value("LW_ANTHROPIC_BASE_URL", settings, e).rstrip("/"),
            api_key=_value("LW_ANTHROPIC_API_KEY", settings, e),
            thinking_budget=budget,
        )
    raise ModelError(f"unknown provider {provider[:40]!r}")
