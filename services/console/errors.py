"""The console's refusals: :class:`ApiError`, its HTTP status, and the JSON body it becomes."""

from __future__ import annotations

from typing import Any, Final

from starlette.responses import JSONResponse

from shared.errors import ErrorKind, LoopwireError

STATUS: Final[dict[str, int]] = {
    ErrorKind.INVALID: 400,
    ErrorKind.NOT_FOUND: 404,
    ErrorKind.CLOSED: 409,
    ErrorKind.CONFLICT: 409,
    ErrorKind.TOO_LARGE: 413,
    ErrorKind.UNAVAILABLE: 503,
    "already_answered": 409,
    "unauthorized": 401,
    "forbidden": 403,
    "internal": 500,
}


class ApiError(LoopwireError):
    """A request the console refuses; becomes ``{"ok": false, "error": {...}}`` (or an error page)."""

    # An ErrorKind or one of the console's own kinds (see STATUS): the JSON error's kind.
    kind: str  # type: ignore[assignment]

    def __init__(self, kind: str, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.extra = extra

    @property
    def status(self) -> int:
        return STATUS.get(self.kind, 400)


def invalid(field: str, message: str) -> ApiError:
    """An ``invalid`` refusal of one named field (the field is part of the JSON error)."""
    return ApiError(ErrorKind.INVALID, message, field=field)


def error_json(e: ApiError) -> JSONResponse:
    return JSONResponse({"ok": False, "error": {"kind": e.kind, "message": e.message, **e.extra}}, status_code=e.status)
