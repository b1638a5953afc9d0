"""A loopwire deployment for the benchmarks: nats-server(s) and every service as its own OS process.

:class:`Deployment` starts one nats-server (R1) or a 3-node cluster (R3: every process connects to
its first node, ``LW_NATS_IN_ORDER``, like the floor's clients), ``replicas`` committers,
calculator tool workers and model-step replicas (a ``services.deployment`` :class:`Deployment`),
and runs loops of the workload through the loop API.

Step timings are the records' own: JetStream stamps every stored message with the server's clock
(``Nats-Time-Stamp``), and :meth:`Deployment.run_loops` reads the loops' records back once they
are all idle, after the measured part. While loops run, the benchmark only asks, every
``POLL_SECONDS``, for the sequence of the history stream's last record (one Direct Get: the stream
deletes nothing, so it counts the records) and, once that many could be the whole run, the last
record of each loop still running (one batched Direct Get): the measured processes see no
observer's traffic. A loop followed live (``start_loop(..., watch=True)``, the
resume figure) is observed instead through a core subscription to its history subject: the
committer's JetStream publish reaches core subscribers too. Core subscribers also see the
publishes JetStream turns down (a retried append), so those records are counted once per event id.
"""

from __future__ import annotations

import asyncio
import datetime
import itertools
import os
import shutil
import signal
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from bench.common import pct
from bench.natsconf import SYNC_DEFAULT, SyncedNatsServer
from bench.workload import USER_TEXT, write_script
from services import deployment
from shared.client import LoopClient
from shared.connect import connect
from shared.connection import request
from shared.events import Limits
from shared.natsserver import NatsCluster, NatsServer
from shared.procs import ServiceProcess, Supervisor
from shared.settings import Settings
from shared.streamreads import direct_get_batch
from shared.streams import ensure_all
from shared.subjects import H_SEQUENCE, H_TIMESTAMP, js_api

PREFIX = "bench"
POLL_SECONDS = 0.05  # how often run_loops looks for the end of its loops (the figures do not depend on it)
BIG_LIMITS = Limits(max_iterations=1_000_000, max_calls_per_turn=1_000_000)

_TYPE_AT = len(b'{"v":1,"type":"')


def record_type(data: bytes) -> str:
    """The event type of a stored envelope (``{"v":1,"type":"<Name>",...``) without decoding it."""
    end = data.find(b'"', _TYPE_AT)
    return data[_TYPE_AT:end].decode() if end > 0 else ""


def stored_at(stamp: str) -> float:
    """``Nats-Time-Stamp`` (RFC 3339 UTC with nanoseconds) as ``time.time()`` seconds."""
    whole, _, frac = stamp.rstrip("Z").partition(".")
    seconds = datetime.datetime.fromisoformat(whole).replace(tzinfo=datetime.UTC).timestamp()
    return seconds + (int(frac[:9].ljust(9, "0")) / 1e9 if frac else 0.0)


def event_id(data: bytes) -> bytes:
    """The ``event_id`` of a stored envelope, found without decoding it (b"" if absent)."""
    i = data.find(b'"event_id":"')
    return data[i + 12 : i + 48] if i >= 0 else b""


def event_ids(data: bytes) -> set[bytes]:
    """Every ``event_id`` in a message (e.g. the envelopes of a commit request), without decoding it."""
    out: set[bytes] = set()
    i = data.find(b'"event_id":"')
    while i >= 0:
        out.add(data[i + 12 : i + 48])
        i = data.find(b'"event_id":"', i + 48)
    return out


