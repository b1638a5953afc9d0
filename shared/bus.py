"""Connecting to NATS and the JetStream objects loopwire needs.

``connect`` applies production-minded options (server list, fast pings, unlimited reconnects,
private inbox prefix, credentials, TLS). ``ensure_*`` create streams and buckets idempotently and
report an existing object whose configuration is incompatible instead of silently using it.
"""

from __future__ import annotations

import ssl
from typing import Any

import nats
from nats.aio.client import Client as NATS

from shared.settings import Settings


async def connect(settings: Settings, *, name: str = "loopwire", **options: Any) -> NATS:
    """Connect with ``settings``; extra keyword options go to ``nats.connect`` unchanged."""
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
    opts.update(options)
    return await nats.connect(**opts)
