"""Configuration from the environment (``LW_*``). One place declares every variable.

Each setting is declared once, on its :class:`Settings` field (:func:`setting`: variable, default,
meaning, parser); :meth:`Settings.from_env`, :data:`ENV_VARS` (``--help``) and the README's
configuration table (:func:`markdown_table`, checked by a test) are derived from the declarations.
Variables read by a library or by one command rather than by every service are declared in
:data:`OTHER_VARS`, for the documentation only.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Final, TypeVar

from shared.subjects import Names

T = TypeVar("T")

_DECLARATION: Final = "lw_setting"

Parser = Callable[[str, str], Any]
"""``parse(variable name, stripped non-empty value)`` → the setting's value; ValueError names the variable."""


@dataclass(frozen=True, slots=True)
class EnvVar:
    """One environment variable: its name, meaning and default as documented, and its parser."""

    name: str
    meaning: str
    default: str  # as shown in the documentation ("" = no default)
    parse: Parser | None = None  # None: read elsewhere (documented only)

    @property
    def description(self) -> str:
        return f"{self.meaning} (default {self.default})" if self.default else self.meaning


# --- parsers ------------------------------------------------------------------------------------


# Streams per kind a deployment may have: each is a Raft group (and a leader) on the cluster.
MAX_SHARDS: Final = 64


def split_list(raw: str) -> tuple[str, ...]:
    """A comma-separated list (NATS URLs, hosts, tool names): items stripped, empty ones dropped."""
    return tuple(item.strip() for item in raw.split(",") if item.strip())


def parse_text(name: str, raw: str) -> str:
    return raw


def parse_list(name: str, raw: str) -> tuple[str, ...]:
    return split_list(raw)


# The URL schemes nats-py connects with (a URL without one is nats://). Any other is refused by
# name here: nats-py would take ``http://host`` for a host name and report a DNS failure.
NATS_SCHEMES: Final = ("nats", "tls", "ws", "wss")


def check_nats_urls(name: str, urls: tuple[str, ...]) -> tuple[str, ...]:
    for url in urls:
        scheme = url.split("://", 1)[0] if "://" in url else "nats"
        if scheme.lower() not in NATS_SCHEMES:
            raise ValueError(
                f"{name}: {url[:80]!r} is not a NATS URL (scheme {scheme}://; NATS URLs are "
                f"{', '.join(s + '://' for s in NATS_SCHEMES)}HOST:PORT)"
            )
    return urls


def parse_nats_urls(name: str, raw: str) -> tuple[str, ...]:
    return check_nats_urls(name, split_list(raw))


def parse_int(name: str, raw: str) -> int:
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {raw[:40]!r}") from None


def parse_float(name: str, raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name} must be a number, got {raw[:40]!r}") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError(f"{name} must be a finite number, got {raw[:40]!r}")
    return value


def parse_flag(name: str, raw: str) -> bool:
    return raw.lower() in ("1", "true", "yes", "on")


def at_least(lowest: float) -> Parser:
    """A number, raised to ``lowest`` when smaller."""
    return lambda name, raw: max(lowest, parse_float(name, raw))


def one_of(*allowed: int) -> Parser:
    """An integer among ``allowed``."""

    def parse(name: str, raw: str) -> int:
        value = parse_int(name, raw)
        if value not in allowed:
            raise ValueError(f"{name} must be {' or '.join(map(str, allowed))}, got {value}")
        return value

    return parse


def int_in(lowest: int, highest: int) -> Parser:
    """An integer from ``lowest`` to ``highest``."""

    def parse(name: str, raw: str) -> int:
        value = parse_int(name, raw)
        if not lowest <= value <= highest:
            raise ValueError(f"{name} must be from {lowest} to {highest}, got {value}")
        return value

    return parse


