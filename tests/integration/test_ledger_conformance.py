"""Ledger conformance cases that apply to a loop's history.

The ledger here is one loop: append = a commit through the committer (expected = the stream
sequence of the loop's last record), read = ``shared.replay.replay``, tip = the last sequence.
Not ported, by design: Delete (the history stream denies deletes and purges - checked below),
zero-length payloads (every record is a validated event) and the dotted-name matrix (loop ids are
UUIDs, never paths). Sequences are stream sequences: contiguous per loop in order, not 1..n.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio
import anyio.lowlevel
import msgspec
import nats.js.errors
import pytest
from nats.aio.client import Client as NATS

from shared.client import CommitClient
from shared.codec import encode_event
from shared.content import ai_text
from shared.events import Event, StepDone, make
from shared.protocol import ConflictError, InvalidRequestError, TooLargeError
from shared.replay import replay
from shared.settings import Settings
from tests.integration.committer_fixtures import (
    loop_started,
    new_id,
    predecessors_chain,
    running_committer,
    step,
    stored,
)

pytestmark = pytest.mark.anyio
T = 10.0


@pytest.fixture
async def committer(settings: Settings) -> AsyncIterator[Settings]:
    async with running_committer(settings):
        yield settings


@pytest.fixture
def client(nc: NATS, settings: Settings) -> CommitClient:
    return CommitClient(nc, settings.names, T)


async def read(nc: NATS, settings: Settings, loop_id: str, from_seq: int = 0) -> list[tuple[int, Event]]:
    return [x async for x in replay(nc, loop_id, settings=settings, from_seq=from_seq)]


async def tip(nc: NATS, settings: Settings, loop_id: str) -> int:
    records = await stored(nc, settings, loop_id)
    return records[-1][0] if records else 0


async def test_round_trip(committer: Settings, nc: NATS, client: CommitClient) -> None:
    loop_id = new_id()
    first = loop_started(loop_id)
    res = await client.commit(loop_id, 0, [first])
    assert await tip(nc, committer, loop_id) == res.last_seq
    assert await read(nc, committer, loop_id) == [(res.last_seq, first)]


async def test_contiguity(committer: Settings, nc: NATS, client: CommitClient) -> None:
    loop_id = new_id()
    turn = new_id()
    records: list[Event] = [loop_started(loop_id), *(step(loop_id, turn, t) for t in ("a", "bb", "ccc", "dddd"))]
    seqs = []
    expected = 0
    for r in records:
        expected = (await client.commit(loop_id, expected, [r])).last_seq
        seqs.append(expected)
    got = await read(nc, committer, loop_id)
    assert [s for s, _ in got] == seqs and [e for _, e in got] == records


async def test_conflict_leaves_state_unchanged(committer: Settings, nc: NATS, client: CommitClient) -> None:
    loop_id = new_id()
    turn = new_id()
    seqs = []
    expected = 0
    for r in [loop_started(loop_id), step(loop_id, turn), step(loop_id, turn)]:
        expected = (await client.commit(loop_id, expected, [r])).last_seq
        seqs.append(expected)
    before = await stored(nc, committer, loop_id)
    for stale in (0, seqs[1], seqs[-1] + 1000):  # empty, below the tip, above the tip
        with pytest.raises(ConflictError) as err:
            await client.commit(loop_id, stale, [step(loop_id, turn, "late")])
        assert err.value.last_seq == seqs[-1]
    assert await stored(nc, committer, loop_id) == before


async def test_stale_writer(committer: Settings, nc: NATS, client: CommitClient) -> None:
    loop_id = new_id()
    r1 = (await client.commit(loop_id, 0, [loop_started(loop_id)])).last_seq
    r2 = (await client.commit(loop_id, r1, [step(loop_id, new_id(), "r2")])).last_seq
    with pytest.raises(ConflictError) as err:
        await client.commit(loop_id, r1, [step(loop_id, new_id(), "stale")])
    assert err.value.last_seq == r2
    assert await tip(nc, committer, loop_id) == r2


async def test_missing_loop_reads_empty(committer: Settings, nc: NATS) -> None:
    assert await read(nc, committer, new_id()) == []
    assert await tip(nc, committer, new_id()) == 0


async def test_read_from_zero_inside_and_past_the_tip(committer: Settings, nc: NATS, client: CommitClient) -> None:
    loop_id = new_id()
    expected = 0
    turn = new_id()
    for r in [loop_started(loop_id), step(loop_id, turn, "a"), step(loop_id, turn, "b"), step(loop_id, turn, "c")]:
        expected = (await client.commit(loop_id, expected, [r])).last_seq
        # another loop's records in between, so stream sequences are not contiguous
        other = new_id()
        await client.commit(other, 0, [loop_started(other)])
    everything = await read(nc, committer, loop_id)
    seqs = [s for s, _ in everything]
    assert await read(nc, committer, loop_id, 0) == everything == await read(nc, committer, loop_id, 1)
    for i, s in enumerate(seqs):
        # from a record's own sequence: exactly the suffix (no clamping to the start)
        assert await read(nc, committer, loop_id, s) == everything[i:]
        # from between two records: the suffix after that point
        assert await read(nc, committer, loop_id, s + 1) == everything[i + 1 :]
    for past in (seqs[-1] + 1, seqs[-1] + 2, seqs[-1] + 100_000):
        assert await read(nc, committer, loop_id, past) == []


async def test_largest_record_round_trips_byte_for_byte(committer: Settings, nc: NATS, client: CommitClient) -> None:
    """The 1 MiB floor, as close as NATS allows: max_payload (1 MiB) minus the committer's 1 KiB for headers."""
    loop_id = new_id()
    last = (await client.commit(loop_id, 0, [loop_started(loop_id)])).last_seq
    turn, step_id = new_id(), new_id()
    shell = encode_event(make(StepDone, loop_id=loop_id, turn_id=turn, step_id=step_id, messages=[ai_text("x")]))
    limit = nc.max_payload - 1024
    # patterned text (printable ASCII, period 95) so truncation or offset bugs show up
    text = "".join(chr(32 + (i * 31) % 95) for i in range(limit - len(shell) + 1))
    text = text.replace("\\", "/").replace('"', "'")  # keep the JSON length equal to the text length
    big = make(StepDone, loop_id=loop_id, turn_id=turn, step_id=step_id, messages=[ai_text(text)])
    envelope = encode_event(big)
    assert len(envelope) == limit
    res = await client.commit(loop_id, last, [big])
    [(seq, data, _)] = [r for r in await stored(nc, committer, loop_id) if r[0] == res.last_seq]
    assert data == envelope
    assert (await read(nc, committer, loop_id, seq)) == [(seq, big)]
    # one byte more than the committer can store (it would not fit a message with its headers)
    bigger = msgspec.structs.replace(big, event_id=new_id(), messages=[ai_text(text + "x")])
    with pytest.raises(TooLargeError):
        await client.commit(loop_id, res.last_seq, [bigger])
    assert await tip(nc, committer, loop_id) == res.last_seq


