"""One run of the ``scale`` scenario: a nats-server cluster, sharded loopwire services, loops, a measured window.

:class:`ScaleDeployment` starts a cluster of ``nodes`` nats-servers (R3 streams, or R1), ``LW_SHARDS`` =
``shards``, and ``per_node`` committers, model-steps and calculator tool workers per node; process i
of each role connects to node i first (``LW_NATS_URL`` rotated, ``LW_NATS_IN_ORDER=1``).

:func:`run_loops` starts the loops of the workload (bench/workload.py) at once and follows the sum of
the history streams' last sequences (one Direct Get per shard each poll; the streams delete
nothing, so it counts the records). The measured window runs from the poll that sees ``WINDOW[0]``
of the run's records committed to the one that sees ``WINDOW[1]`` of them: every loop is running
then, and nearly every record is a StepDone (one per tool step). The CPU of every process
(:class:`bench.meter.RunMeter`) and of the machine (``/proc/stat``) is read at the same two polls.
Before the services start, :func:`shared.placement.balance` moves the shards' stream leaders over
the nodes; the leaders reported are those read after the warm-up.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
from nats.aio.client import Client as NATS

from bench import cpuquota
from bench.common import cpu_stat
from bench.lw import BIG_LIMITS, PREFIX, record_type, stored_at
from bench.meter import RunMeter
from bench.scalefigures import RunFigures, busy_share, rotated
from bench.workload import TOOL, USER_TEXT, write_script
from services import deployment
from shared import placement
from shared.client import LoopClient
from shared.connect import connect
from shared.connection import request
from shared.natsserver import NatsCluster
from shared.settings import Settings
from shared.streamreads import direct_get_batch
from shared.streams import ensure_all
from shared.subjects import H_SEQUENCE, H_TIMESTAMP, js_api

POLL_SECONDS = 0.05
WINDOW = (0.2, 0.8)  # the measured share of the run's records: from, to
# Before a run: wait up to QUIET_WAIT_SECONDS for a second with the machine under QUIET_BUSY busy.
QUIET_BUSY = 0.3
QUIET_WAIT_SECONDS = 120.0
ROLES: tuple[tuple[str, list[str]], ...] = (
    ("committer", deployment.service_command("committer")),
    ("model-step", deployment.service_command("model-step")),
    ("tools", deployment.tool_command(TOOL)),
)


@dataclass
class ScaleDeployment:
    nodes: int
    shards: int
    per_node: int = 1
    work: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="lw-scale-")))
    cluster: NatsCluster | None = None
    services: deployment.Deployment | None = None
    nc: NATS | None = None
    server_cpu: float | None = None  # each nats-server's CPU quota in cores (None: unlimited)
    replicas: int = 3  # of every stream and bucket
    _groups: list[Path] = field(default_factory=list)

    @property
    def urls(self) -> list[str]:
        assert self.cluster is not None, "start_nats() first"
        return self.cluster.urls

    @property
    def settings(self) -> Settings:
        return Settings.from_env(
            {},
            nats_urls=tuple(self.urls),
            prefix=PREFIX,
            replicas=self.replicas,
            nats_in_order=True,
            shards=self.shards,
        )

    def start_nats(self) -> None:
        self.cluster = NatsCluster(size=self.nodes, base_dir=str(self.work / "nats")).start()
        if self.server_cpu is not None:
            for name, pid in self.server_pids().items():
                self._groups.append(cpuquota.limit(pid, self.server_cpu, name))

    async def connect(self) -> NATS:
        """Connect (to the first node) and create every shard's streams and buckets."""
        self.nc = await connect(self.settings, name="bench")
        await ensure_all(self.nc.jetstream(timeout=10), self.settings, wait_seconds=60)
        return self.nc

    def start_services(self) -> None:
        """Every role's processes at once, process i of a role connecting to node i first."""
        env = {"LW_SHARDS": str(self.shards), "LW_NATS_IN_ORDER": "1", "LW_MODEL_STEP_CONCURRENCY": "512"}
        self.services = deployment.Deployment.for_settings(self.settings, self.work, log_level="WARNING", env=env)
        procs = [
            self.services.process(role, args, {"LW_NATS_URL": ",".join(rotated(self.urls, i))})
            for role, args in ROLES
            for i in range(self.nodes * self.per_node)
        ]
        self.services.start_all(procs, timeout=60)

    def server_pids(self) -> dict[str, int]:
        assert self.cluster is not None
        return {n.name: n.proc.pid for n in self.cluster.nodes if n.proc is not None}

    def service_pids(self) -> dict[str, int]:
        assert self.services is not None
        counts: dict[str, int] = {}
        out: dict[str, int] = {}
        for p in self.services.processes:
            k = counts[p.name] = counts.get(p.name, 0) + 1
            out[f"{p.name}-{k}"] = p.pid
        return out

    def http_ports(self) -> list[int]:
        assert self.cluster is not None
        return [n.http_port for n in self.cluster.nodes]

    async def close(self) -> None:
        if self.nc is not None:
            await self.nc.close()
            self.nc = None

    def stop(self) -> None:
        if self.services is not None:
            self.services.stop_all(timeout=10)
        if self.cluster is not None:
            self.cluster.cleanup()
        for group in self._groups:
            cpuquota.release(group)
        shutil.rmtree(self.work, ignore_errors=True)

    def log_tails(self) -> str:
        return self.services.log_tails() if self.services is not None else ""