def word(*allowed: str) -> Parser:
    """A word among ``allowed`` (any case, kept lower case)."""

    def parse(name: str, raw: str) -> str:
        if raw.lower() not in allowed:
            raise ValueError(f"{name} must be {' or '.join(allowed)}, got {raw[:40]!r}")
        return raw.lower()

    return parse


def _shown(default: object) -> str:
    if isinstance(default, bool):
        return "1" if default else "0"
    if isinstance(default, tuple):
        return ",".join(default)
    if isinstance(default, float):
        return f"{default:g}"
    return str(default)


def _parser_of(default: object) -> Parser:
    if isinstance(default, bool):
        return parse_flag
    if isinstance(default, int):
        return parse_int
    if isinstance(default, float):
        return parse_float
    if isinstance(default, tuple):
        return parse_list
    return parse_text


def setting(
    name: str, default: T, meaning: str, *, parse: Parser | None = None, shown: str | None = None, secret: bool = False
) -> T:
    """Declare a :class:`Settings` field read from the variable ``name``.

    ``parse`` defaults to the default's type (str, int, finite float, flag, comma-separated list);
    ``shown`` is the default as documented (derived from ``default`` when None, nothing when "");
    a ``secret`` is kept out of ``repr``. An unset or blank variable leaves the default.
    """
    var = EnvVar(name, meaning, _shown(default) if shown is None else shown, parse or _parser_of(default))
    value: T = field(default=default, repr=not secret, metadata={_DECLARATION: var})
    return value


