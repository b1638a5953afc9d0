"""The committer on a 3-node R3 cluster: retries of stored commits, stream config checks, lost quorum,
and a stream-leader SIGKILL during 20 concurrent loops of appends (committers as separate processes).

Tests that stop or kill nodes restart them before they end (the cluster is shared by the module).
"""

from __future__ import annotations

import sys
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import anyio
import pytest
from nats.aio.client import Client as NATS

from services.deployment import Deployment, service_command
from shared.client import CommitClient, LoopClient
from shared.connect import connect
from shared.events import Event
from shared.jserrors import IncompatibleConfigError
from shared.natsserver import NatsCluster
from shared.procs import ServiceProcess
from shared.protocol import ClosedError, UnavailableError
from shared.settings import Settings
from shared.streams import ensure_history_stream
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
from tests.system.clusterops import restore_cluster

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
                restore_cluster(nats_cluster)
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


class _Appenders:
    """20 loops appending records as fast as the committers acknowledge them, around a leader kill."""

    def __init__(self, client: CommitClient) -> None:
        self.client = client
        self.acked: dict[str, list[tuple[int, str]]] = {}
        self.acked_after_kill: dict[str, int] = {}
        self.killed_at: list[float] = []
        self.stop = anyio.Event()
        self.resumed = anyio.Event()
        self.errors: list[BaseException] = []

    async def commit(self, loop_id: str, expected: int, events: Sequence[Event]) -> int:
        # Retry the identical commit until it is acknowledged: this is what makes appends exactly-once.
        while True:
            try:
                return (await self.client.commit(loop_id, expected, events)).last_seq
            except UnavailableError:
                await anyio.sleep(0.1)

    async def run_loop(self) -> None:
        loop_id = new_id()
        self.acked[loop_id] = []
        self.acked_after_kill[loop_id] = 0
        try:
            start = loop_started(loop_id)
            last = await self.commit(loop_id, 0, [start])
            self.acked[loop_id].append((last, start.event_id))
            turn = new_id()
            while not self.stop.is_set():
                record = step(loop_id, turn, f"{len(self.acked[loop_id])}")
                last = await self.commit(loop_id, last, [record])
                self.acked[loop_id].append((last, record.event_id))
                if self.killed_at:
                    self.acked_after_kill[loop_id] += 1
                    if len(self.acked_after_kill) == 20 and min(self.acked_after_kill.values()) >= 5:
                        self.resumed.set()
        except BaseException as e:  # reported below; any error (a conflict!) fails the test
            self.errors.append(e)
            raise


def _start_committers(settings: Settings, tmp_path: Path) -> list[ServiceProcess]:
    """Two committer processes on the cluster, retrying commits for up to 20 s."""
    d = Deployment.for_settings(settings, tmp_path, env={"LW_COMMIT_RETRY_SECONDS": "20"})
    return [d.start(f"committer-{i}", service_command("committer"), timeout=60) for i in range(2)]


async def test_stream_leader_sigkill_during_20_loops_of_appends(nats_cluster: NatsCluster, tmp_path: Path) -> None:
    settings = cluster_settings(nats_cluster, commit_retry_seconds=20.0)
    committers = _start_committers(settings, tmp_path)
    nc = await connect(settings, name="failover-test")
    a = _Appenders(CommitClient(nc, settings.names, 6.0))
    try:
        async with anyio.create_task_group() as tg:
            for _ in range(20):
                tg.start_soon(a.run_loop)
            await anyio.sleep(1.5)
            leader = nats_cluster.stream_leader(settings.names.history_stream)
            assert leader is not None
            before = sum(len(v) for v in a.acked.values())
            leader.kill()
            a.killed_at.append(time.monotonic())
            # Commits must resume: every loop gets acknowledgements after the kill.
            with anyio.fail_after(60):
                await a.resumed.wait()
            a.stop.set()
        recovered = time.monotonic() - a.killed_at[0]
        assert not a.errors
        restore_cluster(nats_cluster)
        total = 0
        for loop_id, acks in a.acked.items():
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
        restore_cluster(nats_cluster)
    for c in committers:
        assert c.proc is not None and c.proc.returncode == 0, c.log_tail()
