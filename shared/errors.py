"""Every typed error of loopwire, under one base, and every rule / kind string, in one place.

Services turn these into structured error replies (see ``ErrorKind``); nothing here is raised
for a condition a caller cannot act on. A class that needs its module's types (a wire body, a
server's error codes) is defined there and still derives from :class:`LoopwireError`; every other
one lives here and its old module imports it back. Subclasses of ``ValueError`` / ``RuntimeError``
keep that base because callers catch them as such. The whole tree (a unit test keeps it complete):

    LoopwireError
    ├── InvalidEventError                 an event broke a validation rule
    ├── CodecError                        a durable record could not be encoded or decoded
    │   ├── EphemeralNotPersistableError
    │   ├── UnknownEventTypeError
    │   ├── UnsupportedSchemaError
    │   ├── MalformedRecordError
    │   └── RecordTooLargeError
    ├── UsageOverflowError
    ├── StrictJSONError                   (also ValueError) not strict JSON
    ├── ForkPointError                    (also ValueError) not a valid fork point
    ├── MalformedStampError               (also ValueError) a record's digest-chain headers are malformed
    ├── JetStreamError                    shared.jserrors: the JetStream API answered with an error
    ├── JetStreamUnavailableError         shared.jserrors: no answer from JetStream
    ├── PayloadTooLargeError              shared.jserrors: over the server's max_payload
    ├── IncompatibleConfigError           shared.jserrors: a stream or bucket exists, configured otherwise
    ├── StreamSetupError                  shared.jserrors: JetStream refused to create a stream or bucket
    ├── NoDeploymentError                 the NATS server holds no loopwire deployment to serve
    ├── ConfigError                       (also ValueError) settings that do not fit together
    ├── ShardCountError                   shared.layout: LW_SHARDS disagrees with the deployment's count
    ├── NatsUnreachableError              no NATS server took a service's connection in time
    ├── RemoteError                       shared.protocol: an error reply of the committer
    │   ├── InvalidRequestError
    │   ├── ConflictError
    │   ├── UnavailableError
    │   ├── TooLargeError
    │   ├── NotFoundError
    │   └── ClosedError
    ├── WireError                         shared.protocol: raised by request handling, becomes an error reply
    │   └── EventIdTaken                  services.committer.appender: an event id stored with other content
    ├── NatsServerError                   (also RuntimeError) the nats-server process
    ├── ServiceStartError                 (also RuntimeError) a service process did not become ready
    ├── CliError                          the CLI's one-line error
    ├── ToolError                         raised by a tool: an error result for the model
    ├── CallFailed                        services.tools.sdk: raised by a tool: an error reply instead of a result
    ├── McpStartError                     an MCP server could not be started
    ├── McpToolRejected                   (also ValueError) one MCP tool cannot be served
    ├── SSEDecodeError                    (also ValueError) a model's byte stream is not SSE
    ├── ModelError                        services.model_step.models.errors: a model call failed
    │   ├── ModelUnavailableError
    │   ├── ModelStreamError
    │   └── ScriptError                   services.model_step.models.scripted
    ├── LeaseLost                         services.model_step.lease: the loop's lease is gone
    ├── StepAbandoned                     the history moved under a step
    ├── CommitRefused                     the committer refused a step
    └── ApiError                          services.console.errors: a request the console refuses
"""

from __future__ import annotations

from enum import StrEnum


class Rule(StrEnum):
    """The rule part of an ``InvalidEventError`` (binding, design section 4)."""

    REQUIRED = "must be set"
    MUST_BE_ZERO = "must be zero"
    UNKNOWN_TYPE = "is not a known event type"
    INVALID = "is invalid"


class ErrorKind(StrEnum):
    """``error.kind`` of a structured error reply over NATS."""

    INVALID = "invalid"
    CONFLICT = "conflict"
    UNAVAILABLE = "unavailable"
    TOO_LARGE = "too_large"
    NOT_FOUND = "not_found"
    CLOSED = "closed"


class LoopwireError(Exception):
    """Base of every error loopwire raises on purpose."""

    kind: ErrorKind = ErrorKind.INVALID