@dataclass(frozen=True, slots=True)
class Settings:
    nats_urls: tuple[str, ...] = setting(
        "LW_NATS_URL", ("nats://127.0.0.1:4222",), "NATS server URL(s), comma-separated", parse=parse_nats_urls
    )
    nats_user: str = setting("LW_NATS_USER", "", "NATS user name (with LW_NATS_PASSWORD)")
    nats_password: str = setting("LW_NATS_PASSWORD", "", "NATS password", secret=True)
    nats_creds: str = setting("LW_NATS_CREDS", "", "path of a NATS .creds file")
    nats_tls_ca: str = setting("LW_NATS_TLS_CA", "", "CA bundle to verify the server's TLS certificate")
    nats_tls_cert: str = setting("LW_NATS_TLS_CERT", "", "client certificate for mutual TLS")
    nats_tls_key: str = setting("LW_NATS_TLS_KEY", "", "client key for mutual TLS")
    nats_inbox_prefix: str = setting("LW_NATS_INBOX_PREFIX", "_INBOX", "private inbox prefix for this identity")
    nats_monitor_urls: tuple[str, ...] = setting(
        "LW_NATS_MONITOR_URL",
        (),
        "monitoring URL(s) of the NATS servers (http://host:8222), comma-separated: each is checked at start-up"
        " for sync_interval: always (docs/reliability.md)",
    )
    nats_in_order: bool = setting(
        "LW_NATS_IN_ORDER",
        False,
        "1 = connect to the NATS URLs in the order listed (put this machine's node first) instead of at random",
    )
    connect_seconds: float = setting(
        "LW_CONNECT_SECONDS", 60.0, "how long a starting service tries to reach NATS before it exits 1"
    )
    prefix: str = setting("LW_PREFIX", "lw", "subject prefix and stream/bucket name prefix")
    replicas: int = setting("LW_REPLICAS", 1, "replicas of every stream and bucket: 1 or 3", parse=one_of(1, 3))
    # 0: not set; every process reads the count from the deployment (shared.layout).
    shards: int = setting(
        "LW_SHARDS",
        0,
        "history/work streams and lease/result buckets of a new deployment (others read theirs; docs/scaling.md)",
        parse=int_in(1, MAX_SHARDS),
        shown="the deployment's; 1 for a new one",
    )
    max_record_bytes: int = setting("LW_MAX_RECORD_BYTES", 1024 * 1024, "largest durable record in bytes")
    commit_retry_seconds: float = setting(
        "LW_COMMIT_RETRY_SECONDS", 10.0, "how long the committer retries an unavailable JetStream"
    )
    duplicate_window_seconds: float = setting(
        "LW_DUPLICATE_WINDOW_SECONDS", 120.0, "history stream de-duplication window"
    )
    model: str = setting(
        "LW_MODEL", "demo", "default model of new loops: demo, scripted:PATH, openai:NAME, anthropic:NAME"
    )
    demo_chunk_delay: float = setting(
        "LW_DEMO_CHUNK_DELAY",
        0.0,
        "seconds the demo model pauses between streamed chunks",
        parse=at_least(0.0),
        shown="0; loopwire demo sets it",
    )
    model_step_concurrency: int = setting(
        "LW_MODEL_STEP_CONCURRENCY",
        16,
        "loops one model-step replica drives at once (a loop waiting on long tool calls gives its slot back)",
    )
    model_step_waiting: int = setting(
        "LW_MODEL_STEP_WAITING",
        256,
        "loops one model-step replica lets wait on long tool calls (e.g. sub-agents) outside its drive slots",
        parse=int_in(0, 1_000_000),
    )
    model_step_folds: int = setting(
        "LW_MODEL_STEP_FOLDS",
        4096,
        "loops whose fold a model-step replica keeps between drives (least recently driven dropped first)",
        parse=int_in(1, 10_000_000),
    )
    shards_served: tuple[int, ...] = setting(
        "LW_SHARDS_SERVED",
        (),
        "model-step: comma-separated shard numbers whose loops it drives, each below LW_SHARDS (checked at start)",
        parse=lambda name, raw: tuple(int_in(0, MAX_SHARDS - 1)(name, k) for k in split_list(raw)),
        shown="all shards",
    )
    lease_ttl_seconds: float = setting(
        "LW_LEASE_TTL_SECONDS",
        2.0,
        "loop lease TTL in seconds",
        parse=at_least(0.5),
        shown="2; a stopped replica's loops move after it",
    )
    # Longer than any step stays uncommitted (a step parked at a gate waits for an operator).
    results_ttl_seconds: float = setting(
        "LW_RESULTS_TTL_SECONDS",
        7 * 24 * 3600.0,
        "how long recorded step plans and tool results are kept",
        parse=at_least(1.0),
        shown="604800 = 7 days",
    )
    tool_root: str = setting(
        "LW_TOOL_ROOT", ".", "root directory of read_file / list_dir", shown="the current directory"
    )
    http_allow: tuple[str, ...] = setting(
        "LW_HTTP_ALLOW",
        ("127.0.0.1", "localhost", "::1"),
        "comma-separated hosts http_get may reach",
        shown="loopback only",
    )
    tool_timeout_seconds: float = setting("LW_TOOL_TIMEOUT_SECONDS", 60.0, "default tool-call deadline in seconds")
    heartbeat_seconds: float = setting("LW_HEARTBEAT_SECONDS", 1.0, "tool worker heartbeat interval in seconds")
    agent_max_depth: int = setting(
        "LW_AGENT_MAX_DEPTH",
        8,
        "agent workers: how deep sub-agents may nest (a child of a child ...); deeper calls are refused",
        parse=int_in(1, 64),
    )
    log_level: str = setting("LW_LOG_LEVEL", "INFO", "log level of services")
    log_format: str = setting(
        "LW_LOG_FORMAT",
        "text",
        "log line format of services: text or json (one JSON object per line)",
        parse=word("text", "json"),
    )
    metrics_port: int = setting(
        "LW_METRICS_PORT",
        0,
        "port each service serves Prometheus /metrics on",
        shown="0 = off; loopwire up sets it",
    )
    uvloop: bool = setting(
        "LW_UVLOOP",
        True,
        "1 = run services on uvloop where it is installed (a dependency on Linux and macOS); 0 = asyncio's own loop",
    )
    openai_base_url: str = setting(
        "LW_OPENAI_BASE_URL", "https://api.openai.com/v1", "OpenAI-compatible API base URL incl. /v1"
    )
    openai_api_key: str = setting(
        "LW_OPENAI_API_KEY",
        "",
        "API key of the OpenAI-compatible server (empty: no Authorization header)",
        secret=True,
    )
    openai_max_tokens_field: str = setting(
        "LW_OPENAI_MAX_TOKENS_FIELD",
        "max_tokens",
        "request field for max tokens: max_tokens or max_completion_tokens",
    )
    anthropic_base_url: str = setting("LW_ANTHROPIC_BASE_URL", "https://api.anthropic.com", "Anthropic API base URL")
    anthropic_api_key: str = setting("LW_ANTHROPIC_API_KEY", "", "Anthropic API key", secret=True)
    anthropic_thinking_budget: int = setting(
        "LW_ANTHROPIC_THINKING_BUDGET", 0, "Anthropic extended-thinking budget in tokens", shown="0 = off"
    )

    @property
    def names(self) -> Names:
        return Names(self.prefix, self.shards or 1)

    @property
    def leader_reads(self) -> bool:
        """Whether a read that must see every acknowledged record asks the stream leader first
        (``shared.replay.load``'s ``consistent``). With one replica a Direct Get is answered by
        the only server, which holds every record it acknowledged: no leader read is needed."""
        return self.replicas > 1

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: object) -> Settings:
        """Every declared variable of ``env`` (default ``os.environ``), then ``overrides`` by field name."""
        e = os.environ if env is None else env
        known = {f.name for f in fields(cls)}
        bad = set(overrides) - known
        if bad:
            raise TypeError(f"unknown settings: {sorted(bad)}")
        values: dict[str, object] = {}
        for attr, var in declarations().items():
            raw = e.get(var.name, "").strip()
            if raw and var.parse is not None:
                values[attr] = var.parse(var.name, raw)
        if "nats_urls" in overrides:  # given on a command line
            check_nats_urls("--nats-url", tuple(overrides["nats_urls"]))  # type: ignore[arg-type]
        values.update(overrides)
        return cls(**values)  # type: ignore[arg-type]


