"""The committer on a 3-node R3 cluster: retries of stored commits, stream config checks, lost quorum,
and a stream-leader SIGKILL during 20 concurrent loops of appends (committers as separate processes).

Tests that stop or kill nodes restart them before they end (the cluster is shared by the module).
"""

from __future__ import annotations

import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest
from nats.aio.client import Client as NATS

from shared.bus import IncompatibleConfigError, connect, ensure_history_stream
from shared.client import CommitClient, LoopClient
from shared.natsserver import NatsCluster
from shared.procs import ServiceProcess
from shared.protocol import ClosedError, UnavailableError
from shared.settings import Settings
from tests import natsfixtures
from tests.integration.committer_fixtures import (
    loop_started,
    new_id,
    predecessors_chain,
    running_committer,
    step,
    stored,
    text_turn,
)

pytestmark = [pytest.mark.anyio, pytest.mark.cluster]
T = 10.0


def cluster_settings(cluster: NatsCluster, **overrides: object) -> Settings:
    values: dict[str, object] = {
        "nats_urls": tuple(cluster.urls),
        "prefix": natsfixtures.unique_prefix(),
        "replicas": 3,
        **overrides,
    }
    return Settings.from_env({}, **values)


@pytest.fixture
def r3(nats_cluster: NatsCluster) -> Settings:
    return cluster_settings(nats_cluster)


@pytest.fixture
async def cnc(r3: Settings) -> AsyncIterator[NATS]:
    nc = await connect(r3, name="cluster-test")
    try:
        yield nc
    finally:
        await nc.close()


def restore(cluster: NatsCluster) -> None:
    """Start every stopped node again and wait for a healthy cluster (main thread: see shared.procs)."""
    for node in cluster.nodes:
        if not node.running:
            node.start(wait=False)
    for node in cluster.nodes:
        node.wait_ready(timeout=30, jetstream=False)
    cluster.wait_meta_leader(timeout=30)


async def test_retry_of_a_stored_commit_on_r3(r3: Settings, cnc: NATS) -> None:
    async with running_committer(r3):
        client = CommitClient(cnc, r3.names, T)
        loop_id = new_id()
        start = [loop_started(loop_id)]
        first = await client.commit(loop_id, 0, start)
        assert await client.commit(loop_id, 0, start) == first  # R3: the server says "duplicate"
        turn = text_turn(loop_id)
        res = await client.commit(loop_id, first.last_seq, turn)
        assert await client.commit(loop_id, first.last_seq, turn) == res  # batch: 10201, resolved
        nxt = await client.commit(loop_id, res.last_seq, [step(loop_id, new_id())])
        assert await client.commit(loop_id, 0, start) == first
        records = await stored(cnc, r3, loop_id)
        assert [s for s, _, _ in records] == [*first.seqs, *res.seqs, *nxt.seqs]


async def test_loop_api_reads_its_own_writes_on_r3(r3: Settings, cnc: NATS) -> None:
    """Commands right after each other never see a lagging replica's older history."""
    async with running_committer(r3), running_committer(r3):
        api = LoopClient(cnc, r3.names, T)
        for _ in range(10):
            loop = await api.start()
            first = await api.input(loop.loop_id, "hello")
            await api.close(loop.loop_id)
            assert (await api.input(loop.loop_id, "hello", command_id=first.command_id)).seq == first.seq
            with pytest.raises(ClosedError):
                await api.input(loop.loop_id, "again")


async def test_existing_stream_with_other_replicas_is_reported(nats_cluster: NatsCluster, cnc: NATS) -> None:
    one = cluster_settings(nats_cluster, replicas=1)
    js = cnc.jetstream(timeout=10)
    await ensure_history_stream(js, one)
    three = cluster_settings(nats_cluster, prefix=one.prefix)
    with pytest.raises(IncompatibleConfigError) as err:
        await ensure_history_stream(js, three)
    assert set(err.value.differences) == {"num_replicas"}
    assert "num_replicas" in str(err.value)


