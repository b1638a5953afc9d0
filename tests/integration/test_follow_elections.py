"""Following every loop while JetStream cannot answer for a few seconds (a leader election after a
node died, or a stalled server): :meth:`Follower.start` asks again for the streams' state and
their consumers until it has them, bounded, then hands over every stored record exactly once; past
the bound it ends with :class:`JetStreamUnavailableError`, following nothing."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import anyio
import pytest
from nats.aio.client import Client as NATS
from nats.js.client import JetStreamContext

from shared import shards
from shared.codec import encode_event
from shared.connect import connect
from shared.follow import Follower, Record
from shared.jserrors import JetStreamUnavailableError
from shared.natsserver import NatsServer
from shared.settings import Settings
from shared.subjects import Names
from tests import natsfixtures
from tests.integration.committer_fixtures import loop_started, new_id
from tests.natsfixtures import Freeze

# Longer than a JetStream API request's timeout (5 s): the request made while frozen goes unanswered.
SILENT_SECONDS = 7.0
SHARDS = 2
LOOPS = 6


@pytest.fixture
def freeze(nats_server: NatsServer) -> Iterator[Freeze]:
    f = Freeze(nats_server)
    try:
        yield f
    finally:
        f.thaw_at_end(SILENT_SECONDS)


@pytest.fixture
async def stored(nats_server: NatsServer) -> AsyncIterator[tuple[Settings, NATS, dict[tuple[int, int], bytes]]]:
    """A two-shard deployment with a record of each of LOOPS loops; every stored record by (shard, seq)."""
    settings = Settings.from_env(
        {"LW_SHARDS": str(SHARDS)}, nats_urls=(nats_server.url,), prefix=natsfixtures.unique_prefix()
    )
    await natsfixtures.create_deployment(settings)
    writer = await connect(settings)
    records: dict[tuple[int, int], bytes] = {}
    try:
        for _ in range(LOOPS):
            await _write_loop(writer, settings.names, records)
        assert {shard for shard, _ in records} == set(range(SHARDS))  # both streams have records
        yield settings, writer, records
    finally:
        await writer.close()


async def _write_loop(writer: NATS, names: Names, records: dict[tuple[int, int], bytes]) -> None:
    """A new loop's first record, stored in its shard's stream and noted in ``records``."""
    loop_id = new_id()
    shard = names.shard_of(loop_id)
    data = encode_event(loop_started(loop_id))
    ack = await writer.jetstream().publish(shards.home_in(names, shard, loop_id).subject, data)
    records[(shard, ack.seq)] = data


def _freeze_after_stream_infos(monkeypatch: pytest.MonkeyPatch, freeze: Freeze, count: int) -> None:
    """The server freezes right after the ``count``-th stream info was answered (once)."""
    real = JetStreamContext.stream_info
    answered = 0

    async def info_then_freeze(self: JetStreamContext, *args: Any, **kwargs: Any) -> Any:
        nonlocal answered
        info = await real(self, *args, **kwargs)
        answered += 1
        if answered == count:
            freeze.now(SILENT_SECONDS)
        return info

    monkeypatch.setattr(JetStreamContext, "stream_info", info_then_freeze)


@pytest.mark.anyio
@pytest.mark.parametrize("moment", ["before start", "between the stream infos and the subscribes"])
async def test_start_outwaits_a_jetstream_that_does_not_answer(
    stored: tuple[Settings, NATS, dict[tuple[int, int], bytes]],
    freeze: Freeze,
    monkeypatch: pytest.MonkeyPatch,
    moment: str,
) -> None:
    settings, writer, records = stored
    names = settings.names
    got: list[Record] = []

    async def on_record(r: Record) -> None:
        got.append(r)

    nc = await connect(settings)
    follower = Follower(nc, names, on_record)
    try:
        if moment == "before start":
            freeze.now(SILENT_SECONDS)  # the first stream info goes unanswered
        else:
            _freeze_after_stream_infos(monkeypatch, freeze, SHARDS)  # the first subscribe goes unanswered
        with anyio.fail_after(40):
            await follower.start()
            await follower.caught_up.wait()
        monkeypatch.undo()
        assert freeze.back.is_set()  # start() did meet the silence
        last = {shard: max(seq for s, seq in records if s == shard) for shard in range(SHARDS)}
        assert follower.positions == last
        # A live record after the silence arrives too, and nothing came twice or was left out.
        await _write_loop(writer, names, records)
        with anyio.fail_after(10):
            while len(got) < len(records):
                await anyio.sleep(0.05)
        await anyio.sleep(0.3)  # time for a record twice to show
        assert sorted((r.shard, r.seq) for r in got) == sorted(records)
        assert all(r.data == records[(r.shard, r.seq)] for r in got)
    finally:
        await follower.stop()
        await nc.close()


@pytest.mark.anyio
async def test_start_ends_with_jetstream_unavailable_past_the_bound(
    stored: tuple[Settings, NATS, dict[tuple[int, int], bytes]],
    freeze: Freeze,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings, _, _ = stored
    monkeypatch.setattr("shared.consumers.CONSUMER_SETUP_SECONDS", 1.0)  # shorter than the silence

    async def on_record(r: Record) -> None:
        raise AssertionError(f"a record handed over by a follower that did not start: {r}")

    nc = await connect(settings)
    follower = Follower(nc, settings.names, on_record)
    try:
        _freeze_after_stream_infos(monkeypatch, freeze, SHARDS)
        with anyio.fail_after(20), pytest.raises(JetStreamUnavailableError, match="cannot follow"):
            await follower.start()
        assert follower.positions == {}  # following none of the streams
        assert not follower.caught_up.is_set()
    finally:
        await follower.stop()
        await nc.close()
