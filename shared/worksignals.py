"""Work signals: queueing one for a loop, and deleting those a drive has taken care of."""

from __future__ import annotations

from collections.abc import Mapping

import msgspec
from nats.aio.client import Client as NATS

from shared.backoff import Backoff
from shared.jsapi import ApiErrorBody, js_request
from shared.jserrors import JetStreamError, JetStreamUnavailableError
from shared.publish import js_publish
from shared.subjects import Names, js_api

_json = msgspec.json.Encoder()


async def signal_work(
    nc: NATS,
    names: Names,
    loop_id: str,
    *,
    within: float,
    request_timeout: float = 2.0,
    headers: Mapping[str, str] | None = None,
) -> None:
    """Queue a work signal for ``loop_id`` on its shard's work stream (a new signal replaces a pending one).

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


class _PurgeWire(msgspec.Struct):
    success: bool = False
    purged: int = 0
    error: ApiErrorBody | None = None


async def purge_work(nc: NATS, names: Names, loop_id: str, *, through_seq: int, request_timeout: float = 2.0) -> int:
    """Delete the work signals of ``loop_id`` (in its shard's work stream) up to stream sequence
    ``through_seq``; how many went.

    Bounded by sequence, never "all of the subject": a signal published later is kept even when
    the purge is applied late (a leader election), so a purge cannot swallow a wake-up it never saw.
    """
    req = {"filter": names.work(loop_id), "seq": through_seq + 1}  # JetStream: "up to, not including"
    stream = names.work_stream_of(names.shard_of(loop_id))
    msg = await js_request(nc, js_api("STREAM.PURGE", stream), _json.encode(req), None, request_timeout)
    resp = msgspec.json.decode(msg.data, type=_PurgeWire)
    if resp.error is not None:
        raise JetStreamError(resp.error.code, resp.error.err_code, resp.error.description)
    return resp.purged