async def test_invalid_loop_ids(committer: Settings, nc: NATS, client: CommitClient) -> None:
    for bad in ("Upper", "not-a-uuid", "11111111-1111-4111-8111-11111111111G", "A1111111-1111-4111-8111-111111111111"):
        with pytest.raises(InvalidRequestError) as err:
            await client.commit_raw(bad, 0, [encode_event(loop_started(new_id()))])
        assert err.value.body.field == "loop_id"
    for bad in ("", "Upper", "has space", "..", "a/b", "11111111-1111-4111-8111-11111111111G"):
        with pytest.raises(ValueError):
            await read(nc, committer, bad)


async def test_history_cannot_be_deleted_or_purged(committer: Settings, nc: NATS, client: CommitClient) -> None:
    loop_id = new_id()
    res = await client.commit(loop_id, 0, [loop_started(loop_id)])
    jsm = nc.jetstream()
    with pytest.raises(nats.js.errors.APIError):
        await jsm.delete_msg(committer.names.history_stream, res.last_seq)
    with pytest.raises(nats.js.errors.APIError):
        await jsm.purge_stream(committer.names.history_stream)
    assert await tip(nc, committer, loop_id) == res.last_seq


async def test_concurrent_appenders_leave_no_gaps(committer: Settings, nc: NATS, client: CommitClient) -> None:
    loop_id = new_id()
    await client.commit(loop_id, 0, [loop_started(loop_id)])
    turn = new_id()

    async def appender(i: int) -> None:
        record = step(loop_id, turn, f"writer-{i}")
        while True:
            current = await tip(nc, committer, loop_id)
            try:
                await client.commit(loop_id, current, [record])
                return
            except ConflictError:
                await anyio.lowlevel.checkpoint()

    async with anyio.create_task_group() as tg:
        for i in range(8):
            tg.start_soon(appender, i)
    got = await read(nc, committer, loop_id)
    texts = [e.messages[0].blocks[0].text for _, e in got[1:] if isinstance(e, StepDone)]  # type: ignore[union-attr]
    assert sorted(texts) == sorted(f"writer-{i}" for i in range(8))
    assert len(got) == 9
    # no gaps: every record was appended right after its predecessor on the loop
    assert await predecessors_chain(nc, committer, loop_id)
