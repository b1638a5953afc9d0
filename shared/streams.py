"""The streams and buckets loopwire needs: their configuration and idempotent creation.

``ensure_*`` create streams and buckets idempotently and report an existing object whose
configuration is incompatible instead of silently using it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Sequence
from typing import Final

import nats.errors
import nats.js.errors
from nats.js import api
from nats.js.client import JetStreamContext
from nats.js.kv import KeyValue

from shared import shards
from shared.backoff import Backoff
from shared.errors import NoDeploymentError
from shared.jserrors import (
    ERR_INSUFFICIENT_RESOURCES,
    ERR_JS_UNAVAILABLE,
    ERR_NO_SUITABLE_PEERS,
    ERR_STREAM_NAME_IN_USE,
    IncompatibleConfigError,
    JetStreamUnavailableError,
    StreamSetupError,
)
from shared.layout import ShardCountError
from shared.settings import Settings
from shared.shards import META_GREW, META_SHARDS
from shared.subjects import kv_stream

log = logging.getLogger("loopwire.bus")

# An entry of the tools registry that nobody refreshes for this long disappears.
TOOLS_TTL_SECONDS: Final = 10.0


def history_stream_config(settings: Settings, shard: int = 0) -> api.StreamConfig:
    n = settings.names
    return api.StreamConfig(
        name=n.history_stream_of(shard),
        description="loopwire loop histories (written only by the committer)",
        subjects=[n.hist_all_of(shard)],
        retention=api.RetentionPolicy.LIMITS,
        storage=api.StorageType.FILE,
        num_replicas=settings.replicas,
        allow_direct=True,
        allow_atomic=True,
        deny_delete=True,
        deny_purge=True,
        duplicate_window=max(120.0, settings.duplicate_window_seconds),
    )


def work_stream_config(settings: Settings, shard: int = 0) -> api.StreamConfig:
    n = settings.names
    return api.StreamConfig(
        name=n.work_stream_of(shard),
        description="loopwire work signals: at most one pending per loop",
        subjects=[n.work_all_of(shard)],
        retention=api.RetentionPolicy.WORK_QUEUE,
        storage=api.StorageType.FILE,
        num_replicas=settings.replicas,
        max_msgs_per_subject=1,
        # A new signal replaces the pending one (not "discard new"; see docs/architecture.md):
        # a signal sent while a replica still holds the loop's item is never refused, so a replica that
        # dies between acking its item and looking again cannot strand the loop.
        discard=api.DiscardPolicy.OLD,
    )


def _value(v: object) -> object:
    return v.value if hasattr(v, "value") else v


def _differences(
    want: api.StreamConfig, have: api.StreamConfig, keys: Sequence[str]
) -> dict[str, tuple[object, object]]:
    """The settings of ``keys`` where ``have`` cannot stand in for ``want`` (None/False/0 are alike)."""
    out: dict[str, tuple[object, object]] = {}
    for k in keys:
        w, h = _value(getattr(want, k)), _value(getattr(have, k))
        if k == "subjects":
            same = set(w or []) <= set(h or [])  # type: ignore[call-overload]
        elif k == "duplicate_window":
            same = float(h or 0) + 1e-6 >= float(w or 0)  # type: ignore[arg-type]
        elif k == "num_replicas":
            same = int(h or 1) == int(w or 1)  # type: ignore[call-overload]
        else:
            same = (w or None) == (h or None)
        if not same:
            out[k] = (w, h)
    return out


_HISTORY_KEYS: Final = (
    "subjects",
    "retention",
    "storage",
    "num_replicas",
    "allow_direct",
    "allow_atomic",
    "deny_delete",
    "deny_purge",
    "duplicate_window",
)
_WORK_KEYS: Final = (
    "subjects",
    "retention",
    "num_replicas",
    "max_msgs_per_subject",
    "discard",
    "discard_new_per_subject",
)


async def _stream_info(js: JetStreamContext, name: str) -> api.StreamInfo | None:
    try:
        return await js.stream_info(name)
    except nats.js.errors.NotFoundError:
        return None


async def _with_leader(js: JetStreamContext, info: api.StreamInfo, wait_seconds: float = 10.0) -> api.StreamInfo:
    """Wait until a replicated stream has elected its leader: until then a publish finds no responders."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_seconds
    while (info.config.num_replicas or 1) > 1 and not (info.cluster and info.cluster.leader):
        if loop.time() > deadline:
            break  # publishers retry "no stream leader" themselves; this wait is only a courtesy
        await asyncio.sleep(0.05)
        fresh = await _stream_info(js, info.config.name or "")
        if fresh is not None:
            info = fresh
    return info


async def ensure_stream(js: JetStreamContext, config: api.StreamConfig, keys: Sequence[str]) -> api.StreamInfo:
    """Create ``config`` (and wait for its leader) or verify that the existing stream matches it on ``keys``."""
    assert config.name is not None
    info = await _stream_info(js, config.name)
    if info is None:
        try:
            return await _with_leader(js, await js.add_stream(config))
        except nats.js.errors.APIError as e:
            # Lost a creation race (another service created it first): verify what it created.
            if e.err_code != ERR_STREAM_NAME_IN_USE:
                raise _refusal(e, config.name, config.num_replicas or 1) from None
            info = await _stream_info(js, config.name)
            if info is None:
                raise
    diff = _differences(config, info.config, keys)
    if diff:
        raise IncompatibleConfigError(config.name, diff)
    return info


