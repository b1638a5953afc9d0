"""Requests over NATS that outwait a responder not known yet, and the JetStream API's requests.

nats-py has no atomic-batch or direct-get-batch API, and its ``publish_async`` never resolves on
server errors: loopwire's JetStream helpers send the API's requests with :func:`js_request`.
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec
import nats.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from shared.backoff import retry
from shared.connection import request
from shared.jserrors import JetStreamUnavailableError


class ApiErrorBody(msgspec.Struct):
    """The error object of a JetStream API answer."""

    code: int = 0
    err_code: int = 0
    description: str = ""


async def is_gone(nc: NATS, subject: str, *, timeout: float) -> bool:
    """True only if nobody listens on ``subject`` (NATS "no responders": the process or its connection
    is gone). An answer, or none in time (a stopped or busy process may come back), is False."""
    try:
        await nc.request(subject, b"", timeout=timeout)
    except nats.errors.NoRespondersError:
        return True
    except (nats.errors.TimeoutError, TimeoutError):
        return False
    return False


async def request_with_grace(
    nc: NATS,
    subject: str,
    payload: bytes,
    *,
    timeout: float,
    grace: float,
    headers: Mapping[str, str] | None = None,
) -> Msg:
    """``nc.request`` that resends for up to ``grace`` seconds while NATS answers "no responders".

    No responder received the message, so resending is always safe; a service that just started (or
    a stream that just elected its leader) may not have its interest known to our server yet.
    """
    try:
        return await request(nc, subject, payload, timeout=timeout, headers=headers)
    except nats.errors.NoRespondersError:
        pass  # rare: only then the retry loop (the usual request is not wrapped in one)
    return await retry(
        lambda: request(nc, subject, payload, timeout=timeout, headers=headers),
        on=nats.errors.NoRespondersError,
        first=0.02,
        cap=0.25,
        within=min(timeout, grace),
    )


async def js_request(
    nc: NATS, subject: str, payload: bytes, headers: Mapping[str, str] | None, request_timeout: float
) -> Msg:
    """A JetStream API request; no answer (or no way to send it) is :class:`JetStreamUnavailableError`."""
    timeout = request_timeout
    try:
        # "No responders" means nothing received the message (so nothing was stored): right after a
        # stream or its leader appears, interest may not have reached our server yet.
        return await request_with_grace(nc, subject, payload, timeout=timeout, headers=headers, grace=1.0)
    except nats.errors.NoRespondersError:
        raise JetStreamUnavailableError(f"no responders on {subject} (no stream leader?)") from None
    except nats.errors.TimeoutError:
        raise JetStreamUnavailableError(f"no answer on {subject} within {timeout:g}s") from None
    except (nats.errors.ConnectionClosedError, nats.errors.ConnectionReconnectingError) as e:
        raise JetStreamUnavailableError(f"connection unavailable: {e!r}") from None
    except nats.errors.OutboundBufferLimitError as e:
        raise JetStreamUnavailableError(f"reconnect buffer full: {e!r}") from None