class InvalidEventError(LoopwireError):
    """An event broke a validation rule. ``field`` is the JSON field name."""

    def __init__(self, event: str, field: str, rule: str) -> None:
        self.event = event
        self.field = field
        self.rule = rule
        super().__init__(f"invalid {event}: {field} {rule}")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, InvalidEventError):
            return NotImplemented
        return (self.event, self.field, self.rule) == (other.event, other.field, other.rule)

    def __hash__(self) -> int:
        return hash((self.event, self.field, self.rule))

    def __reduce__(self) -> tuple[type[InvalidEventError], tuple[str, str, str]]:
        return (InvalidEventError, (self.event, self.field, self.rule))


class CodecError(LoopwireError):
    """A durable record could not be encoded or decoded."""


class EphemeralNotPersistableError(CodecError):
    """Ephemeral events are never persisted."""

    def __init__(self, type_name: str) -> None:
        self.type_name = type_name
        super().__init__(f"{type_name} is ephemeral and cannot be persisted")


class UnknownEventTypeError(CodecError):
    def __init__(self, type_name: str) -> None:
        self.type_name = type_name
        super().__init__(f"unknown event type: {type_name!r}")


class UnsupportedSchemaError(CodecError):
    def __init__(self, version: object) -> None:
        self.version = version
        super().__init__(f"unsupported envelope version: {version!r} (this build reads v1)")


class MalformedRecordError(CodecError):
    """Not UTF-8, not JSON, duplicate keys, wrong shape, unknown fields."""


class RecordTooLargeError(CodecError):
    kind = ErrorKind.TOO_LARGE

    def __init__(self, size: int, limit: int) -> None:
        self.size = size
        self.limit = limit
        super().__init__(f"record of {size} bytes exceeds the {limit}-byte limit")


class UsageOverflowError(LoopwireError):
    def __init__(self, field: str) -> None:
        self.field = field
        super().__init__(f"usage counter {field} overflows uint64")


class StrictJSONError(LoopwireError, ValueError):
    """Why a document is not strict JSON."""


class ForkPointError(LoopwireError, ValueError):
    """The requested fork point is not a record boundary that leaves a consistent loop."""


class MalformedStampError(LoopwireError, ValueError):
    """A stored record's digest-chain headers are present but some are missing or malformed."""


class NatsServerError(LoopwireError, RuntimeError):
    """The nats-server binary is missing, or its process did not start or stop cleanly."""


class NatsUnreachableError(LoopwireError):
    """No NATS server took a starting service's connection within ``LW_CONNECT_SECONDS``."""


class ConfigError(LoopwireError, ValueError):
    """Settings whose values do not fit together (found when a service starts)."""


class NoDeploymentError(LoopwireError):
    """The NATS server holds no loopwire deployment (no history stream under ``LW_PREFIX``, or no
    JetStream): a service that serves one but does not create it (a tool worker, the console) refuses."""


class ServiceStartError(LoopwireError, RuntimeError):
    """A service process exited or did not become ready in time."""


class CliError(LoopwireError):
    """A failure to report as one line (``error: <message>``), exit status 1."""


class ToolError(LoopwireError):
    """Raise from a tool to return ``error: <message>`` to the model (an expected failure)."""


class McpStartError(LoopwireError):
    """The MCP server could not be started or did not complete the handshake."""


class McpToolRejected(LoopwireError, ValueError):
    """One listed MCP tool cannot be served (the others still are)."""

    def __init__(self, mcp_name: str, reason: str) -> None:
        super().__init__(f"MCP tool {mcp_name!r} not registered: {reason}")
        self.mcp_name = mcp_name
        self.reason = reason


class SSEDecodeError(LoopwireError, ValueError):
    """The byte stream is not well-formed SSE."""


class StepAbandoned(LoopwireError):
    """The history moved under us (another writer, an interrupt): drop the in-flight step."""


class CommitRefused(LoopwireError):
    """The committer refused a group as invalid or too large: a bug or an oversized step."""
