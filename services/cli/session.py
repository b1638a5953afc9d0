"""Connecting a command to NATS: one connection per command, its failures as one-line :class:`CliError` reasons."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Final

import nats.errors
import nats.js.errors
from nats.aio.client import Client as NATS

from services.cli.errors import CliError
from services.cli.render import clip
from services.lifecycle import close_quietly, raise_single
from shared import layout
from shared.connect import connect
from shared.errors import LoopwireError
from shared.jserrors import JetStreamError, JetStreamUnavailableError
from shared.protocol import RemoteError
from shared.settings import Settings

CONNECT_ATTEMPTS: Final = 2
NO_DEPLOYMENT_HINT: Final = "`loopwire up` starts a deployment and prints the URL to set as LW_NATS_URL"


def _reason(e: BaseException | None) -> str:
    if e is None:
        return "no server answered"
    if isinstance(e, ConnectionRefusedError):
        return "connection refused"
    if isinstance(e, nats.errors.AuthorizationError) or "authorization" in str(e).lower():
        return "authorization violation: check LW_NATS_USER / LW_NATS_PASSWORD / LW_NATS_CREDS"
    if isinstance(e, TimeoutError | nats.errors.TimeoutError):
        return "timed out"
    text = str(e) or type(e).__name__
    return clip(text, 120)


async def open_nats(settings: Settings, *, name: str = "loopwire-cli", follow: bool = False) -> NATS:
    """Connect, or raise ``CliError("cannot connect to NATS at <url> (<why>)")`` within a few seconds.

    ``follow``: a command that follows (``tail``) keeps reconnecting once connected, however long
    the server is away; a first connection still fails fast."""
    seen: list[BaseException] = []

    async def on_error(e: Exception) -> None:
        seen.append(e)

    try:
        nc = await connect(
            settings,
            name=name,
            max_reconnect_attempts=CONNECT_ATTEMPTS - 1,
            reconnect_time_wait=0.2,
            error_cb=on_error,
        )
        if follow:
            # nats-py reads these at each reconnect: from now on it never gives up.
            nc.options["max_reconnect_attempts"] = -1
            nc.options["reconnect_time_wait"] = 0.5
        return nc
    except (OSError, nats.errors.Error, TimeoutError) as e:
        cause = next((x for x in reversed(seen) if not isinstance(x, nats.errors.NoServersError)), e)
        where = ",".join(settings.nats_urls)
        raise CliError(f"cannot connect to NATS at {where} ({_reason(cause)}); {NO_DEPLOYMENT_HINT}") from None


async def deployment_settings(settings: Settings) -> Settings:
    """``settings`` with the deployment's shard count (:mod:`shared.layout`), read on a connection
    of its own before the command runs; a disagreeing ``LW_SHARDS`` is the command's one-line error.
    Without a server, a deployment or JetStream the settings stay: the command says what is wrong
    (its own arguments first, then its session)."""
    try:
        nc = await open_nats(settings, name="loopwire-cli-layout")
    except CliError:
        return settings
    try:
        found = await layout.read(nc, settings.prefix)
    except (nats.errors.Error, nats.js.errors.Error):
        return settings
    else:
        try:
            return layout.check(settings, found)
        except LoopwireError as e:
            raise CliError(str(e)) from None
    finally:
        await close_quietly(nc, within=2)


@contextlib.asynccontextmanager
async def session(settings: Settings, *, follow: bool = False) -> AsyncIterator[NATS]:
    """A connection for one command; remote and JetStream failures become :class:`CliError`.
    ``follow``: see :func:`open_nats`."""
    nc = await open_nats(settings, follow=follow)
    try:
        try:
            await _require_deployment(nc, settings)
            yield nc
        except BaseExceptionGroup as group:
            raise_single(group)  # one failure of a command's tasks reads as itself
    except CliError:
        raise  # already one line; the LoopwireError clause below would wrap it again
    except RemoteError as e:
        raise CliError(f"{e.body.kind}: {e.body.message}") from None
    except (JetStreamUnavailableError, JetStreamError) as e:
        raise CliError(f"cannot read from JetStream: {e}") from None
    except LoopwireError as e:
        raise CliError(str(e)) from None
    except nats.errors.Error as e:
        raise CliError(f"NATS: {_reason(e)}") from None
    finally:
        await close_quietly(nc, within=2)


async def _require_deployment(nc: NATS, settings: Settings) -> None:
    """A clear error when the server holds no loopwire deployment (no history stream, or no JetStream
    at all), instead of "no loops yet" or a failed read. Anything else (say, no permission to ask)
    leaves the command to go on and report what it meets."""
    stream = settings.names.history_stream_of(0)  # every deployment has shard 0's
    where = ",".join(settings.nats_urls)
    try:
        await nc.jetstream(timeout=5).stream_info(stream)
    except nats.js.errors.NotFoundError:
        why = f"no stream {stream}; another LW_PREFIX?"
    except (nats.js.errors.ServiceUnavailableError, nats.errors.NoRespondersError):
        why = "JetStream is not enabled on that server"
    except (nats.errors.Error, TimeoutError):
        return
    else:
        return
    raise CliError(f"no loopwire deployment at {where} ({why}); {NO_DEPLOYMENT_HINT}")
