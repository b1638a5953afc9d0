"""The loopwire scenarios: floor, step, throughput, replay (and the historical ``commit`` bench).

Every scenario returns a dict ``{"rows": [Row...], "tables": [str...], ...}``; ``ctx`` carries the
results of earlier scenarios of the same run so ratios are computed against figures measured in
that run (a scenario run alone measures the floor it needs first).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common import Row, pct, ratio, table
from bench.floor import FloorRun, floor_rows, run_floor, step_record
from bench.floorprocs import FloorProcesses
from bench.lw import Deployment
from bench.meter import RunMeter, add_cpu, rounds_summary, rounds_table
from bench.profile import Profiler, py_spy, render
from bench.replay import measure_replay, replay_rows, replay_tables
from bench.report import cpu_table, traffic_table

Ctx = dict[str, Any]


def _sizes(quick: bool) -> dict[str, int]:
    # The floor's 64-loop run is fast (about a second of CPU): 100 steps a loop, quick or not, give
    # /proc's 10 ms CPU ticks enough to count for a per-step figure.
    if quick:
        return {
            "floor_seq": 300,
            "floor_loop_steps": 100,
            "step": 200,
            "step_rounds": 4,
            "tp_steps": 20,
            "cpu_rounds": 5,
            "replay_max": 10_000,
        }
    return {
        "floor_seq": 1000,
        "floor_loop_steps": 100,
        "step": 500,
        "step_rounds": 5,
        "tp_steps": 20,
        "cpu_rounds": 7,
        "replay_max": 10_000,
    }


# --- floor ----------------------------------------------------------------------------------------


def run_floor_scenario(ctx: Ctx, quick: bool, cluster: bool = False) -> dict[str, Any]:
    sz = _sizes(quick)
    key = "floor_r3" if cluster else "floor"
    side = FloorProcesses(cluster)
    record = step_record()
    try:

        async def go() -> tuple[list[FloorRun], list[RunMeter]]:
            runs, meters = [], []
            for loops, steps in ((1, sz["floor_seq"]), (64, sz["floor_loop_steps"])):
                m = RunMeter(side.pids, side.http_ports)
                runs.append(await run_floor(side.url, loops, steps, record, on_start=m.begin, on_end=m.end))
                meters.append(m)
            return runs, meters

        runs, meters = asyncio.run(go())
    finally:
        side.stop()
    config = "3-node cluster, R3" if cluster else "1 server, R1"
    rows = floor_rows(runs, config)
    for row, m, run in zip(rows, meters, runs, strict=True):
        row.extra.update(m.per_step(run.loops * run.steps))
    ctx[key] = {"seq": rows[0], "concurrent": rows[1]}
    return {"rows": rows, "tables": [_floor_table(rows, config)], "record_bytes": len(record)}


def _floor_table(rows: list[Row], config: str) -> str:
    return table(
        f"floor: nats-py request/reply to a trivial tool responder + a CAS-publishing commit responder ({config})",
        [
            "loops",
            "steps",
            "p50 ms",
            "p99 ms",
            "steps/s",
            "CPU µs/step (all processes)",
            "server msgs in/step",
            "msgs out/step",
        ],
        [
            [
                r.extra["loops"],
                r.steps,
                r.p50_ms,
                r.p99_ms,
                r.steps_per_s,
                sum(r.extra["cpu_us_per_step"].values()),
                r.extra["traffic"]["in_msgs"],
                r.extra["traffic"]["out_msgs"],
            ]
            for r in rows
        ],
    )


def _floor(ctx: Ctx, quick: bool) -> dict[str, Row]:
    if "floor" not in ctx:
        run_floor_scenario(ctx, quick)
    floor: dict[str, Row] = ctx["floor"]
    return floor


# --- step -----------------------------------------------------------------------------------------


# The single-loop p50 against the floor's is judged on alternating rounds, like the CPU (below): a
# floor measured alone minutes before moves on a shared machine. Each round: a one-loop floor run,
# then a one-loop loopwire run.
STEP_FLOOR_STEPS = 200


@dataclass
class _StepRounds:
    pairs: list[dict[str, Any]] = field(default_factory=list)  # each round's p50 ms: floor, loopwire
    intervals: list[float] = field(default_factory=list)
    seconds: float = 0.0
    cpu: dict[str, float] = field(default_factory=dict)

    async def measure(self, d: Deployment, side: FloorProcesses, rounds: int, per_round: int) -> None:
        await d.connect()
        await d.warm_up()
        record = step_record()
        for k in range(rounds):
            order = ("floor", "loopwire") if k % 2 == 0 else ("loopwire", "floor")
            pair: dict[str, Any] = {}
            for who in order:
                if who == "floor":
                    f = await run_floor(side.url, 1, STEP_FLOOR_STEPS, record)
                    pair["floor"] = pct(f.latencies, 0.5) * 1000
                    continue
                meter = RunMeter(_pids(d), _http_ports(d))
                meter.begin()
                run = await d.run_loops(1, per_round, on_done=meter.end)
                pair["loopwire"] = pct(run.intervals, 0.5) * 1000
                self.intervals += run.intervals
                self.seconds += run.seconds
                add_cpu(self.cpu, meter)
            self.pairs.append(pair)
        await d.close()


def run_step_scenario(ctx: Ctx, quick: bool) -> dict[str, Any]:
    sz = _sizes(quick)
    rounds = sz["step_rounds"]
    per_round = sz["step"] // rounds
    d = Deployment().start()
    side: FloorProcesses | None = None
    measured = _StepRounds()
    try:
        side = FloorProcesses()
        asyncio.run(measured.measure(d, side, rounds, per_round))
    finally:
        if side is not None:
            side.stop()
        d.stop()
    steps = rounds * per_round
    iv = measured.intervals
    row = Row.from_latencies(
        "step",
        "loopwire",
        "1 loop, R1, 1 replica each",
        iv,
        measured.seconds,
        steps=steps,
        durability="JetStream R1 file store (fsync per default sync_interval)",
        cpu_us_per_step={name: round(used / steps * 1e6) for name, used in measured.cpu.items()},
    )
    floor_p50, lw_p50 = [p["floor"] for p in measured.pairs], [p["loopwire"] for p in measured.pairs]
    summary = rounds_summary(floor_p50, lw_p50, digits=3)
    row.extra.update(
        p50_x_floor=round(summary["ratio"], 3),
        p50_median_ms=summary["loopwire"],
        floor_p50_ms=summary["floor"],
        rounds=summary["rounds"],
        pairs=measured.pairs,
    )
    ctx["step"] = row
    t = rounds_table(
        f"step: one loop, instant scripted model, one calculator call per step; {rounds} alternating rounds of "
        f"the floor ({STEP_FLOOR_STEPS} steps) and loopwire ({per_round} steps): p50 ms of each",
        ["round", "floor p50", "loopwire p50", "× floor"],
        floor_p50,
        lw_p50,
        digits=3,
    )
    return {"rows": [row], "tables": [t, _step_table(row, steps, iv)]}


def _step_table(row: Row, steps: int, iv: list[float]) -> str:
    return table(
        f"step: loopwire's {steps} steps together (target: the median of the rounds' ratios ≤ 1.6)",
        ["system", "p50 ms", "p99 ms", "mean ms", "p50 × floor", "target", "CPU µs/step (all processes)"],
        [
            [
                "loopwire",
                row.p50_ms,
                row.p99_ms,
                round(sum(iv) / len(iv) * 1000, 3),
                row.extra["p50_x_floor"],
                "≤ 1.6",
                sum(row.extra["cpu_us_per_step"].values()),
            ]
        ],
    )


def _http_ports(d: Deployment) -> list[int]:
    """The monitoring ports of the deployment's nats-server(s)."""
    servers = d.nats_cluster.nodes if d.nats_cluster is not None else [d.server]
    return [n.http_port for n in servers if n is not None]


