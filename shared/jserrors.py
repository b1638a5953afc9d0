"""JetStream's error codes that loopwire acts on, and loopwire's errors for JetStream and its objects."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from shared.errors import ErrorKind, LoopwireError

# err_codes (nats-server errors.json) the helpers and the committer act on.
ERR_WRONG_LAST_SEQUENCE: Final = 10071  # "wrong last sequence: N" (N = actual last)
ERR_WRONG_LAST_SEQUENCE_INFLIGHT: Final = 10164  # constant form: a conditional write is in flight (R3)
ERR_EXPECTED_SEQ_UNAVAILABLE: Final = 10163
ERR_DUPLICATE_IN_PROCESS: Final = 10158
ERR_BATCH_DUPLICATE_MSG_ID: Final = 10201
ERR_BATCH_INCOMPLETE: Final = 10176
ERR_BATCH_TOO_MANY_INFLIGHT: Final = 10210
ERR_JS_UNAVAILABLE: Final = 10008
ERR_MAX_MSGS_PER_SUBJECT: Final = 10077  # the store refused the message (a discard-new limit): never retried
ERR_MSG_TOO_LARGE: Final = 10054
ERR_NO_SUITABLE_PEERS: Final = 10005  # "no suitable peers for placement": a cluster still forming
ERR_INSUFFICIENT_RESOURCES: Final = 10023
ERR_NO_MESSAGE: Final = 10037
ERR_STREAM_NOT_FOUND: Final = 10059
ERR_STREAM_NAME_IN_USE: Final = 10058
ERR_REPLICAS_NOT_CLUSTERED: Final = 10074  # "replicas > 1 not supported in non-clustered mode"

# Conditions that go away by themselves (leader elections, in-flight proposals): retry as-is.
RETRYABLE_ERR_CODES: Final = frozenset(
    {
        ERR_WRONG_LAST_SEQUENCE_INFLIGHT,
        ERR_EXPECTED_SEQ_UNAVAILABLE,
        ERR_DUPLICATE_IN_PROCESS,
        ERR_BATCH_INCOMPLETE,
        ERR_BATCH_TOO_MANY_INFLIGHT,
        ERR_JS_UNAVAILABLE,
    }
)


class JetStreamError(LoopwireError):
    """The JetStream API answered with an error object (``err_code`` is the server's)."""

    kind = ErrorKind.UNAVAILABLE

    def __init__(self, code: int, err_code: int, description: str) -> None:
        self.code = code
        self.err_code = err_code
        self.description = description
        super().__init__(f"JetStream error {err_code} ({code}): {description}")

    @property
    def retryable(self) -> bool:
        return self.err_code in RETRYABLE_ERR_CODES or (self.code == 503 and self.err_code != ERR_MAX_MSGS_PER_SUBJECT)


class JetStreamUnavailableError(LoopwireError):
    """No answer: no responders (no stream leader), a timeout, or the connection is down."""

    kind = ErrorKind.UNAVAILABLE


class PayloadTooLargeError(LoopwireError):
    """A message (headers included) would exceed the server's ``max_payload``."""

    kind = ErrorKind.TOO_LARGE

    def __init__(self, size: int, limit: int) -> None:
        self.size = size
        self.limit = limit
        super().__init__(f"message of {size} bytes (with headers) exceeds the server's max_payload of {limit}")


class IncompatibleConfigError(LoopwireError):
    """An existing stream or bucket exists with a configuration loopwire cannot use."""

    def __init__(self, name: str, differences: Mapping[str, tuple[object, object]]) -> None:
        self.name = name
        self.differences = dict(differences)
        diff = "; ".join(f"{k}: want {w!r}, have {h!r}" for k, (w, h) in sorted(self.differences.items()))
        super().__init__(f"{name} exists with an incompatible configuration ({diff})")


class StreamSetupError(LoopwireError):
    """JetStream refused to create a stream or bucket for a reason that waiting does not change."""

    def __init__(self, name: str, err_code: int, description: str, replicas: int = 1) -> None:
        self.name = name
        self.err_code = err_code
        hint = ""
        if err_code == ERR_REPLICAS_NOT_CLUSTERED:
            hint = f"; LW_REPLICAS={replicas} needs a JetStream cluster of at least {replicas} nodes"
        super().__init__(f"JetStream refused to create {name} (error {err_code}: {description}){hint}")