@dataclass
class LoopTrace:
    """Commit times of one loop's records, by type (``time.time()`` seconds in :meth:`Deployment.run_loops`,
    ``perf_counter`` for a loop followed live)."""

    started: float = 0.0
    seen: set[bytes] = field(default_factory=set)  # event ids: a retried publish is delivered again
    turn_started: float = 0.0
    steps: list[float] = field(default_factory=list)
    step_ids: list[bytes] = field(default_factory=list)  # the event id of each of ``steps``
    idle: float = 0.0
    done: asyncio.Event = field(default_factory=asyncio.Event)

    def step_intervals(self, tool_steps: int) -> list[float]:
        """Per-step cycle times of the ``tool_steps`` tool steps (TurnStarted → step 1 → step 2 ...)."""
        times = [self.turn_started, *self.steps[:tool_steps]]
        return [b - a for a, b in itertools.pairwise(times)]


@dataclass
class LoopsRun:
    loops: int
    steps: int
    seconds: float
    traces: dict[str, LoopTrace]

    @property
    def intervals(self) -> list[float]:
        out: list[float] = []
        for t in self.traces.values():
            out.extend(t.step_intervals(self.steps))
        return out

    @property
    def rate(self) -> float:
        return self.loops * self.steps / self.seconds if self.seconds else 0.0

    def summary(self) -> dict[str, Any]:
        iv = self.intervals
        return {
            "loops": self.loops,
            "steps_per_loop": self.steps,
            "seconds": round(self.seconds, 4),
            "steps_per_s": round(self.rate, 1),
            "step_p50_ms": round(pct(iv, 0.5) * 1000, 3),
            "step_p99_ms": round(pct(iv, 0.99) * 1000, 3),
        }


