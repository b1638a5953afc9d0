"""Typed errors of model calls (shared errors style). No message ever contains an API key."""

from __future__ import annotations

from shared.errors import ErrorKind, LoopwireError


class ModelError(LoopwireError):
    """A model call failed (also: an unknown model spec, a bad script). Messages are bounded."""

    kind = ErrorKind.INVALID


class ModelUnavailableError(ModelError):
    """The stream could not start (connection, 429/5xx after retries, authentication, a refused
    request): no chunk was produced. ``status`` is the last HTTP status, 0 when there was none."""

    kind = ErrorKind.UNAVAILABLE

    def __init__(self, message: str, *, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


class ModelStreamError(ModelError):
    """The stream failed after it started: the caller commits only the safe prefix."""

    kind = ErrorKind.UNAVAILABLE
