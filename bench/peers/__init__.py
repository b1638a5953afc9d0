"""The ``peers`` scenario: the same workload on loopwire (R1, R3), LangGraph, DBOS and Restate.

For every system, in this order and on the same machine:

* ``sequential`` — 1 loop × S tool steps: per-step p50/p99 (consecutive durable steps of a loop)
  and steps/s;
* ``concurrent`` — C loops × 20 tool steps at once: steps/s (first start → last loop done), and
  storage bytes per step (what the system's store grew by, divided by the steps);
* ``resume`` — 1 loop of 60 steps; after step 20 the process that runs the loop is SIGKILLed and a
  new one started at once: seconds from the kill to the next new durable step.

A system whose packages are not installed here is reported as skipped, one that fails to run as
blocked, with the reason; no figure is made up for either.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import shutil
import tempfile
import time
import traceback
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import Row, pct, table
from bench.lw import event_ids
from bench.meter import RunMeter
from bench.peers.proto import Collected, Worker
from bench.profile import GroupCpu
from bench.scenarios import _http_ports, _pids
from shared.settings import Settings

DURABILITY = {
    "loopwire": "JetStream R1 file store; acked once written to the server (fsync every 2 min, nats-server default)",
    "loopwire-r3": "JetStream R3 file store; acked once a quorum (2 of 3 servers) stored it (no fsync per message)",
    "langgraph": 'durability="async" (default): a super-step\'s checkpoint is written while the next one runs; '
    "Postgres synchronous_commit=on",
    "dbos": "every step output committed to Postgres before the workflow continues (synchronous_commit=on)",
    "restate": "every journal entry appended to Restate's log (RocksDB WAL, fsync on) before the handler continues",
}

RESUME_STEPS = 60
KILL_AFTER = 20


def _sizes(quick: bool) -> dict[str, int]:
    return {"seq": 100, "loops": 16, "steps": 20} if quick else {"seq": 200, "loops": 64, "steps": 20}


def run_peers_scenario(ctx: dict[str, Any], quick: bool) -> dict[str, Any]:
    sz = _sizes(quick)
    systems: list[str] = ctx["peers"] if "peers" in ctx else list(DURABILITY)  # --peers '' runs none
    rows: list[Row] = []
    blocked: dict[str, str] = {}
    pg = None
    skipped: dict[str, str] = {}
    for system in systems:
        reason = missing(system)
        if reason:
            skipped[system] = reason
            print(f"  peers: {system} skipped: {reason}", flush=True)
            continue
        print(f"  peers: {system} ...", flush=True)
        t0 = time.perf_counter()
        try:
            if system in ("langgraph", "dbos") and pg is None:
                from bench.peers.postgres import ensure_postgres

                pg = ensure_postgres()
            fn = _RUNNERS[system]
            rows.extend(fn(sz, pg))
        except Exception as e:  # a peer that cannot run here is reported, never faked
            blocked[system] = f"{type(e).__name__}: {e}".splitlines()[0][:300]
            traceback.print_exc()
        print(f"  peers: {system} done in {time.perf_counter() - t0:.1f} s", flush=True)
    pg_settings: dict[str, str] = {}
    if pg is not None:
        try:
            pg_settings = pg.settings()
        finally:
            pg.cleanup()
    ctx["peers_rows"] = rows
    ctx["peers_blocked"] = blocked
    ctx["peers_skipped"] = skipped
    ctx["peers_systems"] = systems
    by = {(r.system, r.extra.get("mode")): r for r in rows}
    out_rows = []
    for system in systems:
        if system in skipped:
            out_rows.append([system, "skipped", "", "", "", "", "", "", "", skipped[system][:90]])
            continue
        if system in blocked:
            out_rows.append([system, "blocked", "", "", "", "", "", "", "", blocked[system][:90]])
            continue
        s, c, r = by.get((system, "sequential")), by.get((system, "concurrent")), by.get((system, "resume"))
        out_rows.append(
            [
                system,
                s.p50_ms if s else "",
                s.p99_ms if s else "",
                s.steps_per_s if s else "",
                c.steps_per_s if c else "",
                c.extra.get("cpu_us_per_step", "") if c else "",
                round(s.extra.get("bytes_per_step", 0)) if s else "",
                round(c.extra.get("bytes_per_step", 0)) if c else "",
                round(r.seconds, 2) if r else "",
                DURABILITY.get(system, "")[:60],
            ]
        )
    t = table(
        f"peers: the same workload (instant model, calculator, durable step records); sequential = 1 loop × "
        f"{sz['seq']} steps, concurrent = {sz['loops']} loops × {sz['steps']} steps",
        [
            "system",
            "p50 ms",
            "p99 ms",
            "1-loop steps/s",
            f"{sz['loops']}-loop steps/s",
            f"CPU µs/step ({sz['loops']} loops)",
            f"bytes/step ({sz['seq']}-step loop)",
            f"bytes/step ({sz['steps']}-step loops)",
            "resume s",
            "durability (default)",
        ],
        out_rows,
    )
    extra = {"postgres": pg_settings, "durability": DURABILITY, "blocked": blocked, "skipped": skipped}
    return {"rows": rows, "tables": [t], **extra}


# What each system needs besides the dev extras: Python modules (the ``bench`` extra) and programs.
REQUIRES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "langgraph": (("langgraph", "langgraph.checkpoint.postgres", "psycopg"), ()),
    "dbos": (("dbos", "psycopg"), ()),
    "restate": (("restate", "hypercorn"), ("npm",)),
}


def missing(system: str) -> str | None:
    """Why ``system`` cannot run here (a module or program it needs is not installed), or None."""
    if system not in _RUNNERS:
        return f"unknown system (known: {', '.join(_RUNNERS)})"
    modules, programs = REQUIRES.get(system, ((), ()))
    for m in modules:
        try:
            found = importlib.util.find_spec(m) is not None
        except ImportError:  # the parent package is missing
            found = False
        if not found:
            return f"Python module {m} not installed (pip install -e '.[bench]')"
    for prog in programs:
        if shutil.which(prog) is None:
            return f"{prog} not installed"
    return None


# --- loopwire ---------------------------------------------------------------------------------------


def _loopwire(cluster: bool) -> Callable[[dict[str, int], Any], list[Row]]:
    def run(sz: dict[str, int], _pg: Any) -> list[Row]:
        from bench.lw import Deployment

        name = "loopwire-r3" if cluster else "loopwire"
        d = Deployment(cluster=cluster).start()
        try:

            async def go() -> list[Row]:
                await d.connect()
                await d.warm_up()
                rows = []
                b0, _ = await d.stream_bytes()
                seq = await d.run_loops(1, sz["seq"])
                b1, _ = await d.stream_bytes()
                # Every process, the benchmark's included: it starts the loops (as Restate's driver does)
                # and waits for their end (the step times are the records' own, read afterwards).
                meter = RunMeter(_pids(d), _http_ports(d))
                meter.begin()
                conc = await d.run_loops(sz["loops"], sz["steps"], on_done=meter.end)
                b2, _ = await d.stream_bytes()
                rows.append(
                    _row(name, "sequential", seq.intervals, seq.loops * seq.steps, seq.seconds, (b1 - b0) / sz["seq"])
                )
                n = conc.loops * conc.steps
                row = _row(name, "concurrent", conc.intervals, n, conc.seconds, (b2 - b1) / n, sum(meter.cpu.values()))
                per_step = meter.per_step(n)
                row.extra.update(loops=conc.loops, processes=per_step["cpu_us_per_step"], traffic=per_step["traffic"])
                rows.append(row)
                rows.append(await _loopwire_resume(d, name))
                await d.close()
                return rows

            return asyncio.run(go())
        finally:
            d.stop()

    return run


async def _loopwire_resume(d: Any, name: str) -> Row:
    from bench.workload import write_script

    model = write_script(d.work / "scripts", RESUME_STEPS)
    lid = str(uuid.uuid4())
    # The killed process may have sent its next step's commit just before it died; the committer still
    # stores it, milliseconds after the kill. That step is not a resumed one: the figure is the time to
    # the first step the killed process never asked for (its commit requests are seen here, core NATS).
    sent_by_old: set[bytes] = set()
    dead_at = [float("inf")]

    async def on_commit(msg: Any) -> None:
        if time.perf_counter() < dead_at[0] + 0.05:  # the new process cannot commit this soon after
            sent_by_old.update(event_ids(msg.data))

    sub = await d.nc.subscribe(d.settings.names.commit(lid), cb=on_commit)
    await d.start_loop(model, lid, watch=True)
    trace = d.trace(lid)
    deadline = time.monotonic() + 60
    while len(trace.steps) < KILL_AFTER and time.monotonic() < deadline:  # noqa: ASYNC110 (polls a plain list)
        await asyncio.sleep(0.001)
    svc = d.sup.by_name("model-step")[0]
    t_kill = time.perf_counter()
    d.kill(svc)  # SIGKILL, and wait until it is gone
    dead_at[0] = time.perf_counter()
    d.sup.services.remove(svc)
    # Start the replacement (blocking wait for READY happens in a thread: the observer keeps running).
    replacement = await asyncio.to_thread(d.model_step)

    def resumed() -> float | None:
        return next((t for t, e in zip(trace.steps, trace.step_ids, strict=True) if e not in sent_by_old), None)

    while (first := resumed()) is None:
        await asyncio.wait_for(asyncio.sleep(0.002), 60)
        if time.perf_counter() - t_kill > 120:
            raise RuntimeError("loopwire did not resume within 120 s")
    await sub.unsubscribe()
    resume = first - t_kill
    await asyncio.wait_for(trace.done.wait(), 120)
    # The settings the replacement actually ran with (it inherits this process's environment).
    effective = Settings.from_env({**os.environ, **replacement.env})
    return Row(
        scenario="peers",
        system=name,
        config="resume after SIGKILL of the model-step",
        seconds=resume,
        durability=DURABILITY[name],
        extra={
            "mode": "resume",
            "lease_ttl_s": effective.lease_ttl_seconds,
            "lease_ttl_default_s": Settings().lease_ttl_seconds,
            "env": {k: v for k, v in replacement.env.items() if k not in ("LW_NATS_URL", "LW_PREFIX", "LW_REPLICAS")},
        },
    )


# --- library peers (LangGraph, DBOS) ------------------------------------------------------------------


def _library(system: str, module: str, schema: str) -> Callable[[dict[str, int], Any], list[Row]]:
    def run(sz: dict[str, int], pg: Any) -> list[Row]:
        db = f"lw_bench_{system}"
        dsn = pg.fresh_database(db)
        work = Path(tempfile.mkdtemp(prefix=f"lw-bench-{system}-"))

        def worker(prefix: str, loops: int, steps: int, resume: bool = False) -> Worker:
            args = ["-m", module, "--dsn", dsn, "--loops", str(loops), "--steps", str(steps), "--prefix", prefix]
            w = Worker([*args, "--resume"] if resume else args, log_path=str(work / f"{prefix}.log"))
            w.wait_ready()
            return w

        def schema_bytes() -> int:
            return _schema_bytes(pg, db, schema)

        try:
            return _library_runs(system, sz, worker, schema_bytes)
        finally:
            shutil.rmtree(work, ignore_errors=True)

    return run


def _library_runs(
    system: str, sz: dict[str, int], worker: Callable[..., Worker], schema_bytes: Callable[[], int]
) -> list[Row]:
    rows: list[Row] = []
    b0 = schema_bytes()
    w = worker("seq", 1, sz["seq"])
    w.wait_done(1, 600)
    w.stop()
    b1 = schema_bytes()
    rows.append(_collected_row(system, "sequential", w.collected, sz["seq"], (b1 - b0) / sz["seq"]))
    w = worker("conc", sz["loops"], sz["steps"])
    w.pump(lambda c, _w: c.begin > 0, 120)  # warm-up done: measure the loops only
    meter = GroupCpu([w.proc.pid], ("postgres",))
    w.wait_done(sz["loops"], 600)
    cpu = meter.stop()
    w.stop()
    b2 = schema_bytes()
    n = sz["loops"] * sz["steps"]
    rows.append(_collected_row(system, "concurrent", w.collected, n, (b2 - b1) / n, cpu))
    rows.append(_resume(system, lambda resume: worker("crash", 1, RESUME_STEPS, resume)))
    return rows


def _schema_bytes(pg: Any, db: str, schema: str) -> int:
    import psycopg

    with psycopg.connect(pg.dsn(db), autocommit=True) as conn:
        row = conn.execute(
            "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relkind IN ('r', 'm')",
            (schema,),
        ).fetchone()
    return int(row[0]) if row else 0


def _resume(system: str, start: Callable[[bool], Worker]) -> Row:
    """Kill the worker after step KILL_AFTER of a RESUME_STEPS loop, start another: kill → next step."""
    w = start(False)
    loop = "crash-0"
    if not w.pump(lambda c, _w: c.max_k(loop) >= KILL_AFTER - 1, 120):
        raise RuntimeError(f"{system}: no progress before the crash: {w.tail()}")
    w.kill()
    t_kill = time.time()
    seen = w.collected.max_k(loop)
    w2 = start(True)
    if not w2.pump(lambda c, _w: c.max_k(loop) > seen, 120):
        raise RuntimeError(f"{system}: did not resume within 120 s: {w2.tail()}")
    t_next = min(t for (lp, k), t in w2.collected.steps.items() if lp == loop and k > seen)
    w2.wait_done(1, 120)
    w2.stop()
    return Row(
        scenario="peers",
        system=system,
        config="resume after SIGKILL of the worker process",
        seconds=t_next - t_kill,
        durability=DURABILITY[system],
        extra={"mode": "resume"},
    )


# --- Restate -----------------------------------------------------------------------------------------


def _restate(sz: dict[str, int], _pg: Any) -> list[Row]:
    from bench.peers.restate_peer import RestateServer
    from shared.natsserver import free_port

    server = RestateServer().start()
    port = free_port()
    service: list[Worker] = []

    def start_service() -> Worker:
        w = Worker(
            ["-m", "hypercorn", "--workers", "0", "bench.peers.restate_peer:app", "--bind", f"127.0.0.1:{port}"],
            log_path=str(server.work / "service.log"),
            group=True,
        )
        service.append(w)
        return w

    try:
        svc = start_service()
        server.register(f"http://127.0.0.1:{port}")
        rows = []
        b0 = server.disk_bytes()
        seq, _ = _restate_measure(server, svc, "seq", 1, sz["seq"])
        b1 = server.disk_bytes()
        rows.append(_collected_row("restate", "sequential", seq, sz["seq"], (b1 - b0) / sz["seq"]))
        conc, cpu = _restate_measure(server, svc, "conc", sz["loops"], sz["steps"])
        b2 = server.disk_bytes()
        n = sz["loops"] * sz["steps"]
        rows.append(_collected_row("restate", "concurrent", conc, n, (b2 - b1) / n, cpu))
        rows.append(_restate_resume(server, svc, start_service))
        for r in rows:
            r.extra["bytes_note"] = "on-disk growth of the server's data directory (RocksDB WAL + SST files)"
        return rows
    finally:
        for w in service:
            w.stop()
        server.stop()


def _restate_drive(server: Any, prefix: str, loops: int, steps: int) -> Worker:
    """Start the driver that invokes ``loops`` loops of ``steps`` steps through the ingress."""
    d = Worker(
        [
            "-m",
            "bench.peers.restate_peer",
            "drive",
            "--ingress",
            server.ingress,
            "--loops",
            str(loops),
            "--steps",
            str(steps),
            "--prefix",
            prefix,
        ],
        log_path=str(server.work / "drive.log"),
    )
    d.wait_ready()
    return d


def _restate_measure(server: Any, svc: Worker, prefix: str, loops: int, steps: int) -> tuple[Collected, float]:
    """Drive the loops to the end: their step times (from the service) and the CPU of all processes."""
    d = _restate_drive(server, prefix, loops, steps)
    d.pump(lambda c, _w: c.begin > 0, 120)  # warm-up done: measure the loops only
    assert server.proc is not None
    meter = GroupCpu([server.proc.pid, svc.proc.pid, d.proc.pid])
    d.wait_done(loops, 600)
    cpu = meter.stop()
    d.stop()
    # STEP lines come from the service process: pump what has arrived.
    svc.pump(lambda c, _w: sum(1 for (lp, _k) in c.steps if lp.startswith(prefix + "-")) >= loops * steps, 30)
    got = Collected(begin=d.collected.begin, done=d.collected.done)
    got.steps = {k: t for k, t in svc.collected.steps.items() if k[0].startswith(prefix + "-")}
    return got, cpu


def _restate_resume(server: Any, svc: Worker, start_service: Callable[[], Worker]) -> Row:
    """Kill the service process mid-loop, start a new one on the same port: kill → next step."""
    d = _restate_drive(server, "crash", 1, RESUME_STEPS)
    loop = "crash-0"
    if not svc.pump(lambda c, _w: c.max_k(loop) >= KILL_AFTER - 1, 120):
        raise RuntimeError(f"restate: no progress before the crash: {svc.tail()}")
    svc.kill()
    t_kill = time.time()
    seen = svc.collected.max_k(loop)
    svc2 = start_service()
    if not svc2.pump(lambda c, _w: c.max_k(loop) > seen, 120):
        raise RuntimeError(f"restate: did not resume within 120 s: {svc2.tail()}")
    t_next = min(t for (lp, k), t in svc2.collected.steps.items() if lp == loop and k > seen)
    d.wait_done(1, 120)
    d.stop()
    return Row(
        scenario="peers",
        system="restate",
        config="resume after SIGKILL of the service process",
        seconds=t_next - t_kill,
        durability=DURABILITY["restate"],
        extra={"mode": "resume"},
    )


# --- shared ------------------------------------------------------------------------------------------


def _row(
    system: str,
    mode: str,
    intervals: list[float],
    steps: int,
    seconds: float,
    bytes_per_step: float,
    cpu_seconds: float | None = None,
) -> Row:
    row = Row.from_latencies("peers", system, mode, intervals, seconds, steps=steps, durability=DURABILITY[system])
    row.extra.update(mode=mode, bytes_per_step=bytes_per_step)
    if cpu_seconds is not None:
        row.extra["cpu_us_per_step"] = round(cpu_seconds / steps * 1e6)
    return row


def _collected_row(
    system: str, mode: str, c: Collected, steps: int, bytes_per_step: float, cpu_seconds: float | None = None
) -> Row:
    end = max(c.done.values()) if c.done else 0.0
    got = len(c.steps)
    if got < steps:
        raise RuntimeError(f"{system} {mode}: {got} of {steps} steps reported")
    return _row(system, mode, c.intervals(), steps, end - c.begin, bytes_per_step, cpu_seconds)


_RUNNERS: dict[str, Callable[[dict[str, int], Any], list[Row]]] = {
    "loopwire": _loopwire(False),
    "loopwire-r3": _loopwire(True),
    "langgraph": _library("langgraph", "bench.peers.langgraph_peer", "public"),
    "dbos": _library("dbos", "bench.peers.dbos_peer", "dbos"),
    "restate": _restate,
}

__all__ = ["DURABILITY", "run_peers_scenario"]
_ = pct
