"""Following a history while JetStream cannot answer for a few seconds (a leader election after a
node died): making the follow's consumer is asked again until it is made, bounded."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import anyio
import pytest

from shared import shards, streamreads
from shared.codec import encode_event
from shared.connect import connect
from shared.natsserver import NatsServer
from shared.settings import Settings
from shared.streamreads import DirectBatch
from shared.turns import follow
from tests import natsfixtures
from tests.integration.committer_fixtures import loop_started, new_id
from tests.natsfixtures import Freeze

# Longer than a JetStream API request's timeout (5 s): the consumer's first request goes unanswered.
SILENT_SECONDS = 7.0


@pytest.fixture
def frozen_after_first_read(nats_server: NatsServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[threading.Event]:
    """The server stops (SIGSTOP) right after replay's first read, for SILENT_SECONDS; set once back."""
    real = streamreads.direct_get_batch
    freeze = Freeze(nats_server)

    async def read_then_freeze(*args: Any, **kwargs: Any) -> DirectBatch:
        batch = await real(*args, **kwargs)
        freeze.now(SILENT_SECONDS)
        return batch

    monkeypatch.setattr("shared.replay.direct_get_batch", read_then_freeze)
    try:
        yield freeze.back
    finally:
        freeze.thaw_at_end(SILENT_SECONDS)


@pytest.mark.anyio
async def test_follow_outwaits_a_jetstream_that_does_not_answer_while_its_consumer_is_made(
    nats_server: NatsServer, frozen_after_first_read: threading.Event
) -> None:
    settings = Settings.from_env({}, nats_urls=(nats_server.url,), prefix=natsfixtures.unique_prefix())
    await natsfixtures.create_deployment(settings)
    loop_id = new_id()
    record = loop_started(loop_id)
    nc = await connect(settings)
    writer = await connect(settings)
    try:
        home = await shards.home_of(writer, settings.names, loop_id)
        async with follow(nc, settings.names, loop_id, 0) as it, anyio.create_task_group() as tg:

            async def write_once_back() -> None:
                await anyio.to_thread.run_sync(frozen_after_first_read.wait, SILENT_SECONDS + 5)
                await writer.jetstream().publish(home.subject, encode_event(record))

            tg.start_soon(write_once_back)
            with anyio.fail_after(40):
                _, event = await it.__anext__()
        assert event.event_id == record.event_id
    finally:
        await nc.close()
        await writer.close()
