"""Provider configuration (base URLs, API keys) from :class:`shared.settings.Settings`.

The variables are ``LW_OPENAI_*`` and ``LW_ANTHROPIC_*`` in ``shared.settings.ENV_VARS``; without a
Settings object they are read from the environment.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from services.model_step.models.errors import ModelError
from shared.settings import Settings


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


def _settings(settings: object | None, env: Mapping[str, str]) -> Settings:
    if isinstance(settings, Settings):
        return settings
    try:
        return Settings.from_env(env)
    except ValueError as e:
        raise ModelError(f"invalid provider configuration: {e}") from None


def provider_config(
    provider: str, settings: object | None = None, env: Mapping[str, str] | None = None
) -> ProviderConfig:
    """The configuration of ``openai`` or ``anthropic``. Raises :class:`ModelError` for bad values."""
    st = _settings(settings, os.environ if env is None else env)
    if provider == "openai":
        field_name = st.openai_max_tokens_field
        if field_name not in ("max_tokens", "max_completion_tokens"):
            raise ModelError("LW_OPENAI_MAX_TOKENS_FIELD must be max_tokens or max_completion_tokens")
        return ProviderConfig(
            base_url=st.openai_base_url.rstrip("/"),
            api_key=st.openai_api_key,
            max_tokens_field=field_name,
        )
    if provider == "anthropic":
        budget = st.anthropic_thinking_budget
        if budget < 0:
            raise ModelError("LW_ANTHROPIC_THINKING_BUDGET must be a non-negative integer")
        return ProviderConfig(
            base_url=st.anthropic_base_url.rstrip("/"),
            api_key=st.anthropic_api_key,
            thinking_budget=budget,
        )
    raise ModelError(f"unknown provider {provider[:40]!r}")
