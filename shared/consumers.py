"""Asking JetStream for what a reader needs (a stream's state, an ordered consumer) while it may
not answer: within seconds of a node going away JetStream elects new leaders, and until then its
requests go unanswered or are refused as unavailable. :func:`answered` asks again while the error
says so (:func:`shared.streams.is_transient_setup_error`), for up to CONSUMER_SETUP_SECONDS, then
raises :class:`JetStreamUnavailableError`.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Final, TypeVar

import anyio
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import api
from nats.js.client import JetStreamContext

from shared.backoff import Backoff
from shared.jserrors import JetStreamUnavailableError
from shared.streams import describe_api_error, is_transient_setup_error

T = TypeVar("T")

# Leaders are elected within seconds of a node going away; a request made meanwhile waits out its
# own timeout (5 s) before it is asked again.
CONSUMER_SETUP_SECONDS: Final = 30.0

log = logging.getLogger("loopwire.consumers")


def setup_deadline() -> float:
    """When a setup starting now gives up (:func:`anyio.current_time` clock)."""
    return anyio.current_time() + CONSUMER_SETUP_SECONDS


async def answered(what: str, ask: Callable[[], Awaitable[T]], *, deadline: float | None = None) -> T:
    """``await ask()``, asked again while JetStream cannot answer until ``deadline`` (default: from
    now, CONSUMER_SETUP_SECONDS); then :class:`JetStreamUnavailableError` ("cannot ``what``: ...").
    Any other error is raised as itself at once."""
    started = anyio.current_time()
    backoff = Backoff(0.2, 2.0, deadline=setup_deadline() if deadline is None else deadline)
    while True:
        try:
            return await ask()
        except Exception as e:
            if not is_transient_setup_error(e):
                raise
            if not backoff.fits():
                waited = anyio.current_time() - started
                raise JetStreamUnavailableError(
                    f"cannot {what}: JetStream did not answer for {waited:.0f} s ({describe_api_error(e)})"
                ) from e
            log.info("%s: JetStream did not answer (%s); asking again", what, describe_api_error(e))
            await backoff.sleep()


async def ordered_consumer(
    nc: NATS,
    stream: str,
    subjects: str,
    start_seq: int,
    cb: Callable[[Msg], Awaitable[None]],
    *,
    deadline: float | None = None,
) -> JetStreamContext.PushSubscription:
    """An ordered consumer of ``subjects`` in ``stream`` from ``start_seq``, made as :func:`answered` says."""
    js = nc.jetstream()

    async def subscribe() -> JetStreamContext.PushSubscription:
        # A fresh config (so a fresh delivery inbox) each time: a consumer made by a request whose
        # answer was lost delivers to an inbox nobody reads, and goes after its inactive threshold.
        config = api.ConsumerConfig(
            deliver_policy=api.DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=start_seq, inactive_threshold=30.0
        )
        return await js.subscribe(subjects, stream=stream, ordered_consumer=True, cb=cb, config=config)

    return await answered(f"follow {subjects}", subscribe, deadline=deadline)