# --- stream leaders


async def leaders(d: ScaleDeployment) -> dict[str, int]:
    """How many of the shards' streams each node leads (stream info ``cluster.leader``)."""
    assert d.nc is not None
    counts = dict.fromkeys(d.server_pids(), 0)
    for p in await placement.read(d.nc, d.settings.names):
        counts[p.leader or "?"] = counts.get(p.leader or "?", 0) + 1
    return counts


# --- the loops


async def _records(nc: NATS, d: ScaleDeployment) -> int:
    """Records in every history stream: the sum of their last sequences (one Direct Get each)."""
    names = d.settings.names
    total = 0
    for k in names.shard_ids:
        body = msgspec.json.encode({"last_by_subj": names.hist_all_of(k)})
        msg = await request(nc, js_api("DIRECT.GET", names.history_stream_of(k)), body, timeout=10)
        total += int((msg.headers or {}).get(H_SEQUENCE, "0"))  # "404, no message": an empty stream
    return total


async def _last_records(nc: NATS, d: ScaleDeployment, ids: list[str]) -> dict[str, tuple[str, float]]:
    """Each loop's last record: (event type, stored at), by loop id."""
    names = d.settings.names
    out: dict[str, tuple[str, float]] = {}
    for k in names.shard_ids:
        subjects = sorted(names.hist_in(k, lid) for lid in ids if names.shard_of(lid) == k)
        for i in range(0, len(subjects), 256):
            got = await direct_get_batch(
                nc, names.history_stream_of(k), "", start_seq=0, multi_last=subjects[i : i + 256]
            )
            for m in got.messages:
                out[names.loop_of_hist(m.subject)] = (record_type(m.data), stored_at(m.headers.get(H_TIMESTAMP, "")))
    return out


async def _start_loops(d: ScaleDeployment, model: str, loops: int) -> list[str]:
    assert d.nc is not None
    lc = LoopClient(d.nc, d.settings.names, timeout=60)
    sem = asyncio.Semaphore(64)

    async def one() -> str:
        lid = str(uuid.uuid4())
        async with sem:
            await lc.start(lid, model=model, tools=[TOOL], limits=BIG_LIMITS)
            await lc.input(lid, USER_TEXT)
        return lid

    return list(await asyncio.gather(*(one() for _ in range(loops))))


@dataclass
class _Window:
    """The two polls that bound the measured part of a run."""

    meter: RunMeter
    t: list[float] = field(default_factory=list)
    n: list[int] = field(default_factory=list)
    stat: list[list[int] | None] = field(default_factory=list)

    def mark(self, t: float, n: int) -> None:
        self.t.append(t)
        self.n.append(n)
        self.stat.append(cpu_stat())
        (self.meter.begin if len(self.t) == 1 else self.meter.end)()


async def _follow(
    d: ScaleDeployment, ids: list[str], expected: int, base: int, window: _Window | None, timeout: float
) -> dict[str, tuple[str, float]]:
    """Poll until every loop is idle, marking the window's edges; the loops' last records."""
    assert d.nc is not None
    deadline = time.monotonic() + timeout
    polls = 0
    while time.monotonic() < deadline:
        await asyncio.sleep(POLL_SECONDS)
        polls += 1
        t_ask = time.perf_counter()
        n = await _records(d.nc, d) - base
        t = (t_ask + time.perf_counter()) / 2
        if window is not None and len(window.t) < 2 and n >= WINDOW[len(window.t)] * expected:
            window.mark(t, n)
        if n < expected and polls % round(1 / POLL_SECONDS):
            continue
        last = await _last_records(d.nc, d, ids)
        if len(last) == len(ids) and all(kind == "LoopIdle" for kind, _ in last.values()):
            return last
    raise TimeoutError(f"{len(ids)} loops not idle after {timeout:g}s")


