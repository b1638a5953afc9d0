"""Server-sent events: framing, and the merged committed + live feed of one loop.

A committed record is sent with ``id: <stream sequence>``, so a browser that reconnects with
``Last-Event-ID`` resumes right after the last record it got: no gap, no repeat. Live events
(tokens, tool progress) carry no id: they may be dropped and are never replayed. When the
console's NATS connection comes back after a loss (a NATS restart), each open stream ends with an
``error`` frame, so the page reconnects and resumes the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any, Final

import anyio
import msgspec
import nats.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import api

from services.console.rules import cut_strings
from shared import shards
from shared.jserrors import JetStreamError, JetStreamUnavailableError
from shared.subjects import Names

RETRY_MS: Final = 500  # the page reconnects this soon after a drop
HEARTBEAT_SECONDS: Final = 15.0
QUEUE_LIMIT: Final = 2048
# How often an open stream looks whether the console's NATS connection came back from a loss.
RECONNECT_CHECK_SECONDS: Final = 0.5
RECONNECTED: Final = "the console's NATS connection was lost and is back: resuming after the last record"


def frame(event: str, data: Any, event_id: int | None = None) -> bytes:
    head = f"id: {event_id}\n" if event_id is not None else ""
    body = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return f"{head}event: {event}\ndata: {body}\n\n".encode()


def retry_frame() -> bytes:
    return f"retry: {RETRY_MS}\n\n".encode()


HEARTBEAT: Final = b": keep-alive\n\n"


def record_json(seq: int, data: bytes) -> dict[str, Any]:
    """A committed record as the page gets it: its sequence, the event (long strings cut) and whether it was cut."""
    event, cut = cut_strings(msgspec.json.decode(data))
    return {"seq": seq, "event": event, "cut": cut}


async def loop_feed(nc: NATS, names: Names, loop_id: str, after: int) -> AsyncIterator[bytes]:
    """SSE frames for ``loop_id``: every committed record after ``after``, then new ones, with live events."""
    queue: asyncio.Queue[bytes] = asyncio.Queue(QUEUE_LIMIT)
    last = [after]

    async def on_record(m: Msg) -> None:
        seq = m.metadata.sequence.stream
        if seq <= last[0]:  # an ordered-consumer reset can redeliver
            return
        last[0] = seq
        # Blocking here lets the consumer's flow control slow the server down for a slow page.
        await queue.put(frame("commit", record_json(seq, m.data), seq))

    async def on_live(m: Msg) -> None:
        try:
            events = msgspec.json.decode(m.data)  # a live frame: a JSON array of the loop's events
        except msgspec.DecodeError:
            return
        if not isinstance(events, list):
            return
        for doc in events:
            event, _ = cut_strings(doc)
            with contextlib.suppress(asyncio.QueueFull):  # live events may be dropped
                queue.put_nowait(frame("live", event))

    subs: list[Any] = []
    try:
        subs.append(await nc.subscribe(names.live(loop_id), cb=on_live))
        config = api.ConsumerConfig(
            deliver_policy=api.DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=after + 1, inactive_threshold=30.0
        )
        home = await shards.home_of(nc, names, loop_id)
        js = nc.jetstream()
        subs.append(
            await js.subscribe(home.subject, stream=home.stream, ordered_consumer=True, cb=on_record, config=config)
        )
    except (nats.errors.Error, TimeoutError, JetStreamError, JetStreamUnavailableError) as e:
        # The response has started: say why in the stream and end it (the page reconnects).
        yield frame("error", {"kind": "unavailable", "message": f"cannot follow the loop: {e}"})
        await _unsubscribe(subs)
        return
    reconnects = nc.stats["reconnects"]
    try:
        yield retry_frame()
        quiet = 0.0
        while True:
            try:
                yield await asyncio.wait_for(queue.get(), RECONNECT_CHECK_SECONDS)
                quiet = 0.0
            except TimeoutError:
                if nc.stats["reconnects"] != reconnects:
                    # The connection was lost and is back; the server may have forgotten the consumer
                    # (a restart). Ending the stream makes the page reconnect with Last-Event-ID, and
                    # a new consumer starts right after the last record it got.
                    yield frame("error", {"kind": "unavailable", "message": RECONNECTED})
                    return
                quiet += RECONNECT_CHECK_SECONDS
                if quiet >= HEARTBEAT_SECONDS:
                    quiet = 0.0
                    yield HEARTBEAT
    finally:
        await _unsubscribe(subs)


async def _unsubscribe(subs: list[Any]) -> None:
    # Shielded: the page went away (the request is being cancelled) and the subscriptions must go too.
    with anyio.CancelScope(shield=True), anyio.move_on_after(2):
        for sub in reversed(subs):
            with contextlib.suppress(nats.errors.Error):
                await sub.unsubscribe()
