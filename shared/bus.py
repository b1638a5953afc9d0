"""Connecting to NATS and the JetStream objects and raw operations loopwire needs.

``connect`` applies production-minded options (server list, fast pings, unlimited reconnects,
private inbox prefix, credentials, TLS). ``ensure_*`` create streams and buckets idempotently and
report an existing object whose configuration is incompatible instead of silently using it.

The raw helpers talk to the JetStream API directly (nats-py has no atomic-batch or direct-get-batch
API, and its ``publish_async`` never resolves on server errors):

* :func:`js_publish` - one publish with explicit headers → :class:`PubAck` or a typed error;
* :func:`publish_batch` - one atomic batch (ADR-50) with raw headers, all-or-nothing;
* :func:`get_msg` - a **leader** read (``STREAM.MSG.GET``): read-after-write on R3 too;
* :func:`direct_get_batch` - a batch of a subject's messages from any replica, no consumer.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import ssl
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import anyio
import msgspec
import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import api
from nats.js.client import JetStreamContext
from nats.js.kv import KeyValue

from shared.backoff import Backoff, retry
from shared.connection import Connection, request, request_many
from shared.errors import ErrorKind, LoopwireError, NatsUnreachableError
from shared.settings import Settings
from shared.subjects import (
    H_BATCH_COMMIT,
    H_BATCH_ID,
    H_BATCH_SEQ,
    H_LAST_SEQUENCE,
    H_MSG_ID,
    H_NUM_PENDING,
    H_SEQUENCE,
    H_STATUS,
    H_SUBJECT,
    Names,
    js_api,
    kv_stream,
)

log = logging.getLogger("loopwire.bus")

ERROR_LOG_INTERVAL: Final = 30.0

# An entry of the tools registry that nobody refreshes for this long disappears.
TOOLS_TTL_SECONDS: Final = 10.0
# Server limit on messages per atomic batch (nats-server default ``max_msgs``).
MAX_BATCH: Final = 1000
# Room reserved for headers when checking a message against the server's max_payload.
_HEADER_SLACK: Final = 16

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


# --- errors -----------------------------------------------------------------------------------


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


# --- connection -------------------------------------------------------------------------------


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


# --- streams and buckets ----------------------------------------------------------------------


def history_stream_config(settings: Settings) -> api.StreamConfig:
    n = settings.names
    return api.StreamConfig(
        name=n.history_stream,
        description="loopwire loop histories (written only by the committer)",
        subjects=[n.hist_all],
        retention=api.RetentionPolicy.LIMITS,
        storage=api.StorageType.FILE,
        num_replicas=settings.replicas,
        allow_direct=True,
        allow_atomic=True,
        deny_delete=True,
        deny_purge=True,
        duplicate_window=max(120.0, settings.duplicate_window_seconds),
    )


def work_stream_config(settings: Settings) -> api.StreamConfig:
    n = settings.names
    return api.StreamConfig(
        name=n.work_stream,
        description="loopwire work signals: at most one pending per loop",
        subjects=[n.work_all],
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
        except nats.js.errors.BadRequestError as e:
            # Lost a creation race (another service created it first): verify what it created.
            if e.err_code != ERR_STREAM_NAME_IN_USE:
                raise
            info = await _stream_info(js, config.name)
            if info is None:
                raise
    diff = _differences(config, info.config, keys)
    if diff:
        raise IncompatibleConfigError(config.name, diff)
    return info


async def ensure_history_stream(js: JetStreamContext, settings: Settings) -> api.StreamInfo:
    return await ensure_stream(js, history_stream_config(settings), _HISTORY_KEYS)


async def ensure_work_stream(js: JetStreamContext, settings: Settings) -> api.StreamInfo:
    return await ensure_stream(js, work_stream_config(settings), _WORK_KEYS)


async def signal_work(
    nc: NATS,
    names: Names,
    loop_id: str,
    *,
    within: float,
    request_timeout: float = 2.0,
    headers: Mapping[str, str] | None = None,
) -> None:
    """Queue a work signal for ``loop_id`` on the work stream (a new signal replaces a pending one).

    Retried while JetStream is unavailable (a leader election, a reconnect) for up to ``within``
    seconds; then the last :class:`JetStreamUnavailableError` / :class:`JetStreamError` is raised.
    """
    backoff = Backoff(0.05, 0.5, within=within)
    while True:
        try:
            await js_publish(nc, names.work(loop_id), b"", headers or {}, request_timeout=request_timeout)
            return
        except JetStreamError as e:
            if not e.retryable or not backoff.fits():
                raise
        except JetStreamUnavailableError:
            if not backoff.fits():
                raise
        await backoff.sleep()


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
        except nats.js.errors.BadRequestError as e:
            if e.err_code != ERR_STREAM_NAME_IN_USE:
                raise
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
            await ensure_history_stream(js, settings)
            await ensure_work_stream(js, settings)
            await ensure_kv(js, n.tools_bucket, replicas=settings.replicas, ttl=TOOLS_TTL_SECONDS)
            await ensure_kv(
                js, n.leases_bucket, replicas=settings.replicas, ttl=settings.lease_ttl_seconds, set_ttl=True
            )
            await ensure_kv(js, n.results_bucket, replicas=settings.replicas, ttl=settings.results_ttl_seconds)
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


# --- raw publish ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PubAck:
    stream: str
    seq: int
    duplicate: bool = False
    batch_size: int = 0


class _ApiError(msgspec.Struct):
    code: int = 0
    err_code: int = 0
    description: str = ""


class _PubAckWire(msgspec.Struct):
    stream: str = ""
    seq: int = 0
    duplicate: bool = False
    count: int = 0
    error: _ApiError | None = None


_pub_ack = msgspec.json.Decoder(_PubAckWire)


def _headers_size(headers: Mapping[str, str]) -> int:
    return 12 + sum(len(k) + len(v) + 4 for k, v in headers.items()) + _HEADER_SLACK


def check_payload(nc: NATS, payload: bytes, headers: Mapping[str, str]) -> None:
    """Raise :class:`PayloadTooLargeError` rather than let the server close the connection."""
    size = len(payload) + _headers_size(headers)
    if size > nc.max_payload:
        raise PayloadTooLargeError(size, nc.max_payload)


def parse_ack(data: bytes) -> PubAck:
    """A JetStream publish ack; raises :class:`JetStreamError` for an error ack or unreadable data."""
    try:
        ack = _pub_ack.decode(data)
    except msgspec.DecodeError as e:
        raise JetStreamError(0, 0, f"unreadable publish ack: {e}") from None
    if ack.error is not None:
        raise JetStreamError(ack.error.code, ack.error.err_code, ack.error.description)
    return PubAck(stream=ack.stream, seq=ack.seq, duplicate=ack.duplicate, batch_size=ack.count)


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


async def _request(
    nc: NATS, subject: str, payload: bytes, headers: Mapping[str, str] | None, request_timeout: float
) -> Msg:
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


async def js_publish(
    nc: NATS, subject: str, payload: bytes, headers: Mapping[str, str], *, request_timeout: float
) -> PubAck:
    """Publish one message to JetStream with exactly ``headers`` and wait for its ack.

    Raises :class:`JetStreamError` (with ``err_code``), :class:`JetStreamUnavailableError` or
    :class:`PayloadTooLargeError`. A duplicate is not an error (``PubAck.duplicate``).
    """
    check_payload(nc, payload, headers)
    msg = await _request(nc, subject, payload, headers, request_timeout)
    return parse_ack(msg.data)


async def publish_batch(
    nc: NATS,
    subject: str,
    payloads: Sequence[bytes],
    headers: Sequence[Mapping[str, str]],
    *,
    request_timeout: float,
    batch_id: str | None = None,
) -> PubAck:
    """Publish ``payloads`` (≥ 2) as ONE atomic batch on ``subject``; nothing is stored unless all are.

    ``headers[k]`` are the message's own headers (msg-id, OCC on the first); the batch headers are
    added here. The first message is a request (the server answers an empty body once staged),
    the middle ones are plain publishes, the last one commits and gets the PubAck (``seq`` = the
    batch's last sequence).
    """
    n = len(payloads)
    if n < 2 or len(headers) != n:
        raise ValueError("publish_batch needs ≥ 2 payloads and one header map per payload")
    if n > MAX_BATCH:
        raise JetStreamError(400, 10199, f"atomic batch of {n} messages exceeds the {MAX_BATCH}-message limit")
    bid = batch_id or uuid.uuid4().hex
    full: list[dict[str, str]] = []
    for k, (p, h) in enumerate(zip(payloads, headers, strict=True), 1):
        hdr = {**h, H_BATCH_ID: bid, H_BATCH_SEQ: str(k)}
        if k == n:
            hdr[H_BATCH_COMMIT] = "1"
        check_payload(nc, p, hdr)
        full.append(hdr)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + request_timeout
    first = await _request(nc, subject, payloads[0], full[0], request_timeout)
    if first.data:
        parse_ack(first.data)  # raises the staging error
        raise JetStreamError(0, 0, "unexpected ack for the first message of an atomic batch")
    try:
        for k in range(1, n - 1):
            await nc.publish(subject, payloads[k], headers=full[k])
    except (nats.errors.ConnectionClosedError, nats.errors.OutboundBufferLimitError) as e:
        raise JetStreamUnavailableError(f"connection unavailable mid-batch: {e!r}") from None
    last = await _request(nc, subject, payloads[-1], full[-1], max(0.05, deadline - loop.time()))
    return parse_ack(last.data)


# --- reads ------------------------------------------------------------------------------------


@dataclass(slots=True)
class StoredMsg:
    """One stored message: its subject, stream sequence, headers and payload."""

    subject: str
    seq: int
    headers: dict[str, str]
    data: bytes

    @property
    def msg_id(self) -> str:
        return self.headers.get(H_MSG_ID, "")


def parse_headers(raw: bytes) -> dict[str, str]:
    """Parse a ``NATS/1.0`` header block (as stored by JetStream)."""
    out: dict[str, str] = {}
    lines = raw.decode("utf-8", "replace").split("\r\n")
    for line in lines[1:]:
        if not line:
            continue
        k, sep, v = line.partition(":")
        if sep:
            out.setdefault(k.strip(), v.strip())
    return out


class _RawStoredMsg(msgspec.Struct):
    subject: str = ""
    seq: int = 0
    hdrs: str = ""
    data: str = ""


class _MsgGetWire(msgspec.Struct):
    message: _RawStoredMsg | None = None
    error: _ApiError | None = None


_msg_get = msgspec.json.Decoder(_MsgGetWire)
_json = msgspec.json.Encoder()


async def get_msg(
    nc: NATS,
    stream: str,
    *,
    seq: int | None = None,
    last_by_subj: str | None = None,
    next_by_subj: str | None = None,
    request_timeout: float = 2.0,
) -> StoredMsg | None:
    """Leader read (``$JS.API.STREAM.MSG.GET``): read-after-write even on R3. None = no such message.

    ``seq`` alone: that message; ``last_by_subj``: the subject's last; ``seq`` + ``next_by_subj``:
    the first message on the subject at or after ``seq``.
    """
    req: dict[str, object] = {}
    if last_by_subj is not None:
        req["last_by_subj"] = last_by_subj
    else:
        req["seq"] = max(1, seq or 1)
        if next_by_subj is not None:
            req["next_by_subj"] = next_by_subj
    msg = await _request(nc, js_api("STREAM.MSG.GET", stream), _json.encode(req), None, request_timeout)
    resp = _msg_get.decode(msg.data)
    if resp.error is not None:
        if resp.error.err_code == ERR_NO_MESSAGE or resp.error.code == 404:
            return None
        raise JetStreamError(resp.error.code, resp.error.err_code, resp.error.description)
    if resp.message is None:
        raise JetStreamError(0, 0, "empty message-get response")
    m = resp.message
    return StoredMsg(
        subject=m.subject,
        seq=m.seq,
        headers=parse_headers(base64.b64decode(m.hdrs)) if m.hdrs else {},
        data=base64.b64decode(m.data) if m.data else b"",
    )


@dataclass(slots=True)
class DirectBatch:
    """One Direct Get batch: the messages, how many remain after them, and the subject's last seq."""

    messages: list[StoredMsg]
    num_pending: int
    last_seq: int


def _has_status(m: Msg) -> bool:
    return m.headers is not None and H_STATUS in m.headers


async def direct_get_batch(
    nc: NATS,
    stream: str,
    subject: str,
    *,
    start_seq: int,
    batch: int = 2000,
    max_bytes: int = 8 * 1024 * 1024,
    idle_timeout: float = 5.0,
    multi_last: Sequence[str] = (),
) -> DirectBatch:
    """Up to ``batch`` messages of ``subject`` from ``start_seq`` with ONE request (no consumer).

    With ``multi_last``, instead the last message of each of those subjects (``subject`` and
    ``start_seq`` are then ignored). Served by any replica (no read-after-write on R3; see
    :func:`get_msg`). The messages come to the connection's reply inbox (no subscription of the
    request's own) and end with a status message.
    """
    req: dict[str, object] = (
        {"multi_last": list(multi_last), "batch": batch}
        if multi_last
        else {"seq": max(1, start_seq), "batch": batch, "next_by_subj": subject, "max_bytes": max_bytes}
    )
    try:
        # Every batch ends with a status message: 204 (end of batch), 404 (nothing), or an error.
        replies = await request_many(
            nc, js_api("DIRECT.GET", stream), _json.encode(req), last=_has_status, idle=idle_timeout
        )
    except nats.errors.TimeoutError:
        raise JetStreamUnavailableError(f"direct get on {stream} stalled for {idle_timeout:g}s") from None
    except nats.errors.ConnectionClosedError as e:
        raise JetStreamUnavailableError(f"connection closed: {e!r}") from None
    out: list[StoredMsg] = []
    end: dict[str, str] = {}
    for m in replies:
        h = m.headers or {}
        status = h.get(H_STATUS)
        if status is None:
            seq = int(h.get(H_SEQUENCE, "0"))
            out.append(StoredMsg(subject=h.get(H_SUBJECT, subject), seq=seq, headers=h, data=m.data))
        elif status == "204":
            end = h
        elif status != "404":
            code = int(status) if status.isdigit() else 0
            if code == 503:
                raise JetStreamUnavailableError(f"direct get on {stream}: no responders (no stream, or no leader)")
            why = f"direct get on {stream}: status {status} {h.get('Description', '')}".strip()
            raise JetStreamError(code, 0, why)
    pending = int(end.get(H_NUM_PENDING, "0") or 0)
    last = int(end.get(H_LAST_SEQUENCE, "0") or 0)
    return DirectBatch(messages=out, num_pending=pending, last_seq=last)


async def stream_messages(nc: NATS, stream: str, *, request_timeout: float = 5.0) -> int:
    """How many messages ``stream`` holds (one stream info request, only its count decoded)."""
    msg = await _request(nc, js_api("STREAM.INFO", stream), b"", None, request_timeout)
    resp = msgspec.json.decode(msg.data, type=_StreamInfoWire)
    if resp.error is not None:
        raise JetStreamError(resp.error.code, resp.error.err_code, resp.error.description)
    return resp.state.messages if resp.state else 0


async def subjects(nc: NATS, stream: str, subjects_filter: str, *, request_timeout: float = 5.0) -> dict[str, int]:
    """Every subject of ``stream`` matching ``subjects_filter`` with its message count (paged)."""
    out: dict[str, int] = {}
    offset = 0
    while True:
        req = {"subjects_filter": subjects_filter, "offset": offset}
        msg = await _request(nc, js_api("STREAM.INFO", stream), _json.encode(req), None, request_timeout)
        resp = msgspec.json.decode(msg.data, type=_StreamInfoWire)
        if resp.error is not None:
            if resp.error.err_code == ERR_STREAM_NOT_FOUND:
                return out
            raise JetStreamError(resp.error.code, resp.error.err_code, resp.error.description)
        got = (resp.state.subjects if resp.state else None) or {}
        out.update(got)
        offset += len(got)
        if not got or offset >= resp.total:
            return out


class _PurgeWire(msgspec.Struct):
    success: bool = False
    purged: int = 0
    error: _ApiError | None = None


async def purge_work(nc: NATS, names: Names, loop_id: str, *, through_seq: int, request_timeout: float = 2.0) -> int:
    """Delete the work signals of ``loop_id`` up to stream sequence ``through_seq``; how many went.

    Bounded by sequence, never "all of the subject": a signal published later is kept even when
    the purge is applied late (a leader election), so a purge cannot swallow a wake-up it never saw.
    """
    req = {"filter": names.work(loop_id), "seq": through_seq + 1}  # JetStream: "up to, not including"
    msg = await _request(nc, js_api("STREAM.PURGE", names.work_stream), _json.encode(req), None, request_timeout)
    resp = msgspec.json.decode(msg.data, type=_PurgeWire)
    if resp.error is not None:
        raise JetStreamError(resp.error.code, resp.error.err_code, resp.error.description)
    return resp.purged


class _StreamStateWire(msgspec.Struct):
    messages: int = 0
    subjects: dict[str, int] | None = None


class _StreamInfoWire(msgspec.Struct):
    state: _StreamStateWire | None = None
    total: int = 0
    error: _ApiError | None = None