def _pids(d: Deployment) -> dict[str, int]:
    pids = {f"{s.name}-{i}": s.pid for i, s in enumerate(d.sup.services) if s.running}
    servers = d.nats_cluster.nodes if d.nats_cluster is not None else [d.server]
    for n in servers:
        if n is not None and n.proc is not None:
            pids[f"nats-{n.name}"] = n.proc.pid
    pids["bench"] = os.getpid()
    return pids


# --- throughput -----------------------------------------------------------------------------------


# Each side of a round: this many 64-loop runs, their CPU added up. /proc counts CPU in 10 ms ticks
# (one run of 64 × 20 steps is 1,280 steps: a tick is ±8 µs per step of each process), and a single
# run of either side varies from one round to the next.
CPU_RUNS_PER_ROUND = 3
FLOOR_RUNS_PER_ROUND = 2


async def _cpu_pairs(d: Deployment, floor: FloorProcesses, rounds: int, steps: int, floor_steps: int) -> list[Any]:
    """``rounds`` pairs of 64-loop runs, the floor's and loopwire's one after the other (alternating
    which goes first), so both are measured in the same minute of a machine whose speed drifts."""
    record = step_record()
    pairs: list[Any] = []
    for k in range(rounds):
        order = ("floor", "loopwire") if k % 2 == 0 else ("loopwire", "floor")
        pair: dict[str, Any] = {}
        for who in order:
            if who == "floor":
                pair["floor"] = await floor.run(64, floor_steps, record, FLOOR_RUNS_PER_ROUND)
            else:
                pair["loopwire"] = await _loopwire_cpu(d, steps)
        pairs.append(pair)
    return pairs