def declarations() -> dict[str, EnvVar]:
    """Each :class:`Settings` field's variable, by field name, in declaration order."""
    return {f.name: f.metadata[_DECLARATION] for f in fields(Settings)}


# Read by a library or by one command, not by every service: declared here for the documentation.
OTHER_VARS: Final[tuple[EnvVar, ...]] = (
    EnvVar(
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTLP/HTTP endpoint traces are exported to, e.g. http://127.0.0.1:4318",
        "unset = tracing off",
    ),
    EnvVar("OTEL_SERVICE_NAME", "service name on exported spans", "loopwire-<service>"),
    EnvVar(
        "OTEL_TRACES_SAMPLER",
        "OpenTelemetry trace sampler, e.g. parentbased_traceidratio",
        "parentbased_always_on",
    ),
    EnvVar(
        "LW_NATS_SYNC",
        "nats-servers started by the up and demo commands, the tests and the bench: always = fsync every JetStream"
        " write before its ack; default = nats-server's 2-minute interval (faster; a power loss can lose"
        " acknowledged writes)",
        "always",
    ),
    EnvVar(
        "LW_CONSOLE_TOKEN",
        "token the operator console requires (header X-Loopwire-Token); needed off loopback",
        "",
    ),
)


def all_vars() -> tuple[EnvVar, ...]:
    """Every variable the code reads: the settings, then the others."""
    return (*declarations().values(), *OTHER_VARS)


# Every variable the code reads, with its meaning and default (``--help`` lists them).
ENV_VARS: Final[dict[str, str]] = {v.name: v.description for v in all_vars()}


def markdown_table() -> str:
    """The README's configuration table."""
    rows = "".join(f"| `{v.name}` | {v.meaning} | {v.default or 'unset'} |\n" for v in all_vars())
    return "| variable | meaning | default |\n|---|---|---|\n" + rows