async def run_loops(
    d: ScaleDeployment, loops: int, steps: int, *, measured: bool = True, timeout: float = 900.0
) -> RunFigures | None:
    """``loops`` loops of ``steps`` tool steps at once; with ``measured``, the figures of the window."""
    assert d.nc is not None and d.cluster is not None
    model = write_script(d.work / "scripts", steps)
    base = await _records(d.nc, d)
    # A loop that ran as scripted holds LoopStarted, InputSubmitted, TurnStarted, steps + 1 StepDone
    # records, TurnDone and LoopIdle.
    expected = loops * (steps + 6)
    servers, services = d.server_pids(), d.service_pids()
    pids = {**{f"nats-{k}": v for k, v in servers.items()}, **services, "bench": os.getpid()}
    window = _Window(RunMeter(pids, d.http_ports())) if measured else None
    t0 = time.time()
    ids = await _start_loops(d, model, loops)
    last = await _follow(d, ids, expected, base, window, timeout)
    got = await _records(d.nc, d) - base
    if got != expected:
        raise RuntimeError(f"{loops} loops committed {got} records, not {expected}: some did not run as scripted")
    if window is None:
        return None
    if len(window.t) < 2:
        raise RuntimeError("the run ended before its measured window did (too few steps per loop?)")
    cpu = window.meter.cpu
    return RunFigures(
        nodes=d.nodes,
        shards=d.shards,
        round=0,
        seconds=window.t[1] - window.t[0],
        steps=window.n[1] - window.n[0],
        servers={k: cpu.get(f"nats-{k}", 0.0) for k in servers},
        services={k: cpu.get(k, 0.0) for k in services},
        bench=cpu.get("bench", 0.0),
        machine_busy=busy_share(window.stat[0], window.stat[1]),
        cpus=os.cpu_count() or 1,
        run_seconds=max(at for _, at in last.values()) - t0,
        run_steps=loops * steps,
    )


async def warm_up(d: ScaleDeployment, steps: int = 5) -> None:
    """Wait until every tool worker is registered, then run a few loops through the services."""
    assert d.nc is not None
    kv = await d.nc.jetstream(timeout=10).key_value(d.settings.names.tools_bucket)
    workers = d.nodes * d.per_node
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            keys = await kv.keys()
        except Exception:
            keys = []
        if len([k for k in keys if k.startswith(f"{TOOL}.")]) >= workers:
            break
        await asyncio.sleep(0.1)
    await asyncio.sleep(0.3)  # the model-steps' registry watch sees the entries within milliseconds
    await run_loops(d, 4 * workers, steps, measured=False, timeout=120)


async def quiet(limit: float = QUIET_BUSY, wait: float = QUIET_WAIT_SECONDS) -> float | None:
    """Wait (up to ``wait`` seconds) for a second in which the machine is less than ``limit`` busy;
    the last second's busy share (other processes share this machine)."""
    deadline = time.monotonic() + wait
    while True:
        before = cpu_stat()
        await asyncio.sleep(1.0)
        busy = busy_share(before, cpu_stat())
        if busy is None or busy < limit or time.monotonic() > deadline:
            return busy


async def one_run(
    nodes: int,
    shards: int,
    loops: int,
    steps: int,
    *,
    per_node: int = 1,
    server_cpu: float | None = None,
    replicas: int = 3,
    log: Callable[[str], None] = print,
) -> RunFigures:
    """A fresh cluster, its shards' stream leaders balanced over the nodes, services, a warm-up, one measured run."""
    before = await quiet()
    d = ScaleDeployment(nodes, shards, per_node, server_cpu=server_cpu, replicas=replicas)
    try:
        d.start_nats()
        nc = await d.connect()
        await placement.balance(nc, d.settings.names)
        d.start_services()
        await warm_up(d)
        led = await leaders(d)
        figures = await run_loops(d, loops, steps)
        assert figures is not None
        figures.leaders = led
        figures.quiet_before = before
        return figures
    except BaseException:
        log(d.log_tails())
        raise
    finally:
        await d.close()
        d.stop()
