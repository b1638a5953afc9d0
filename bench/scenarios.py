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
import uuid
from pathlib import Path
from typing import Any

import msgspec

from bench.common import Row, pct, ratio, table
from bench.floor import FloorRun, floor_rows, run_floor, step_record
from bench.lw import BIG_LIMITS, Deployment
from bench.profile import CpuMeter, Profiler, py_spy, render
from bench.report import cpu_table, traffic_table
from bench.traffic import Traffic, snapshot
from bench.workload import ARGS, TOOL_RESULT, USER_TEXT
from shared.natsserver import NatsCluster, NatsServer
from shared.procs import ServiceProcess

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
    nc_: NatsCluster | None = None
    srv: NatsServer | None = None
    if cluster:
        nc_ = NatsCluster().start()
        url, replicas = nc_.url, 3
    else:
        srv = NatsServer().start()
        url, replicas = srv.url, 1
    procs = [
        ServiceProcess(
            f"floor-{k}", ["-m", "bench.floor", "serve", k, "--url", url, "--replicas", str(replicas)], {}
        ).start(timeout=60)
        for k in ("tool", "commit")
    ]
    record = step_record()
    try:
        pids = {p.name: p.pid for p in procs}
        servers = [n for n in (nc_.nodes if nc_ is not None else [srv]) if n is not None]
        for n in servers:
            assert n.proc is not None
            pids[f"nats-{n.name}"] = n.proc.pid
        pids["driver"] = os.getpid()
        ports = [n.http_port for n in servers]

        async def go() -> tuple[list[FloorRun], list[RunMeter]]:
            runs, meters = [], []
            for loops, steps in ((1, sz["floor_seq"]), (64, sz["floor_loop_steps"])):
                m = RunMeter(pids, ports)
                runs.append(await run_floor(url, loops, steps, record, on_start=m.begin, on_end=m.end))
                meters.append(m)
            return runs, meters

        runs, meters = asyncio.run(go())
    finally:
        for p in procs:
            p.stop()
        if nc_ is not None:
            nc_.cleanup()
        if srv is not None:
            srv.cleanup()
    config = "3-node cluster, R3" if cluster else "1 server, R1"
    rows = floor_rows(runs, config)
    for row, m, run in zip(rows, meters, runs, strict=True):
        row.extra.update(m.per_step(run.loops * run.steps))
    ctx[key] = {"seq": rows[0], "concurrent": rows[1]}
    t = table(
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
    return {"rows": rows, "tables": [t], "record_bytes": len(record)}


class RunMeter:
    """CPU per process (``/proc``) and nats-server traffic (``/varz``) over one measured run."""

    def __init__(self, pids: dict[str, int], http_ports: list[int]) -> None:
        self.pids, self.ports = pids, http_ports
        self._cpu: CpuMeter | None = None
        self._t0 = self._t1 = Traffic()
        self.cpu: dict[str, float] = {}

    def begin(self) -> None:
        self._t0 = snapshot(self.ports)
        self._cpu = CpuMeter(self.pids)

    def end(self) -> None:
        assert self._cpu is not None
        self.cpu = self._cpu.stop()
        self._t1 = snapshot(self.ports)

    def per_step(self, steps: int) -> dict[str, Any]:
        """``cpu_us_per_step`` (by process) and ``traffic`` (server counters) per committed step."""
        return {
            "cpu_us_per_step": {k: round(v / steps * 1e6) for k, v in self.cpu.items()},
            "traffic": (self._t1 - self._t0).per_step(steps, len(self.ports)),
        }


def _floor(ctx: Ctx, quick: bool) -> dict[str, Row]:
    if "floor" not in ctx:
        run_floor_scenario(ctx, quick)
    floor: dict[str, Row] = ctx["floor"]
    return floor


# --- step -----------------------------------------------------------------------------------------


# The single-loop p50 against the floor's is judged on alternating rounds, like the CPU (below): a
# floor measured alone minutes before moved from 1.3 to 3.4 ms on a shared machine whose hypervisor
# took a tenth of its CPU time. Each round: a one-loop floor run, then a one-loop loopwire run.
STEP_FLOOR_STEPS = 200


def run_step_scenario(ctx: Ctx, quick: bool) -> dict[str, Any]:
    sz = _sizes(quick)
    rounds = sz["step_rounds"]
    per_round = sz["step"] // rounds
    d = Deployment().start()
    side: _FloorProcesses | None = None
    try:
        side = _FloorProcesses()
        floor_url, record = side.srv.url, step_record()

        async def go() -> Any:
            await d.connect()
            await d.warm_up()
            pairs: list[dict[str, Any]] = []
            intervals: list[float] = []
            seconds = 0.0
            cpu: dict[str, float] = {}
            for k in range(rounds):
                order = ("floor", "loopwire") if k % 2 == 0 else ("loopwire", "floor")
                pair: dict[str, Any] = {}
                for who in order:
                    if who == "floor":
                        f = await run_floor(floor_url, 1, STEP_FLOOR_STEPS, record)
                        pair["floor"] = pct(f.latencies, 0.5) * 1000
                        continue
                    meter = RunMeter(_pids(d), _http_ports(d))
                    meter.begin()
                    run = await d.run_loops(1, per_round, on_done=meter.end)
                    pair["loopwire"] = pct(run.intervals, 0.5) * 1000
                    intervals += run.intervals
                    seconds += run.seconds
                    for name, used in meter.cpu.items():
                        cpu[name] = cpu.get(name, 0.0) + used
                pairs.append(pair)
            await d.close()
            return pairs, intervals, seconds, cpu

        pairs, iv, seconds, cpu = asyncio.run(go())
    finally:
        if side is not None:
            side.stop()
        d.stop()
    steps = rounds * per_round
    row = Row.from_latencies(
        "step",
        "loopwire",
        "1 loop, R1, 1 replica each",
        iv,
        seconds,
        steps=steps,
        durability="JetStream R1 file store (fsync per default sync_interval)",
        cpu_us_per_step={name: round(used / steps * 1e6) for name, used in cpu.items()},
    )
    floor_p50, lw_p50 = [p["floor"] for p in pairs], [p["loopwire"] for p in pairs]
    summary = rounds_summary(floor_p50, lw_p50, digits=3)
    row.extra.update(
        p50_x_floor=round(summary["ratio"], 3),
        p50_median_ms=summary["loopwire"],
        floor_p50_ms=summary["floor"],
        rounds=summary["rounds"],
        pairs=pairs,
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
    t2 = table(
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
    return {"rows": [row], "tables": [t, t2]}


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


def rounds_summary(floor: list[float], loopwire: list[float], *, digits: int | None = None) -> dict[str, Any]:
    """Medians of alternating rounds: each side's figure (rounded to ``digits``) and the median of the
    rounds' own ratios (the judged figure: the sides' medians may come from different rounds)."""
    ratios = [lw / f for f, lw in zip(floor, loopwire, strict=True) if f]
    return {
        "rounds": len(floor),
        "floor": round(statistics.median(floor), digits),
        "loopwire": round(statistics.median(loopwire), digits),
        "ratio": statistics.median(ratios) if ratios else float("inf"),
    }


def rounds_table(
    title: str, headers: list[str], floor: list[float], loopwire: list[float], *, digits: int | None = None
) -> str:
    """One row per alternating round (each side's figure and their ratio), then the medians."""
    rows: list[list[Any]] = [
        [k, round(f, digits), round(lw, digits), f"{lw / f:.2f}" if f else ""]
        for k, (f, lw) in enumerate(zip(floor, loopwire, strict=True), 1)
    ]
    if floor:
        med = rounds_summary(floor, loopwire, digits=digits)
        rows.append(["median", med["floor"], med["loopwire"], f"{med['ratio']:.2f}"])
    return table(title, headers, rows)


# --- throughput -----------------------------------------------------------------------------------


class _FloorProcesses:
    """The floor's server and responders (R1), kept up for runs alternating with loopwire's."""

    def __init__(self) -> None:
        self.srv = NatsServer().start()
        self.procs: list[ServiceProcess] = []
        try:
            for k in ("tool", "commit"):
                args = ["-m", "bench.floor", "serve", k, "--url", self.srv.url, "--replicas", "1"]
                self.procs.append(ServiceProcess(f"floor-{k}", args, {}).start(timeout=60))
        except BaseException:
            self.stop()
            raise
        assert self.srv.proc is not None
        self.pids = {p.name: p.pid for p in self.procs} | {f"nats-{self.srv.name}": self.srv.proc.pid}
        self.pids["driver"] = os.getpid()

    async def run(self, loops: int, steps: int, record: bytes, runs: int = 1) -> dict[str, Any]:
        """``runs`` runs of ``loops`` × ``steps``: their CPU per step together."""
        seconds: dict[str, float] = {}
        for _ in range(runs):
            meter = RunMeter(self.pids, [self.srv.http_port])
            await run_floor(self.srv.url, loops, steps, record, on_start=meter.begin, on_end=meter.end)
            for name, used in meter.cpu.items():
                seconds[name] = seconds.get(name, 0.0) + used
        n = runs * loops * steps
        return {"cpu_us_per_step": {name: round(s / n * 1e6) for name, s in seconds.items()}}

    def stop(self) -> None:
        for p in self.procs:
            p.stop()
        self.srv.cleanup()


# Each side of a round: this many 64-loop runs, their CPU added up. /proc counts CPU in 10 ms ticks
# (one run of 64 × 20 steps is 1,280 steps: a tick is ±8 µs per step of each process), and a single
# run of either side moved by a fifth from one round to the next.
CPU_RUNS_PER_ROUND = 3
FLOOR_RUNS_PER_ROUND = 2


async def _cpu_pairs(d: Deployment, floor: _FloorProcesses, rounds: int, steps: int, floor_steps: int) -> list[Any]:
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
                continue
            seconds: dict[str, float] = {}
            for _ in range(CPU_RUNS_PER_ROUND):
                meter = RunMeter(_pids(d), _http_ports(d))
                meter.begin()
                await d.run_loops(64, steps, on_done=meter.end)
                for name, used in meter.cpu.items():
                    seconds[name] = seconds.get(name, 0.0) + used
            n = CPU_RUNS_PER_ROUND * 64 * steps
            pair["loopwire"] = {"cpu_us_per_step": {name: round(s / n * 1e6) for name, s in seconds.items()}}
        pairs.append(pair)
    return pairs


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


def run_throughput_scenario(ctx: Ctx, quick: bool, profile: bool = True) -> dict[str, Any]:
    sz = _sizes(quick)
    floor = _floor(ctx, quick)
    base = floor["concurrent"]
    rows: list[Row] = []
    profiles: dict[str, Any] = {}
    pairs: list[Any] = []
    for replicas in (1, 2):
        d = Deployment(replicas=replicas).start()
        side = _FloorProcesses() if replicas == 1 else None
        try:

            async def go(replicas: int = replicas, d: Deployment = d, side: _FloorProcesses | None = side) -> None:
                await d.connect()
                await d.warm_up()
                if side is not None:
                    pairs.extend(await _cpu_pairs(d, side, sz["cpu_rounds"], sz["tp_steps"], sz["floor_loop_steps"]))
                for loops in (64, 256):
                    pids = _pids(d)
                    prof = None
                    if profile and replicas == 1 and loops == 64:
                        services = {k: v for k, v in pids.items() if not k.startswith(("nats-", "bench"))}
                        prof = Profiler(services, Path(d.work) / "profile")
                    meter = RunMeter(pids, _http_ports(d))
                    meter.begin()
                    run = await d.run_loops(loops, sz["tp_steps"], on_done=meter.end)
                    if prof is not None:
                        profiles.update(prof.stop())
                    n = run.loops * run.steps
                    row = Row.from_latencies(
                        "throughput",
                        "loopwire",
                        f"{loops} loops × {run.steps} steps, {replicas} replica(s) of each service",
                        run.intervals,
                        run.seconds,
                        steps=n,
                        durability="JetStream R1 file store",
                        loops=loops,
                        replicas=replicas,
                        **meter.per_step(n),
                    )
                    row.extra["rate_x_floor"] = ratio(row.steps_per_s, base.steps_per_s)
                    rows.append(row)
                await d.close()

            asyncio.run(go())
        finally:
            d.stop()
            if side is not None:
                side.stop()
    ctx["throughput"] = rows
    ctx["cpu_pairs"] = pairs
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
    if profiles:
        tables.append("py-spy profile of the 64-loop, 1-replica run (250 Hz):\n" + render(profiles, 10))
    elif profile and py_spy() is None:
        tables.append("py-spy profile: skipped: py-spy not installed (pip install -e '.[bench]')")
    return {"rows": rows, "tables": tables, "profiles": profiles, "cpu_pairs": pairs}


# --- replay ---------------------------------------------------------------------------------------


def run_replay_scenario(ctx: Ctx, quick: bool) -> dict[str, Any]:
    sz = _sizes(quick)
    lengths = [100, 1_000, sz["replay_max"]]
    d = Deployment()
    d.start_nats()
    d.start_committers()
    try:
        out = asyncio.run(_replay(d, lengths, quick))
    finally:
        d.stop()
    rows: list[Row] = []
    for n, r in out["replay"].items():
        rows.append(
            Row(
                scenario="replay",
                system="loopwire",
                config=f"{n:,}-step loop",
                steps=n,
                seconds=round(r["load_s"], 4),
                extra=r,
            )
        )
    c = out["commit"]
    rows.append(
        Row.from_latencies(
            "replay",
            "loopwire",
            "commit latency at step 10",
            c["short"],
            sum(c["short"]),
            durability="JetStream R1 file store",
        )
    )
    rows.append(
        Row.from_latencies(
            "replay",
            "loopwire",
            f"commit latency at step {lengths[-1]:,}",
            c["long"],
            sum(c["long"]),
            durability="JetStream R1 file store",
        )
    )
    ctx["replay"] = out
    t = table(
        "replay: read a loop's whole history back (replay() = decode + validate; load() = replay + fold)",
        ["steps", "records", "replay s", "replay events/s", "load s", "load events/s", "bytes/step", "target"],
        [
            [
                n,
                r["records"],
                round(r["replay_s"], 4),
                round(r["replay_eps"]),
                round(r["load_s"], 4),
                round(r["load_eps"]),
                round(r["bytes_per_step"]),
                "≥ 20,000 ev/s",
            ]
            for n, r in out["replay"].items()
        ],
    )
    s50, l50 = pct(c["short"], 0.5) * 1000, pct(c["long"], 0.5) * 1000
    t2 = table(
        "commit latency vs history length (one-event commits through the committer, interleaved)",
        ["history", "commits", "p50 ms", "p99 ms", "mean ms", "target"],
        [
            ["10 steps", len(c["short"]), s50, pct(c["short"], 0.99) * 1000, _mean_ms(c["short"]), ""],
            [
                f"{lengths[-1]:,} steps",
                len(c["long"]),
                l50,
                pct(c["long"], 0.99) * 1000,
                _mean_ms(c["long"]),
                f"within 10% (p50 ratio {l50 / s50:.3f})",
            ],
        ],
    )
    return {"rows": rows, "tables": [t, t2]}


def _mean_ms(xs: list[float]) -> float:
    return round(sum(xs) / len(xs) * 1000, 3) if xs else 0.0


def _step_events(loop_id: str, turn_id: str, k0: int, n: int) -> list[Any]:
    from shared.content import AIMessage, TextBlock, ToolUseBlock, Usage, tool_result
    from shared.events import StepDone, make

    out = []
    for k in range(k0, k0 + n):
        ai = AIMessage(
            blocks=[
                TextBlock(text=f"Computing step {k}."),
                ToolUseBlock(id=f"call_{k}", name="calculator", input=msgspec.Raw(ARGS.encode())),
            ],
            usage=Usage(input_tokens=20, output_tokens=10),
        )
        out.append(
            make(
                StepDone,
                loop_id=loop_id,
                turn_id=turn_id,
                step_id=str(uuid.uuid4()),
                messages=[ai, tool_result(f"call_{k}", TOOL_RESULT)],
            )
        )
    return out


async def _build_loop(client: Any, steps: int) -> tuple[str, str, int]:
    """A loop of ``steps`` StepDone records (as the model-step writes them), through the committer."""
    from shared.content import user_text
    from shared.events import Cause, InputSubmitted, LoopStarted, TurnStarted, make

    lid, tid, cmd = str(uuid.uuid4()), str(uuid.uuid4()), str(uuid.uuid4())
    head = [
        make(LoopStarted, loop_id=lid, model="scripted", limits=BIG_LIMITS, cause=Cause(command_id=str(uuid.uuid4()))),
        make(InputSubmitted, loop_id=lid, message=user_text(USER_TEXT), cause=Cause(command_id=cmd)),
    ]
    last = (await client.commit(lid, 0, head)).last_seq
    ts = make(
        TurnStarted, loop_id=lid, turn_id=tid, turn_index=1, message=user_text(USER_TEXT), cause=Cause(command_id=cmd)
    )
    last = (await client.commit(lid, last, [ts])).last_seq
    k = 0
    while k < steps:
        n = min(500, steps - k)
        last = (await client.commit(lid, last, _step_events(lid, tid, k, n))).last_seq
        k += n
    return lid, tid, last


async def _replay(d: Deployment, lengths: list[int], quick: bool) -> dict[str, Any]:
    from shared.client import CommitClient
    from shared.history import load, replay

    nc = await d.connect()
    names = d.settings.names
    client = CommitClient(nc, names, 60)
    results: dict[int, dict[str, Any]] = {}
    built: dict[int, tuple[str, str, int]] = {}
    js = nc.jetstream(timeout=10)
    for n in lengths:
        before = (await js.stream_info(names.history_stream)).state
        built[n] = await _build_loop(client, n)
        after = (await js.stream_info(names.history_stream)).state
        bytes_per_step = (after.bytes - before.bytes) / n
        lid = built[n][0]
        # warm (file cache, code paths) then measure
        [_ async for _ in replay(nc, lid, names=names)]
        t = time.perf_counter()
        count = 0
        async for _ in replay(nc, lid, names=names):
            count += 1
        rs = time.perf_counter() - t
        t = time.perf_counter()
        h = await load(nc, names, lid)
        ls = time.perf_counter() - t
        assert h.events == count and h.open_turn is not None and h.open_turn.steps == n
        results[n] = {
            "records": count,
            "replay_s": rs,
            "replay_eps": count / rs,
            "load_s": ls,
            "load_eps": count / ls,
            "bytes_per_step": bytes_per_step,
        }
    # Commit latency at step 10 vs the longest loop: alternate single-event commits on both.
    short = await _build_loop(client, 10)
    long_ = built[lengths[-1]]
    lat: dict[str, list[float]] = {"short": [], "long": []}
    lasts = {"short": short[2], "long": long_[2]}
    loops = {"short": short, "long": long_}
    rounds = 150 if quick else 400
    for i in range(rounds + 20):
        for key in ("short", "long") if i % 2 == 0 else ("long", "short"):
            lid, tid, _ = loops[key]
            e = _step_events(lid, tid, 0, 1)
            t = time.perf_counter()
            lasts[key] = (await client.commit(lid, lasts[key], e)).last_seq
            if i >= 20:  # warm-up rounds
                lat[key].append(time.perf_counter() - t)
    await d.close()
    return {"replay": results, "commit": lat}


# --- commit (the committer helper's bench, kept runnable) --------------------------------------------


def run_commit_scenario(ctx: Ctx, quick: bool) -> dict[str, Any]:
    from bench import commit_latency

    args = ["--ops", "500" if quick else "2000", "--concurrent-ops", "30" if quick else "100"]
    t0 = time.perf_counter()
    commit_latency.main(args)
    return {"rows": [], "tables": [], "seconds": time.perf_counter() - t0}