async def ensure_history_stream(js: JetStreamContext, settings: Settings, shard: int = 0) -> api.StreamInfo:
    config = history_stream_config(settings, shard)
    if shard == 0:
        config.metadata = {META_SHARDS: str(settings.names.shards)}
    info = await ensure_stream(js, config, _HISTORY_KEYS)
    if shard == 0:
        _check_layout(settings, info)
    return info


def _check_layout(settings: Settings, info: api.StreamInfo) -> None:
    """The shard count shard 0's stream recorded must be ``settings``' (read from it at connect,
    :mod:`shared.layout`): another one differs only when another process created the deployment
    with another count meanwhile. Growing is :func:`grow`'s alone."""
    meta = info.config.metadata or {}
    recorded = int(meta.get(META_SHARDS, "1"))
    if recorded != settings.names.shards:
        raise ShardCountError(settings.names.shards, recorded, settings.prefix)
    shards.grew(settings.names, meta.get(META_GREW) == "1")


async def grow(js: JetStreamContext, settings: Settings, to: int) -> api.StreamInfo:
    """Grow a one-shard deployment to ``to`` shards: record the count (and, when shard 0 holds loops,
    that it grew: they stay there) in shard 0's stream, then create the new shards' streams and
    buckets. The caller checked that no service runs (``loopwire shards grow``)."""
    info = await js.stream_info(settings.names.history_stream_of(0))
    meta = dict(info.config.metadata or {})
    recorded = int(meta.get(META_SHARDS, "1"))
    if recorded == to:
        return info
    if recorded != 1:
        raise ShardCountError(to, recorded, settings.prefix)
    meta[META_SHARDS] = str(to)
    if info.state.messages:
        meta[META_GREW] = "1"
    info.config.metadata = meta
    info = await js.update_stream(info.config)
    log.warning("the deployment grew from one shard to %d (its loops so far stay in shard 0)", to)
    await ensure_all(js, dataclasses.replace(settings, shards=to))
    return info


async def ensure_work_stream(js: JetStreamContext, settings: Settings, shard: int = 0) -> api.StreamInfo:
    return await ensure_stream(js, work_stream_config(settings, shard), _WORK_KEYS)


async def ensure_kv(
    js: JetStreamContext, bucket: str, *, replicas: int = 1, ttl: float, history: int = 1, set_ttl: bool = False
) -> KeyValue:
    """Create or verify a KV bucket. ``ttl``: an entry not written again for this long disappears.

    Per-message TTLs (``Nats-TTL``, nats-py ``msg_ttl=``) are allowed too; they may only shorten it.
    ``set_ttl``: an existing bucket with another TTL gets this one (for buckets of short-lived
    entries whose TTL is a setting, such as the loop leases) instead of being refused.
    """
    name = kv_stream(bucket)
    info = await _stream_info(js, name)
    want = api.StreamConfig(name=name, num_replicas=replicas, max_msgs_per_subject=history, max_age=ttl)
    if info is None:
        try:
            return await js.create_key_value(bucket=bucket, history=history, ttl=ttl, replicas=replicas)
        except nats.js.errors.APIError as e:
            if e.err_code != ERR_STREAM_NAME_IN_USE:
                raise _refusal(e, name, replicas) from None
            info = await _stream_info(js, name)
            if info is None:
                raise
    diff = _differences(want, info.config, ("num_replicas", "max_msgs_per_subject"))
    if abs(float(info.config.max_age or 0) - ttl) > 1e-3:
        if set_ttl and not diff:
            before, info.config.max_age = info.config.max_age, ttl
            # The server requires a duplicate window no longer than the TTL.
            info.config.duplicate_window = min(float(info.config.duplicate_window or ttl), ttl)
            await js.update_stream(info.config)
            log.warning("%s: TTL changed from %ss to %ss", name, before, ttl)
        else:
            diff["max_age"] = (ttl, info.config.max_age)
    if diff:
        raise IncompatibleConfigError(name, diff)
    return await js.key_value(bucket)


def _refusal(e: nats.js.errors.APIError, name: str, replicas: int) -> Exception:
    """A creation error as it goes on: as itself while it may go away (retried by the callers), else a
    :class:`StreamSetupError` that names the stream and the reason (a service's one-line refusal)."""
    if is_transient_setup_error(e):
        return e
    return StreamSetupError(name, e.err_code or 0, e.description or type(e).__name__, replicas)


# Stream creation errors that mean "not yet": the cluster is still forming (too few peers have
# joined to place the replicas) or JetStream is electing its leaders.
PLACEMENT_RETRY_ERR_CODES: Final = frozenset({ERR_NO_SUITABLE_PEERS, ERR_INSUFFICIENT_RESOURCES, ERR_JS_UNAVAILABLE})


