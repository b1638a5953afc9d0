"""resolve_model specs, provider configuration, the SSE decoder and the API-key hygiene of reprs."""

from __future__ import annotations

import pytest

from services.model_step.models import resolve_model
from services.model_step.models.anthropic import AnthropicModel
from services.model_step.models.base import ModelError
from services.model_step.models.config import ProviderConfig, provider_config
from services.model_step.models.httpstream import clean, error_message, retry_after_seconds
from services.model_step.models.openai_compat import OpenAICompatModel
from services.model_step.models.sse import SSEDecodeError, SSEDecoder, SSEEvent
from shared.settings import Settings

KEY = "sk-unit-SECRET-0123456789"


@pytest.mark.parametrize("spec", ["", "gpt-4o", "openai:", "anthropic:", "scripted:", "demo:x", "llama:7b"])
def test_unknown_specs_are_clear_errors(spec: str) -> None:
    with pytest.raises(ModelError, match="unknown model"):
        resolve_model(spec)


def test_openai_and_anthropic_from_env_never_show_the_key() -> None:
    env = {"LW_OPENAI_API_KEY": KEY, "LW_OPENAI_BASE_URL": "http://127.0.0.1:9/v1/", "LW_ANTHROPIC_API_KEY": KEY}
    openai = resolve_model("openai:gpt-4o-mini", env=env)
    assert isinstance(openai, OpenAICompatModel) and openai.name == "openai:gpt-4o-mini"
    assert openai.url == "http://127.0.0.1:9/v1/chat/completions"
    anthropic = resolve_model("anthropic:claude-sonnet-4-20250514", env=env)
    assert isinstance(anthropic, AnthropicModel) and anthropic.url == "https://api.anthropic.com/v1/messages"
    for obj in (openai, anthropic, provider_config("openai", env=env), provider_config("anthropic", env=env)):
        assert KEY not in repr(obj) and KEY not in str(obj)


def test_defaults_and_bad_values() -> None:
    cfg = provider_config("openai", env={})
    assert cfg.base_url == "https://api.openai.com/v1" and cfg.api_key == "" and cfg.max_tokens_field == "max_tokens"
    assert provider_config("anthropic", env={}).thinking_budget == 0
    with pytest.raises(ModelError, match="LW_OPENAI_MAX_TOKENS_FIELD"):
        provider_config("openai", env={"LW_OPENAI_MAX_TOKENS_FIELD": "tokens"})
    with pytest.raises(ModelError, match="LW_ANTHROPIC_THINKING_BUDGET"):
        provider_config("anthropic", env={"LW_ANTHROPIC_THINKING_BUDGET": "lots"})


def test_settings_fields_win_over_the_environment() -> None:
    settings = Settings(openai_base_url="http://settings.invalid/v1", openai_api_key="from-settings")
    cfg = provider_config("openai", settings, env={"LW_OPENAI_BASE_URL": "http://env.invalid/v1"})
    assert (cfg.base_url, cfg.api_key) == ("http://settings.invalid/v1", "from-settings")


def test_clean_removes_the_secret_and_bounds_the_text() -> None:
    text = clean(f"bad key {KEY}\n\x00 and more " + "x" * 1000, KEY)
    assert KEY not in text and "\n" not in text and "\x00" not in text and len(text) <= 300


def test_retry_after_parsing() -> None:
    assert retry_after_seconds({"retry-after": "2"}) == 2.0
    assert retry_after_seconds({"retry-after-ms": "250", "retry-after": "9"}) == 0.25
    assert retry_after_seconds({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}) == 0.0  # in the past
    assert retry_after_seconds({"retry-after": "soon"}) is None
    assert retry_after_seconds({}) is None


def test_error_message_shapes() -> None:
    assert (
        error_message(b'{"error": {"message": "bad", "type": "invalid_request_error"}}') == "invalid_request_error: bad"
    )
    assert error_message(b'{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}') == (
        "overloaded_error: Overloaded"
    )
    assert error_message(b'{"object":"error","message":"vllm says no"}') == "vllm says no"
    assert error_message(b"plain text") == "plain text"


def test_provider_config_repr_hides_key() -> None:
    assert KEY not in repr(ProviderConfig(base_url="http://x", api_key=KEY))


# --- SSE framing --------------------------------------------------------------------------------------


def test_sse_frames_split_anywhere_and_every_line_ending() -> None:
    raw = b"event: a\r\ndata: 1\r\n\r\n: comment\n\ndata: x\ndata: y\n\nevent: b\rdata: {}\r\r\n"
    for size in (1, 2, 3, 7, len(raw)):
        d = SSEDecoder()
        events: list[SSEEvent] = []
        for i in range(0, len(raw), size):
            events += d.feed(raw[i : i + size])
        assert events == [SSEEvent("a", "1"), SSEEvent("message", "x\ny"), SSEEvent("b", "{}")], size
        assert not d.pending


def test_sse_pending_and_invalid_utf8() -> None:
    d = SSEDecoder()
    assert d.feed(b'data: {"a"') == [] and d.pending
    with pytest.raises(SSEDecodeError, match="UTF-8"):
        SSEDecoder().feed(b"data: \xff\xfe\n\n")
    assert SSEDecoder().feed(b"\xef\xbb\xbfdata: bom\n\n") == [SSEEvent("message", "bom")]
