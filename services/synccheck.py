"""The start-up check that the NATS servers sync every JetStream write to disk before acknowledging it.

nats-server acknowledges a JetStream write once the stream's replicas hold it in memory and their
page cache; with its default ``sync_interval`` (2 minutes) a power loss of several servers at once
loses writes that were acknowledged — committed steps (docs/reliability.md). ``sync_interval:
always`` closes that gap. A client cannot see the setting over its NATS connection: the monitoring
endpoint's ``/varz`` shows it (``jetstream.config.sync_always``), so each service reads the
``/varz`` of every server listed in ``LW_NATS_MONITOR_URL`` and logs one warning line for each one
that does not sync always (or could not be asked). Servers not listed are not checked.
"""

from __future__ import annotations

import json
import logging
import urllib.request
from typing import Any, Final

import anyio

from shared.settings import Settings

log = logging.getLogger("loopwire.synccheck")

VARZ_TIMEOUT_SECONDS: Final = 3.0


def varz(monitor_url: str, timeout: float = VARZ_TIMEOUT_SECONDS) -> Any:
    with urllib.request.urlopen(f"{monitor_url.rstrip('/')}/varz", timeout=timeout) as r:
        return json.loads(r.read())


def sync_warning(monitor_url: str, info: Any) -> str | None:
    """The warning for one server's ``/varz`` (None: it syncs always, or stores nothing)."""
    if not isinstance(info, dict):
        return f"nats-server at {monitor_url}: /varz is not a JSON object; its sync_interval is unknown"
    config = (info.get("jetstream") or {}).get("config")
    if not config:
        return None  # no JetStream on this server: it stores nothing
    if config.get("sync_always") is True:
        return None
    interval = config.get("sync_interval")
    shown = f"{interval / 1e9:g}s" if isinstance(interval, int | float) else "unknown"
    return (
        f"nats-server {info.get('server_name', '?')} ({monitor_url}) does not sync JetStream writes before"
        f" acknowledging them (sync_interval {shown}): a power loss of several servers at once can lose"
        " committed steps; set jetstream { sync_interval: always } (docs/reliability.md)"
    )


def check_one(monitor_url: str) -> str | None:
    try:
        info = varz(monitor_url)
    except (OSError, ValueError) as e:
        return f"nats-server at {monitor_url}: cannot read /varz ({e}); its sync_interval is unchecked"
    return sync_warning(monitor_url, info)


async def warn_unless_synced(settings: Settings) -> list[str]:
    """Check every server of ``LW_NATS_MONITOR_URL`` at once; log (and return) one warning per server
    that does not sync always or could not be asked."""
    urls = settings.nats_monitor_urls
    if not urls:
        log.info("NATS servers' sync_interval not checked: LW_NATS_MONITOR_URL is not set")
        return []
    found: dict[str, str | None] = {}

    async def one(url: str) -> None:
        found[url] = await anyio.to_thread.run_sync(check_one, url, abandon_on_cancel=True)

    async with anyio.create_task_group() as tg:
        for url in urls:
            tg.start_soon(one, url)
    warnings = [w for url in urls if (w := found.get(url)) is not None]
    for w in warnings:
        log.warning("%s", w)
    return warnings
