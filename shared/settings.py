"""Configuration from the environment (``LW_*``). One place lists every variable."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Final

from shared.subjects import Names

# Every variable the code reads, with its meaning (the README's configuration table mirrors this).
ENV_VARS: Final[dict[str, str]] = {
    "LW_NATS_URL": "NATS server URL(s), comma-separated (default nats://127.0.0.1:4222)",
    "LW_NATS_USER": "NATS user name (with LW_NATS_PASSWORD)",
    "LW_NATS_PASSWORD": "NATS password",
    "LW_NATS_CREDS": "path of a NATS .creds file",
    "LW_NATS_TLS_CA": "CA bundle to verify the server's TLS certificate",
    "LW_NATS_TLS_CERT": "client certificate for mutual TLS",
    "LW_NATS_TLS_KEY": "client key for mutual TLS",
    "LW_NATS_INBOX_PREFIX": "private inbox prefix for this identity (default _INBOX)",
    "LW_PREFIX": "subject prefix and stream/bucket name prefix (default lw)",
    "LW_REPLICAS": "replicas of every stream and bucket: 1 or 3 (default 1)",
    "LW_MAX_RECORD_BYTES": "largest durable record in bytes (default 1048576)",
    "LW_COMMIT_RETRY_SECONDS": "how long the committer retries an unavailable JetStream (default 10)",
    "LW_DUPLICATE_WINDOW_SECONDS": "history stream de-duplication window (default 120)",
    "LW_MODEL": "default model of new loops: demo, scripted:PATH, openai:NAME, anthropic:NAME",
    "LW_DEMO_CHUNK_DELAY": "seconds the demo model pauses between streamed chunks (default 0; loopwire demo sets it)",
    "LW_MODEL_STEP_CONCURRENCY": "loops one model-step replica drives at once (default 16)",
    "LW_LEASE_TTL_SECONDS": "loop lease TTL in seconds (default 2; a stopped replica's loops move after it)",
    "LW_RESULTS_TTL_SECONDS": "how long recorded step plans and tool results are kept (default 604800 = 7 days)",
    "LW_TOOL_ROOT": "root directory of read_file / list_dir (default the current directory)",
    "LW_HTTP_ALLOW": "comma-separated hosts http_get may reach (default loopback only)",
    "LW_TOOL_TIMEOUT_SECONDS": "default tool-call deadline in seconds (default 60)",
    "LW_HEARTBEAT_SECONDS": "tool worker heartbeat interval in seconds (default 1)",
    "LW_LOG_LEVEL": "log level of services (default INFO)",
    "LW_LOG_FORMAT": "log line format of services: text (default) or json (one JSON object per line)",
    "OTEL_EXPORTER_OTLP_ENDPOINT": "OTLP/HTTP endpoint traces are exported to (unset = tracing off), e.g. http://127.0.0.1:4318",
    "OTEL_SERVICE_NAME": "service name on exported spans (default loopwire-<service>)",
    "OTEL_TRACES_SAMPLER": "OpenTelemetry trace sampler, e.g. parentbased_traceidratio (default parentbased_always_on)",
    "LW_METRICS_PORT": "port each service serves Prometheus /metrics on (default 0 = off; loopwire up sets it)",
    "LW_CONSOLE_TOKEN": "token the operator console requires (header X-Loopwire-Token); needed off loopback",
    "LW_UVLOOP": "1 = run services on uvloop when it is installed (pip install loopwire[bench]); default 0",
    "LW_OPENAI_BASE_URL": "OpenAI-compatible API base URL incl. /v1 (default https://api.openai.com/v1)",
    "LW_OPENAI_API_KEY": "API key of the OpenAI-compatible server (empty: no Authorization header)",
    "LW_OPENAI_MAX_TOKENS_FIELD": "request field for max tokens: max_tokens (default) or max_completion_tokens",
    "LW_ANTHROPIC_BASE_URL": "Anthropic API base URL (default https://api.anthropic.com)",
    "LW_ANTHROPIC_API_KEY": "Anthropic API key",
    "LW_ANTHROPIC_THINKING_BUDGET": "Anthropic extended-thinking budget in tokens (default 0 = off)",
}


def _get(env: Mapping[str, str], name: str, default: str) -> str:
    value = env.get(name, "").strip()
    return value or default


def _int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = _get(env, name, str(default))
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {raw[:40]!r}") from None


def _float(env: Mapping[str, str], name: str, default: float) -> float:
    raw = _get(env, name, str(default))
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name} must be a number, got {raw[:40]!r}") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError(f"{name} must be a finite number, got {raw[:40]!r}")
    return value


def _log_format(raw: str) -> str:
    if raw.lower() not in ("text", "json"):
        raise ValueError(f"LW_LOG_FORMAT must be text or json, got {raw[:40]!r}")
    return raw.lower()


@dataclass(frozen=True, slots=True)
class Settings:
    nats_urls: tuple[str, ...] = ("nats://127.0.0.1:4222",)
    nats_user: str = ""
    nats_password: str = field(default="", repr=False)
    nats_creds: str = ""
    nats_tls_ca: str = ""
    nats_tls_cert: str = ""
    nats_tls_key: str = ""
    nats_inbox_prefix: str = "_INBOX"
    prefix: str = "lw"
    replicas: int = 1
    max_record_bytes: int = 1024 * 1024
    commit_retry_seconds: float = 10.0
    duplicate_window_seconds: float = 120.0
    model: str = "demo"
    demo_chunk_delay: float = 0.0
    model_step_concurrency: int = 16
    lease_ttl_seconds: float = 2.0
    # Longer than any step stays uncommitted (a step parked at a gate waits for an operator).
    results_ttl_seconds: float = 7 * 24 * 3600.0
    tool_root: str = "."
    http_allow: tuple[str, ...] = ("127.0.0.1", "localhost", "::1")
    tool_timeout_seconds: float = 60.0
    heartbeat_seconds: float = 1.0
    log_level: str = "INFO"
    log_format: str = "text"
    metrics_port: int = 0
    uvloop: bool = False
    openai_base_url: str = "https://api.openai.com/v1"
    openai_api_key: str = field(default="", repr=False)
    openai_max_tokens_field: str = "max_tokens"
    anthropic_base_url: str = "https://api.anthropic.com"
    anthropic_api_key: str = field(default="", repr=False)
    anthropic_thinking_budget: int = 0

    @property
    def names(self) -> Names:
        return Names(self.prefix)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: object) -> Settings:
        e = os.environ if env is None else env
        d = cls()
        urls = tuple(u.strip() for u in _get(e, "LW_NATS_URL", ",".join(d.nats_urls)).split(",") if u.strip())
        replicas = _int(e, "LW_REPLICAS", d.replicas)
        if replicas not in (1, 3):
            raise ValueError(f"LW_REPLICAS must be 1 or 3, got {replicas}")
        s = cls(
            nats_urls=urls,
            nats_user=_get(e, "LW_NATS_USER", ""),
            nats_password=_get(e, "LW_NATS_PASSWORD", ""),
            nats_creds=_get(e, "LW_NATS_CREDS", ""),
            nats_tls_ca=_get(e, "LW_NATS_TLS_CA", ""),
            nats_tls_cert=_get(e, "LW_NATS_TLS_CERT", ""),
            nats_tls_key=_get(e, "LW_NATS_TLS_KEY", ""),
            nats_inbox_prefix=_get(e, "LW_NATS_INBOX_PREFIX", d.nats_inbox_prefix),
            prefix=_get(e, "LW_PREFIX", d.prefix),
            replicas=replicas,
            max_record_bytes=_int(e, "LW_MAX_RECORD_BYTES", d.max_record_bytes),
            commit_retry_seconds=_float(e, "LW_COMMIT_RETRY_SECONDS", d.commit_retry_seconds),
            duplicate_window_seconds=_float(e, "LW_DUPLICATE_WINDOW_SECONDS", d.duplicate_window_seconds),
            model=_get(e, "LW_MODEL", d.model),
            demo_chunk_delay=max(0.0, _float(e, "LW_DEMO_CHUNK_DELAY", d.demo_chunk_delay)),
            model_step_concurrency=_int(e, "LW_MODEL_STEP_CONCURRENCY", d.model_step_concurrency),
            lease_ttl_seconds=max(0.5, _float(e, "LW_LEASE_TTL_SECONDS", d.lease_ttl_seconds)),
            results_ttl_seconds=max(1.0, _float(e, "LW_RESULTS_TTL_SECONDS", d.results_ttl_seconds)),
            tool_root=_get(e, "LW_TOOL_ROOT", d.tool_root),
            http_allow=tuple(
                h.strip() for h in _get(e, "LW_HTTP_ALLOW", ",".join(d.http_allow)).split(",") if h.strip()
            ),
            tool_timeout_seconds=_float(e, "LW_TOOL_TIMEOUT_SECONDS", d.tool_timeout_seconds),
            heartbeat_seconds=_float(e, "LW_HEARTBEAT_SECONDS", d.heartbeat_seconds),
            log_level=_get(e, "LW_LOG_LEVEL", d.log_level),
            log_format=_log_format(_get(e, "LW_LOG_FORMAT", d.log_format)),
            metrics_port=_int(e, "LW_METRICS_PORT", d.metrics_port),
            uvloop=_get(e, "LW_UVLOOP", "0").lower() in ("1", "true", "yes", "on"),
            openai_base_url=_get(e, "LW_OPENAI_BASE_URL", d.openai_base_url),
            openai_api_key=_get(e, "LW_OPENAI_API_KEY", ""),
            openai_max_tokens_field=_get(e, "LW_OPENAI_MAX_TOKENS_FIELD", d.openai_max_tokens_field),
            anthropic_base_url=_get(e, "LW_ANTHROPIC_BASE_URL", d.anthropic_base_url),
            anthropic_api_key=_get(e, "LW_ANTHROPIC_API_KEY", ""),
            anthropic_thinking_budget=_int(e, "LW_ANTHROPIC_THINKING_BUDGET", 0),
        )
        if overrides:
            known = {f.name for f in fields(cls)}
            bad = set(overrides) - known
            if bad:
                raise TypeError(f"unknown settings: {sorted(bad)}")
            values = {f.name: getattr(s, f.name) for f in fields(cls)}
            values.update(overrides)
            s = cls(**values)
        return s