@dataclass
class Deployment:
    replicas: int = 1  # processes of each service
    cluster: bool = False  # 3-node cluster, R3 streams
    shards: int = 1  # LW_SHARDS
    nodes: int = 3  # cluster size
    env_extra: dict[str, str] = field(default_factory=dict)
    sync_interval: str = SYNC_DEFAULT  # JetStream's fsync policy on the single server (bench/natsconf.py)
    work: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="lw-bench-")))
    server: NatsServer | None = None
    nats_cluster: NatsCluster | None = None
    urls: list[str] = field(default_factory=list)
    nc: NATS | None = None
    services: deployment.Deployment | None = None
    _traces: dict[str, LoopTrace] = field(default_factory=dict)

    @property
    def settings(self) -> Settings:
        return Settings.from_env(
            {},
            nats_urls=tuple(self.urls),
            prefix=PREFIX,
            replicas=3 if self.cluster else 1,
            nats_in_order=self.cluster,
            shards=self.shards,
        )

    @property
    def sup(self) -> Supervisor:
        assert self.services is not None, "start_nats() first"
        return self.services.sup

    # --- life cycle

    def start_nats(self) -> None:
        if self.cluster:
            if self.sync_interval:
                raise ValueError("sync_interval is set on the single server only")
            self.nats_cluster = NatsCluster(base_dir=str(self.work / "nats"), size=self.nodes).start()
            self.urls = self.nats_cluster.urls
        else:
            server = SyncedNatsServer(store_dir=str(self.work / "nats"), sync_interval=self.sync_interval)
            self.server = server.start()
            self.urls = [self.server.url]
        extra = {
            # On the cluster every process connects to the first node, as the floor's clients do.
            "LW_NATS_IN_ORDER": "1" if self.cluster else "0",
            "LW_MODEL_STEP_CONCURRENCY": "512",
            **self.env_extra,
        }
        self.services = deployment.Deployment.for_settings(self.settings, self.work, log_level="WARNING", env=extra)

    def _svc(self, name: str, args: list[str]) -> ServiceProcess:
        assert self.services is not None, "start_nats() first"
        return self.services.start(name, args, timeout=60)

    def start_committers(self) -> None:
        for _ in range(self.replicas):
            self._svc("committer", deployment.service_command("committer"))

    def start_tools(self) -> None:
        for _ in range(self.replicas):
            self._svc("tools", deployment.tool_command("calculator"))

    def start_model_steps(self) -> None:
        for _ in range(self.replicas):
            self.model_step()

    def model_step(self) -> ServiceProcess:
        return self._svc("model-step", deployment.service_command("model-step"))

    def start(self) -> Deployment:
        self.start_nats()
        self.start_committers()
        self.start_tools()
        self.start_model_steps()
        return self

    async def connect(self) -> NATS:
        self.nc = await connect(self.settings, name="bench")
        await ensure_all(self.nc.jetstream(timeout=10), self.settings)
        return self.nc

    async def close(self) -> None:
        if self.nc is not None:
            await self.nc.close()
            self.nc = None

    def stop(self) -> None:
        if self.services is not None:
            self.services.stop_all(timeout=10)
        if self.nats_cluster is not None:
            self.nats_cluster.cleanup()
        if self.server is not None:
            self.server.cleanup()
        shutil.rmtree(self.work, ignore_errors=True)

    def pids(self, name: str) -> list[int]:
        return [s.pid for s in self.sup.by_name(name) if s.running]

    def kill(self, svc: ServiceProcess) -> None:
        os.kill(svc.pid, signal.SIGKILL)
        svc.kill()

    # --- observing commits

    async def _on_record(self, msg: Msg) -> None:
        self._trace_record(
            self._traces.get(self.settings.names.loop_of_hist(msg.subject)), msg.data, time.perf_counter()
        )

    @staticmethod
    def _trace_record(trace: LoopTrace | None, data: bytes, t: float) -> None:
        if trace is None:
            return
        eid = event_id(data)
        if eid in trace.seen:
            return
        trace.seen.add(eid)
        kind = record_type(data)
        if kind == "StepDone":
            trace.steps.append(t)
            trace.step_ids.append(eid)
        elif kind == "TurnStarted":
            trace.turn_started = t
        elif kind == "LoopIdle":
            trace.idle = t
            trace.done.set()

    # --- running loops

    async def start_loop(self, model: str, loop_id: str | None = None, *, watch: bool = False) -> str:
        """Start a loop and send its input; ``watch``: follow its records live (:meth:`trace`)."""
        assert self.nc is not None
        lid = loop_id or str(uuid.uuid4())
        trace = self._traces[lid] = LoopTrace(started=time.perf_counter() if watch else time.time())
        if watch:
            names = self.settings.names
            await self.nc.subscribe(names.hist_in(names.shard_of(lid), lid), cb=self._on_record)
        lc = LoopClient(self.nc, self.settings.names, timeout=60)
        await lc.start(lid, model=model, tools=["calculator"], limits=BIG_LIMITS)
        await lc.input(lid, USER_TEXT)
        assert trace is self._traces[lid]
        return lid

    async def run_loops(
        self, loops: int, steps: int, *, timeout: float = 600.0, on_done: Callable[[], None] | None = None
    ) -> LoopsRun:
        """Start ``loops`` loops of ``steps`` tool steps at once; wait until every one is idle.

        ``on_done`` runs as soon as the last loop is idle, before the records are read back for
        their timestamps (e.g. to end a CPU measurement there).
        """
        assert self.nc is not None
        model = write_script(self.work / "scripts", steps)
        names = self.settings.names
        before = await self._last_seq()
        t0 = time.time()
        sem = asyncio.Semaphore(64)

        async def start_one() -> str:
            async with sem:
                return await self.start_loop(model)

        ids = await asyncio.gather(*(start_one() for _ in range(loops)))
        # A loop that ran as scripted holds LoopStarted, InputSubmitted, TurnStarted, its steps + 1
        # StepDone records, TurnDone and LoopIdle.
        await asyncio.wait_for(self._until_idle(ids, before + loops * (steps + 6)), timeout)
        if on_done is not None:
            on_done()
        traces = {lid: self._traces.pop(lid) for lid in ids}
        for lid, trace in traces.items():
            k = names.shard_of(lid)  # a loop started here lives in its own shard
            got = await direct_get_batch(self.nc, names.history_stream_of(k), names.hist_in(k, lid), start_seq=1)
            for m in got.messages:
                self._trace_record(trace, m.data, stored_at(m.headers.get(H_TIMESTAMP, "")))
        seconds = max(t.idle for t in traces.values()) - t0
        bad = [lid for lid, t in traces.items() if len(t.steps) != steps + 1]
        if bad:
            raise RuntimeError(
                f"{len(bad)} loop(s) did not commit {steps + 1} steps; e.g. {bad[0]}: {await self.describe(bad[0])}"
            )
        return LoopsRun(loops=loops, steps=steps, seconds=seconds, traces=traces)

    async def _last_seq(self) -> int:
        """The history streams' last sequences, added up (they delete nothing: the records stored): a
        Direct Get of each one's last record, no JetStream API request (those make nats-server build a
        stream-info document and an audit advisory)."""
        assert self.nc is not None
        names = self.settings.names
        total = 0
        for k in names.shard_ids:
            body = msgspec.json.encode({"last_by_subj": names.hist_all_of(k)})
            msg = await request(self.nc, js_api("DIRECT.GET", names.history_stream_of(k)), body, timeout=10)
            total += int((msg.headers or {}).get(H_SEQUENCE, "0"))  # "404, no message": an empty stream
        return total

    async def _until_idle(self, ids: list[str], at_least: int) -> None:
        """Return once every loop's last record is its LoopIdle.

        ``at_least``: the stream's last sequence once every loop ran as scripted; before that only
        the last sequence is read, and each loop's last record once a second (a loop that ended
        otherwise, with fewer records, is found so).
        """
        assert self.nc is not None
        names = self.settings.names
        left = {(names.shard_of(lid), names.hist_in(names.shard_of(lid), lid)) for lid in ids}
        for polls in itertools.count(1):
            if not left:
                return
            await asyncio.sleep(POLL_SECONDS)
            if await self._last_seq() < at_least and polls % round(1 / POLL_SECONDS):
                continue
            for k in names.shard_ids:
                mine = sorted(subject for shard, subject in left if shard == k)
                if not mine:
                    continue
                got = await direct_get_batch(self.nc, names.history_stream_of(k), "", start_seq=0, multi_last=mine)
                left -= {(k, m.subject) for m in got.messages if record_type(m.data) == "LoopIdle"}

    async def describe(self, loop_id: str) -> str:
        """A short account of a loop's committed history (for error messages)."""
        from shared.events import StepDone
        from shared.replay import replay

        assert self.nc is not None
        kinds: list[str] = []
        errors: list[str] = []
        async for _, e in replay(self.nc, loop_id, names=self.settings.names):
            kinds.append(type(e).__name__)
            if isinstance(e, StepDone):
                for m in e.messages[1:]:
                    if getattr(m, "is_error", False):
                        errors.append(str(m.blocks)[:120])
            elif hasattr(e, "err"):
                errors.append(str(e.err)[:200])
        counts = {k: kinds.count(k) for k in dict.fromkeys(kinds)}
        return f"{counts}; errors: {errors[:2]}"

    def trace(self, loop_id: str) -> LoopTrace:
        return self._traces[loop_id]

    async def stream_bytes(self) -> tuple[int, int]:
        """(bytes, messages) of the history streams."""
        assert self.nc is not None
        names = self.settings.names
        size = count = 0
        for k in names.shard_ids:
            info = await self.nc.jetstream(timeout=10).stream_info(names.history_stream_of(k))
            size, count = size + int(info.state.bytes), count + int(info.state.messages)
        return size, count

    async def warm_up(self, steps: int = 20) -> None:
        """Wait until every tool worker is registered, then run a few loops through every replica."""
        assert self.nc is not None
        kv = await self.nc.jetstream(timeout=10).key_value(self.settings.names.tools_bucket)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                keys = await kv.keys()
            except Exception:
                keys = []
            if len([k for k in keys if k.startswith("calculator.")]) >= self.replicas:
                break
            await asyncio.sleep(0.1)
        await asyncio.sleep(0.3)  # the model-steps' registry watch sees the entries within milliseconds
        await self.run_loops(max(2, 2 * self.replicas), steps, timeout=120)