async def _loopwire_cpu(d: Deployment, steps: int) -> dict[str, Any]:
    seconds: dict[str, float] = {}
    for _ in range(CPU_RUNS_PER_ROUND):
        meter = RunMeter(_pids(d), _http_ports(d))
        meter.begin()
        await d.run_loops(64, steps, on_done=meter.end)
        add_cpu(seconds, meter)
    n = CPU_RUNS_PER_ROUND * 64 * steps
    return {"cpu_us_per_step": {name: round(s / n * 1e6) for name, s in seconds.items()}}


def _cpu_totals(pairs: list[Any], who: str) -> list[float]:
    return [sum(p[who]["cpu_us_per_step"].values()) for p in pairs]


def cpu_pairs_table(pairs: list[Any]) -> str:
    return rounds_table(
        "CPU µs per committed step, 64 loops, loopwire (1 replica) and the floor (R1) in alternating runs",
        ["round", "floor", "loopwire", "× floor"],
        _cpu_totals(pairs, "floor"),
        _cpu_totals(pairs, "loopwire"),
    )


def cpu_pairs_summary(pairs: list[Any]) -> dict[str, Any]:
    """Medians of the rounds: each side's CPU per step (total and by process) and the round ratios."""
    if not pairs:
        return {}
    by_process = {
        w: {
            k: round(statistics.median(p[w]["cpu_us_per_step"].get(k, 0) for p in pairs))
            for k in pairs[0][w]["cpu_us_per_step"]
        }
        for w in ("floor", "loopwire")
    }
    return {**rounds_summary(_cpu_totals(pairs, "floor"), _cpu_totals(pairs, "loopwire")), "by_process": by_process}


@dataclass
class _ThroughputRuns:
    sz: dict[str, int]
    profile: bool
    base: Row  # the floor's 64-loop run
    rows: list[Row] = field(default_factory=list)
    profiles: dict[str, Any] = field(default_factory=dict)
    pairs: list[Any] = field(default_factory=list)

    async def measure(self, d: Deployment, side: FloorProcesses | None) -> None:
        """With the floor's processes (``side``): the CPU pairs first; then 64 and 256 loops."""
        await d.connect()
        await d.warm_up()
        if side is not None:
            sz = self.sz
            self.pairs.extend(await _cpu_pairs(d, side, sz["cpu_rounds"], sz["tp_steps"], sz["floor_loop_steps"]))
        for loops in (64, 256):
            self.rows.append(await self._run(d, loops))
        await d.close()

    async def _run(self, d: Deployment, loops: int) -> Row:
        pids = _pids(d)
        prof = None
        if self.profile and d.replicas == 1 and loops == 64:
            services = {k: v for k, v in pids.items() if not k.startswith(("nats-", "bench"))}
            prof = Profiler(services, Path(d.work) / "profile")
        meter = RunMeter(pids, _http_ports(d))
        meter.begin()
        run = await d.run_loops(loops, self.sz["tp_steps"], on_done=meter.end)
        if prof is not None:
            self.profiles.update(prof.stop())
        n = run.loops * run.steps
        row = Row.from_latencies(
            "throughput",
            "loopwire",
            f"{loops} loops × {run.steps} steps, {d.replicas} replica(s) of each service",
            run.intervals,
            run.seconds,
            steps=n,
            durability="JetStream R1 file store",
            loops=loops,
            replicas=d.replicas,
            **meter.per_step(n),
        )
        row.extra["rate_x_floor"] = ratio(row.steps_per_s, self.base.steps_per_s)
        return row


