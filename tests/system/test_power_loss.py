"""Power loss: a 3-node R3 cluster whose disks lose every write not fsynced (tests/system/powerfs.py)
loses power on 2 nodes, then on all 3 at once, while real services drive loops; afterwards every
record acknowledged before the cuts must still be stored, unchanged, at its sequence.

With ``sync_interval: always`` (loopwire's configuration) nothing acknowledged is lost. With
nats-server's default interval the loss is printed as a figure (docs/reliability.md has the runs).
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import anyio
import pytest
from nats.aio.client import Client as NATS

from shared import events as ev
from shared.codec import decode_event
from shared.connect import connect
from shared.errors import LoopwireError
from shared.jserrors import ERR_STREAM_NOT_FOUND, JetStreamError, JetStreamUnavailableError
from shared.settings import Settings
from shared.streamreads import get_msg
from tests import natsfixtures
from tests.system.clusterops import stream_leader
from tests.system.faultload import Load
from tests.system.faultscript import write_model
from tests.system.fleet import fleet
from tests.system.powermounts import PowerCluster, fuse_missing, power_cluster

pytestmark = [pytest.mark.anyio, pytest.mark.cluster, pytest.mark.system]

LOOPS = 6
STEPS = 40
# The committers first: they create the streams and buckets the others look up at start-up.
COMMITTERS = {"committer": 2}
OTHERS = {"model-step": 2, "tools-calc": 2}
STEPS_BEFORE_CUT = 30  # acknowledged steps before each power cut


def long_script() -> dict[str, object]:
    """STEPS steps of one calculator call each, then a final text: a loop that keeps committing."""
    args = json.dumps({"expression": "1+1"})
    call = [
        {"kind": "tool_use", "index": 0, "id": "calc_{k}", "name": "calculator"},
        {"kind": "tool_use", "index": 0, "text": args},
        {"kind": "finish", "finish_reason": "tool_use"},
    ]
    end = [{"kind": "text", "text": "done"}, {"kind": "finish", "finish_reason": "end_turn"}]
    return {"responses": [*([call] * (STEPS - 1)), end]}


@dataclass(frozen=True, slots=True)
class Seen:
    subject: str
    digest: str
    step: bool  # a StepDone record


@dataclass
class Recorder:
    """Reads the history stream from its leader, record after record: a record read there is stored
    on a quorum of the stream's replicas, the point at which JetStream acknowledged its write."""

    nc: NATS
    stream: str
    seen: dict[int, Seen] = field(default_factory=dict)
    next_seq: int = 1
    recording: bool = True

    async def run(self) -> None:
        while self.recording:
            try:
                m = await get_msg(self.nc, self.stream, seq=self.next_seq, request_timeout=1.0)
            except (JetStreamError, JetStreamUnavailableError, LoopwireError, TimeoutError):
                await anyio.sleep(0.2)
                continue
            if m is None or m.seq != self.next_seq:
                await anyio.sleep(0.05)
                continue
            if self.recording:
                self.seen[m.seq] = seen_of(m.subject, m.data)
            self.next_seq += 1

    @property
    def steps(self) -> int:
        return sum(1 for s in self.seen.values() if s.step)

    async def until_steps(self, n: int, timeout: float = 25.0) -> None:
        """Until ``n`` steps are acknowledged (or ``timeout``: the cut lands anyway)."""
        with anyio.move_on_after(timeout):
            while self.steps < n:
                await anyio.sleep(0.05)


def seen_of(subject: str, data: bytes) -> Seen:
    try:
        step = isinstance(decode_event(data), ev.StepDone)
    except LoopwireError:
        step = False
    return Seen(subject, hashlib.sha256(data).hexdigest(), step)


@dataclass
class Outcome:
    sync: str
    acked_records: int = 0
    acked_steps: int = 0
    lost_records: int = 0
    lost_steps: int = 0
    stream_recovered: bool = True
    # after the cut of 2 nodes, of what was acknowledged before it (the third node kept its page cache)
    acked_records_2_of_3: int = 0
    lost_records_2_of_3: int = 0
    lost_steps_2_of_3: int = 0
    sync_warnings: int = 0  # "does not sync" lines in the first committer's log (one per server)
    dropped: list[str] = field(default_factory=list)  # per power cut: unsynced files / bytes dropped
    notes: list[str] = field(default_factory=list)


async def stored_after(nc: NATS, stream: str, seqs: list[int], timeout: float = 30.0) -> dict[int, Seen] | None:
    """What the recovered stream holds at ``seqs`` (None: the stream did not come back)."""
    deadline = time.monotonic() + timeout
    out: dict[int, Seen] = {}
    pending = list(seqs)
    while pending and time.monotonic() < deadline:
        seq = pending[0]
        try:
            m = await get_msg(nc, stream, seq=seq, request_timeout=2.0)
        except JetStreamError as e:
            if e.err_code == ERR_STREAM_NOT_FOUND and time.monotonic() > deadline - timeout / 2:
                return None  # stream not found, long after the cluster came back
            await anyio.sleep(0.3)
            continue
        except (JetStreamUnavailableError, LoopwireError, TimeoutError):
            await anyio.sleep(0.3)
            continue
        if m is not None:
            out[seq] = seen_of(m.subject, m.data)
        pending.pop(0)
    return out if not pending else None


