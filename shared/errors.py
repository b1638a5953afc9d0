"""Every typed error of the shared contracts, and every rule / kind string, in one place.

Services turn these into structured error replies (see ``ErrorKind``); nothing here is raised
for a condition a caller cannot act on.
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