def run_throughput_scenario(ctx: Ctx, quick: bool, profile: bool = True) -> dict[str, Any]:
    measured = _ThroughputRuns(_sizes(quick), profile, _floor(ctx, quick)["concurrent"])
    for replicas in (1, 2):
        d = Deployment(replicas=replicas).start()
        side: FloorProcesses | None = None
        try:
            side = FloorProcesses() if replicas == 1 else None
            asyncio.run(measured.measure(d, side))
        finally:
            d.stop()
            if side is not None:
                side.stop()
    ctx["throughput"] = measured.rows
    ctx["cpu_pairs"] = measured.pairs
    tables = _throughput_tables(measured)
    return {"rows": measured.rows, "tables": tables, "profiles": measured.profiles, "cpu_pairs": measured.pairs}


def _throughput_tables(measured: _ThroughputRuns) -> list[str]:
    base, rows, pairs = measured.base, measured.rows, measured.pairs
    t = table(
        "throughput: concurrent loops, committed tool steps per second (wall: first start → last loop idle)",
        [
            "loops",
            "replicas",
            "steps",
            "seconds",
            "steps/s",
            "× floor (64 loops)",
            "step p50 ms",
            "p99 ms",
            "CPU µs/step (all processes)",
        ],
        [
            [
                "floor",
                1,
                base.steps,
                base.seconds,
                base.steps_per_s,
                1.0,
                base.p50_ms,
                base.p99_ms,
                sum(base.extra["cpu_us_per_step"].values()),
            ]
        ]
        + [
            [
                r.extra["loops"],
                r.extra["replicas"],
                r.steps,
                r.seconds,
                r.steps_per_s,
                r.extra["rate_x_floor"],
                r.p50_ms,
                r.p99_ms,
                sum(r.extra["cpu_us_per_step"].values()),
            ]
            for r in rows
        ],
    )
    first = next((r for r in rows if r.extra["loops"] == 64 and r.extra["replicas"] == 1), None)
    t2 = cpu_table(cpu_pairs_summary(pairs))
    t3 = traffic_table([("nats-py floor, 64 loops, R1", base), ("loopwire, 64 loops, R1", first)])
    tables = [t, cpu_pairs_table(pairs), t2, t3]
    if measured.profiles:
        tables.append("py-spy profile of the 64-loop, 1-replica run (250 Hz):\n" + render(measured.profiles, 10))
    elif measured.profile and py_spy() is None:
        tables.append("py-spy profile: skipped: py-spy not installed (pip install -e '.[bench]')")
    return tables


# --- replay ---------------------------------------------------------------------------------------


def run_replay_scenario(ctx: Ctx, quick: bool) -> dict[str, Any]:
    lengths = [100, 1_000, _sizes(quick)["replay_max"]]
    d = Deployment()
    d.start_nats()
    d.start_committers()
    try:
        out = asyncio.run(measure_replay(d, lengths, quick))
    finally:
        d.stop()
    ctx["replay"] = out
    return {"rows": replay_rows(out, lengths), "tables": replay_tables(out, lengths)}


# --- commit (the committer helper's bench, kept runnable) --------------------------------------------


def run_commit_scenario(ctx: Ctx, quick: bool) -> dict[str, Any]:
    from bench import commit_latency

    args = ["--ops", "500" if quick else "2000", "--concurrent-ops", "30" if quick else "100"]
    t0 = time.perf_counter()
    commit_latency.main(args)
    return {"rows": [], "tables": [], "seconds": time.perf_counter() - t0}
