"""Connecting to NATS with production-minded options.

``connect`` applies them (server list, fast pings, unlimited reconnects, private inbox prefix,
credentials, TLS); ``broker_reachable`` asks whether a server takes a connection at all.
"""

from __future__ import annotations

import contextlib
import logging
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final

import anyio
from nats.aio.client import Client as NATS

from shared.connection import Connection
from shared.errors import NatsUnreachableError
from shared.settings import Settings

log = logging.getLogger("loopwire.bus")

ERROR_LOG_INTERVAL: Final = 30.0


async def connect(settings: Settings, *, name: str = "loopwire", **options: Any) -> NATS:
    """Connect with ``settings``; extra keyword options go to ``Client.connect`` unchanged."""
    opts: dict[str, Any] = {
        "servers": list(settings.nats_urls),
        "name": name,
        "connect_timeout": 2,
        "reconnect_time_wait": 0.5,
        "max_reconnect_attempts": -1,
        "ping_interval": 10,
        "max_outstanding_pings": 3,
        "inbox_prefix": settings.nats_inbox_prefix,
    }
    if settings.nats_in_order:
        # Services of one machine meet on its node: a request between them takes no route hop.
        opts["dont_randomize"] = True
    if settings.nats_user:
        opts["user"] = settings.nats_user
        opts["password"] = settings.nats_password
    if settings.nats_creds:
        opts["user_credentials"] = settings.nats_creds
    if settings.nats_tls_ca or settings.nats_tls_cert:
        ctx = ssl.create_default_context(cafile=settings.nats_tls_ca or None)
        if settings.nats_tls_cert:
            ctx.load_cert_chain(settings.nats_tls_cert, settings.nats_tls_key or None)
        opts["tls"] = ctx
    opts.setdefault("error_cb", _error_log(name))
    opts.update(options)
    nc = Connection()
    try:
        # nats-py retries a first connection forever: a service with a wrong URL would wait unseen.
        with anyio.fail_after(settings.connect_seconds):
            await nc.connect(**opts)
    except TimeoutError:
        with contextlib.suppress(Exception):
            await nc.close()
        where = ",".join(settings.nats_urls)
        raise NatsUnreachableError(
            f"no NATS server at {where} took the connection within {settings.connect_seconds:g} s (LW_CONNECT_SECONDS)"
        ) from None
    return nc


@dataclass
class _Repeats:
    text: str = ""
    logged_at: float = 0.0
    unshown: int = 0


def _error_log(name: str) -> Callable[[Exception], Awaitable[None]]:
    """A connection's errors as one log line each, no traceback, and while they repeat (a server
    down: every reconnect attempt fails the same way) one line per :data:`ERROR_LOG_INTERVAL` with
    the count of those not shown. nats-py's own logs each with its traceback, many a second."""
    last = _Repeats()

    async def on_error(e: Exception) -> None:
        text = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
        now = time.monotonic()
        if text == last.text and now - last.logged_at < ERROR_LOG_INTERVAL:
            last.unshown += 1
            return
        more = f" ({last.unshown} more like it)" if last.unshown and text == last.text else ""
        log.warning("NATS connection %s: %s%s", name, text, more)
        last.text, last.logged_at, last.unshown = text, now, 0

    return on_error


async def broker_reachable(settings: Settings, within: float = 1.0) -> bool:
    """Whether a NATS server of ``settings`` takes a new connection and answers a PING, each within
    ``within`` seconds (a server that is stopped accepts the TCP connection but never says hello)."""

    async def quiet(_: Exception) -> None:
        pass

    try:
        with anyio.fail_after(2 * within + 1):
            nc = await connect(
                settings,
                name="loopwire-probe",
                connect_timeout=within,
                allow_reconnect=False,
                max_reconnect_attempts=0,
                error_cb=quiet,
            )
            try:
                await nc.flush(timeout=within)  # type: ignore[arg-type]  # a float works; the stub says int
            finally:
                with contextlib.suppress(Exception):
                    await nc.close()
    except Exception:
        return False
    return True