async def test_lost_quorum_answers_unavailable_then_the_same_commit_succeeds(nats_cluster: NatsCluster) -> None:
    # Committer and client both talk to one node only, which stays up; the other two are stopped.
    keep = nats_cluster.nodes[0]
    settings = cluster_settings(nats_cluster, commit_retry_seconds=2.0, nats_urls=(keep.url,))
    nc = await connect(settings, name="quorum-test")
    try:
        async with running_committer(settings):
            client = CommitClient(nc, settings.names, T)
            loop_id = new_id()
            first = await client.commit(loop_id, 0, [loop_started(loop_id)])
            record = [step(loop_id, new_id())]
            try:
                for n in nats_cluster.nodes[1:]:
                    n.stop()
                t0 = time.monotonic()
                with pytest.raises(UnavailableError):
                    await client.commit(loop_id, first.last_seq, record)
                assert time.monotonic() - t0 >= 1.5  # it retried for commit_retry_seconds first
            finally:
                restore(nats_cluster)
            with anyio.fail_after(60):
                while True:
                    try:
                        res = await client.commit(loop_id, first.last_seq, record)
                        break
                    except UnavailableError:
                        await anyio.sleep(0.2)
            records = await stored(nc, settings, loop_id)
            assert [s for s, _, _ in records] == [first.last_seq, res.last_seq]
    finally:
        await nc.close()


async def test_stream_leader_sigkill_during_20_loops_of_appends(nats_cluster: NatsCluster, tmp_path: Path) -> None:
    settings = cluster_settings(nats_cluster, commit_retry_seconds=20.0)
    env = {
        "LW_NATS_URL": ",".join(nats_cluster.urls),
        "LW_PREFIX": settings.prefix,
        "LW_REPLICAS": "3",
        "LW_COMMIT_RETRY_SECONDS": "20",
        "LW_LOG_LEVEL": "INFO",
    }
    committers = [
        ServiceProcess(f"committer-{i}", ["-m", "services.committer"], env, log_path=str(tmp_path / f"c{i}.log"))
        for i in range(2)
    ]
    for c in committers:
        c.start(timeout=60)
    nc = await connect(settings, name="failover-test")
    client = CommitClient(nc, settings.names, 6.0)
    acked: dict[str, list[tuple[int, str]]] = {}
    acked_after_kill: dict[str, int] = {}
    killed_at: list[float] = []
    stop = anyio.Event()
    resumed = anyio.Event()
    errors: list[BaseException] = []

    async def commit(loop_id: str, expected: int, events: list) -> int:  # type: ignore[type-arg]
        # Retry the identical commit until it is acknowledged: this is what makes appends exactly-once.
        while True:
            try:
                return (await client.commit(loop_id, expected, events)).last_seq
            except UnavailableError:
                await anyio.sleep(0.1)

    async def run_loop() -> None:
        loop_id = new_id()
        acked[loop_id] = []
        acked_after_kill[loop_id] = 0
        try:
            start = loop_started(loop_id)
            last = await commit(loop_id, 0, [start])
            acked[loop_id].append((last, start.event_id))
            turn = new_id()
            while not stop.is_set():
                record = step(loop_id, turn, f"{len(acked[loop_id])}")
                last = await commit(loop_id, last, [record])
                acked[loop_id].append((last, record.event_id))
                if killed_at:
                    acked_after_kill[loop_id] += 1
                    if len(acked_after_kill) == 20 and min(acked_after_kill.values()) >= 5:
                        resumed.set()
        except BaseException as e:  # reported below; any error (a conflict!) fails the test
            errors.append(e)
            raise

    try:
        async with anyio.create_task_group() as tg:
            for _ in range(20):
                tg.start_soon(run_loop)
            await anyio.sleep(1.5)
            leader = nats_cluster.stream_leader(settings.names.history_stream)
            assert leader is not None
            before = sum(len(v) for v in acked.values())
            leader.kill()
            killed_at.append(time.monotonic())
            # Commits must resume: every loop gets acknowledgements after the kill.
            with anyio.fail_after(60):
                await resumed.wait()
            stop.set()
        recovered = time.monotonic() - killed_at[0]
        assert not errors
        restore(nats_cluster)
        total = 0
        for loop_id, acks in acked.items():
            records = await stored(nc, settings, loop_id)
            # every acknowledged append is stored exactly once, at the acknowledged sequence, in order
            assert [(s, mid) for s, _, mid in records] == acks, loop_id
            assert await predecessors_chain(nc, settings, loop_id), loop_id
            total += len(acks)
        assert total > before
        sys.stderr.write(f"failover: {total} appends, {before} before the kill; all resumed after {recovered:.1f}s\n")
    finally:
        await nc.close()
        for c in committers:
            c.stop()
        restore(nats_cluster)
    for c in committers:
        assert c.proc is not None and c.proc.returncode == 0, c.log_tail()