def count_lost(acked: dict[int, Seen], stored: dict[int, Seen] | None) -> tuple[int, int]:
    """(records, steps) of ``acked`` not stored unchanged at their sequence."""
    lost = [seen for seq, seen in acked.items() if stored is None or stored.get(seq) != seen]
    return len(lost), sum(1 for seen in lost if seen.step)


async def power_cuts(pc: PowerCluster, rec: Recorder, out: Outcome) -> None:
    """Once steps are acknowledged cut 2 of 3 nodes (the stream leader among them) and bring them
    back; once more steps are, cut all 3 at once and bring them back."""
    t0 = time.monotonic()
    await rec.until_steps(STEPS_BEFORE_CUT)
    leader = await stream_leader(pc.cluster, rec.stream)
    two = [leader, next(n for n in pc.cluster.nodes if n is not leader)]
    before_two = dict(rec.seen)
    files, dropped = pc.cut_power(two)
    out.dropped.append(f"{'+'.join(n.name for n in two)}: {files} files / {dropped} B")
    out.notes.append(f"t+{time.monotonic() - t0:.1f}s power cut: {[n.name for n in two]} ({len(rec.seen)} acked)")
    await anyio.sleep(1.0)
    await anyio.to_thread.run_sync(lambda: pc.power_on(two))
    stored = await stored_after(rec.nc, rec.stream, sorted(before_two))
    out.acked_records_2_of_3 = len(before_two)
    out.lost_records_2_of_3, out.lost_steps_2_of_3 = count_lost(before_two, stored)
    await rec.until_steps(rec.steps + STEPS_BEFORE_CUT)
    rec.recording = False  # what was acknowledged before the cut of every node
    files, dropped = pc.cut_power(pc.cluster.nodes)
    out.dropped.append(f"all: {files} files / {dropped} B")
    out.notes.append(f"t+{time.monotonic() - t0:.1f}s power cut: all ({len(rec.seen)} acked)")
    await anyio.sleep(1.0)
    await anyio.to_thread.run_sync(lambda: pc.power_on(pc.cluster.nodes))
    await anyio.to_thread.run_sync(lambda: pc.cluster.wait_meta_leader(timeout=60))
    out.notes.append(f"t+{time.monotonic() - t0:.1f}s all back")


async def run_power_loss(sync: str, tmp_path: Path) -> Outcome:
    out = Outcome(sync)
    with power_cluster(tmp_path / "disks", sync) as pc:
        settings = Settings.from_env(
            {},
            nats_urls=tuple(pc.cluster.urls),
            prefix=natsfixtures.unique_prefix(),
            replicas=3,
            nats_monitor_urls=pc.cluster.monitor_urls,
        )
        model = write_model(tmp_path, long_script(), "long.json")
        with fleet(settings, pc.cluster, counts=COMMITTERS, log_dir=tmp_path / "logs") as f:
            f.start_all(OTHERS)
            nc = await connect(settings, name="power-loss")
            try:
                stream = settings.names.history_stream_of(0)
                rec = Recorder(nc, stream)
                load = Load(nc, settings, model, LOOPS, policy={}, command_timeout=60)
                async with anyio.create_task_group() as tg:
                    tg.start_soon(rec.run)
                    tg.start_soon(load.run, None)
                    await power_cuts(pc, rec, out)
                    tg.cancel_scope.cancel()  # the comparison needs no more traffic
                out.acked_records, out.acked_steps = len(rec.seen), rec.steps
                stored = await stored_after(nc, stream, sorted(rec.seen))
            finally:
                await nc.close()
    out.stream_recovered = stored is not None
    out.lost_records, out.lost_steps = count_lost(rec.seen, stored)
    committer_log = (tmp_path / "logs").glob("committer-*.log")
    out.sync_warnings = sum(line.count("does not sync") for line in min(committer_log).read_text().splitlines())
    return out


@pytest.mark.parametrize("sync", ["always", "default"])
async def test_power_loss_loses_nothing_acknowledged_with_sync_always(sync: str, tmp_path: Path) -> None:
    missing = fuse_missing()
    assert not missing, f"the power-loss test needs FUSE (.ci/run installs fuse3 and mfusepy): {missing}"
    out = await run_power_loss(sync, tmp_path)
    print(f"\npower loss, sync_interval {sync}: " + json.dumps(asdict(out), indent=1))
    assert out.acked_steps >= LOOPS, out  # the cuts landed mid-traffic, after steps were acknowledged
    if sync == "always":
        assert out.stream_recovered, out
        assert out.lost_records == 0 and out.lost_steps == 0, out
        assert out.lost_records_2_of_3 == 0, out
        assert out.sync_warnings == 0, out
    else:
        assert out.sync_warnings == 3, out  # one line per server, at start-up
