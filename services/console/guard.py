"""The checks on every ``/api`` request, around its handler: the token, the host, and for
state-changing requests an origin that is this console's own. Typed errors become JSON; a stack
trace never leaves the console."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Final

import nats.errors
from starlette.requests import Request
from starlette.responses import Response

from services.console import rules
from services.console.errors import ApiError, error_json
from shared.errors import ErrorKind, LoopwireError
from shared.jserrors import JetStreamError, JetStreamUnavailableError
from shared.protocol import RemoteError

TOKEN_HEADER: Final = "x-loopwire-token"

Handler = Callable[[Request], Awaitable[Response]]


def check_request(request: Request, token: str, *, mutating: bool) -> None:
    """Refuse a request without the console's token, to a foreign host, or (``mutating``) from another site."""
    given = request.headers.get(TOKEN_HEADER)
    if not rules.token_ok(token, given):
        why = "missing" if not given else "incorrect"
        raise ApiError("unauthorized", f"the console token is {why} (header X-Loopwire-Token)")
    if not rules.host_allowed(request.headers.get("host"), token):
        raise ApiError("forbidden", "this console (no token) answers only to 127.0.0.1 or localhost")
    if mutating and not rules.same_origin(
        request.headers.get("origin"), request.headers.get("host"), request.headers.get("sec-fetch-site")
    ):
        raise ApiError("forbidden", "cross-site requests may not change anything")


def guarded(handler: Handler, token: str, *, mutating: bool) -> Handler:
    """``handler`` behind :func:`check_request`, its typed errors answered as JSON errors."""

    async def wrapped(request: Request) -> Response:
        try:
            check_request(request, token, mutating=mutating)
            return await handler(request)
        except ApiError as e:
            return error_json(e)
        except RemoteError as e:
            return error_json(ApiError(e.body.kind, e.body.message))
        except (JetStreamUnavailableError, JetStreamError, nats.errors.Error) as e:
            return error_json(ApiError(ErrorKind.UNAVAILABLE, f"NATS: {e}"))
        except LoopwireError as e:
            return error_json(ApiError(e.kind.value, str(e)))

    return wrapped