def is_transient_setup_error(e: BaseException) -> bool:
    """True for an error that creating a stream or bucket may stop getting within seconds."""
    if isinstance(e, nats.js.errors.ServiceUnavailableError | nats.errors.TimeoutError | nats.errors.NoRespondersError):
        return True
    if isinstance(e, TimeoutError):
        return True
    return isinstance(e, nats.js.errors.APIError) and e.err_code in PLACEMENT_RETRY_ERR_CODES


def describe_api_error(e: BaseException) -> str:
    """nats-py's API errors print as ``BadRequestError()``: name the server's code and text."""
    if isinstance(e, nats.js.errors.APIError) and e.err_code:
        return f"JetStream error {e.err_code}: {e.description}"
    return repr(e)


async def ensure_shard(js: JetStreamContext, settings: Settings, shard: int) -> None:
    """One shard's history and work streams and its leases and results buckets."""
    n = settings.names
    if shard:
        await ensure_history_stream(js, settings, shard)
    await ensure_work_stream(js, settings, shard)
    r = settings.replicas
    await ensure_kv(js, n.leases_bucket_of(shard), replicas=r, ttl=settings.lease_ttl_seconds, set_ttl=True)
    await ensure_kv(js, n.results_bucket_of(shard), replicas=r, ttl=settings.results_ttl_seconds)


async def ensure_all(js: JetStreamContext, settings: Settings, *, wait_seconds: float = 30.0) -> None:
    """Create or verify every stream and bucket.

    A cluster that is still forming refuses replicated streams (10005, no suitable peers) and a
    busy one answers with timeouts while it elects leaders: both are retried for ``wait_seconds``,
    then :class:`JetStreamUnavailableError` says what was refused.
    """
    n = settings.names
    backoff = Backoff(0.1, 1.0, within=wait_seconds)
    while True:
        try:
            await ensure_history_stream(js, settings)  # first: it checks the shard count
            await ensure_kv(js, n.tools_bucket, replicas=settings.replicas, ttl=TOOLS_TTL_SECONDS)
            for k in n.shard_ids:
                await ensure_shard(js, settings, k)
            return
        except Exception as e:
            if not is_transient_setup_error(e):
                raise
            why = describe_api_error(e)
            if not backoff.fits():
                raise JetStreamUnavailableError(
                    f"could not create the streams and buckets ({settings.replicas} replicas) within "
                    f"{wait_seconds:g}s: {why}; a JetStream cluster needs as many JetStream nodes as the replicas"
                ) from e
            log.warning("streams not ready yet (%s); retrying", why)
            await backoff.sleep()


# How long a service that serves a deployment but does not create it waits for one to appear: its
# committer may be starting at the same moment (``loopwire up`` starts every process at once). A
# service told to give up on NATS sooner (LW_CONNECT_SECONDS) gives up on the deployment as soon.
DEPLOYMENT_WAIT_SECONDS: Final = 10.0


async def require_deployment(js: JetStreamContext, settings: Settings, *, wait_seconds: float | None = None) -> None:
    """Check, creating nothing, that the server holds the deployment ``settings`` describe.

    For the services that serve a deployment without creating it (tool workers, MCP bridges,
    sub-agents, the console): shard 0's history stream must exist (waited for ``wait_seconds``,
    by default DEPLOYMENT_WAIT_SECONDS or LW_CONNECT_SECONDS when shorter),
    else :class:`NoDeploymentError`; its shard count and replicas must be ``LW_SHARDS`` and
    ``LW_REPLICAS``, else :class:`IncompatibleConfigError` (a one-shard deployment may grow: its
    committer grows it). A server that cannot tell (a timeout, no permission to ask) is let be:
    what the service meets next says what is wrong.
    """
    name = settings.names.history_stream_of(0)
    where = ",".join(settings.nats_urls)
    if wait_seconds is None:
        wait_seconds = min(DEPLOYMENT_WAIT_SECONDS, settings.connect_seconds)
    backoff = Backoff(0.2, 0.5, within=wait_seconds)
    while True:
        try:
            info = await js.stream_info(name)
            break
        except nats.js.errors.NotFoundError:
            why = f"no stream {name}; another LW_PREFIX?"
        except (nats.js.errors.ServiceUnavailableError, nats.errors.NoRespondersError):
            why = "JetStream is not enabled on that server"
        except (nats.errors.Error, TimeoutError):
            return
        if not backoff.fits():
            raise NoDeploymentError(f"no loopwire deployment at {where} ({why}); start its committer first")
        await backoff.sleep()
    recorded = int(dict(info.config.metadata or {}).get(META_SHARDS, "1"))
    diff: dict[str, tuple[object, object]] = {}
    if recorded not in (1, settings.shards):
        diff["shards (LW_SHARDS)"] = (settings.shards, recorded)
    if (info.config.num_replicas or 1) != settings.replicas:
        diff["num_replicas (LW_REPLICAS)"] = (settings.replicas, info.config.num_replicas or 1)
    if diff:
        raise IncompatibleConfigError(name, diff)
