"""JetStream's fsync policy side by side: ``sync_interval: always`` against the server's default.

    python -m bench.durability [--loops 64] [--steps 30] [--rounds 2] [--commit-ops 100] [--json PATH]

For each policy, in alternating rounds (default, always, default, always, ...; each round on fresh
processes and a fresh store), on one nats-server (R1, file store):

* **many loops**: a :class:`bench.lw.Deployment` (committer, calculator worker and model-step
  processes) runs ``loops`` loops of ``steps`` tool steps at once: committed steps/s and the step
  cycle p50;
* **commit**: ``bench.commit_latency``'s 64-loop run (one append in flight per loop, through a
  committer process): commit p50 and p99.

Prints each round, the medians per policy and the always/default ratios. The default fsyncs every
2 minutes (a machine crash can lose what was acked since; R3 replication is the usual answer);
``always`` fsyncs each write before it is acked. Not a test: figures depend on the machine's disk.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import anyio

from bench import commit_latency
from bench.lw import Deployment
from bench.natsconf import SYNC_ALWAYS, SYNC_DEFAULT, SyncedNatsServer, sync_label
from services.deployment import Deployment as Services
from services.deployment import service_command
from shared.settings import Settings

POLICIES = (SYNC_DEFAULT, SYNC_ALWAYS)


@dataclass
class Round:
    sync_interval: str
    steps_per_s: float
    step_p50_ms: float
    commit_p50_ms: float
    commit_p99_ms: float
    commits_per_s: float


def many_loops(sync_interval: str, loops: int, steps: int) -> dict[str, float]:
    d = Deployment(sync_interval=sync_interval).start()
    try:

        async def go() -> dict[str, float]:
            await d.connect()
            await d.warm_up()
            run = await d.run_loops(loops, steps)
            await d.close()
            return run.summary()

        return asyncio.run(go())
    finally:
        d.stop()


def commits(sync_interval: str, ops: int) -> commit_latency.Result:
    work = Path(tempfile.mkdtemp(prefix="lw-bench-"))
    server = SyncedNatsServer(store_dir=str(work / "nats"), sync_interval=sync_interval).start()
    settings = Settings.from_env({}, nats_urls=(server.url,), prefix="bench", replicas=1)
    committers = Services.for_settings(settings, work, log_level="WARNING")
    try:
        committers.start("committer", service_command("committer"), timeout=60)
        # (the single-loop run is kept short: this compares the many-loops figures)
        results = anyio.run(commit_latency.bench, settings, 50, ops)
    finally:
        committers.stop_all()
        server.cleanup()
        shutil.rmtree(work, ignore_errors=True)
    return next(r for r in results if r.name == "commit" and r.loops == 64)


def measure(sync_interval: str, loops: int, steps: int, ops: int) -> Round:
    run = many_loops(sync_interval, loops, steps)
    c = commits(sync_interval, ops)
    return Round(
        sync_interval=sync_interval,
        steps_per_s=run["steps_per_s"],
        step_p50_ms=run["step_p50_ms"],
        commit_p50_ms=round(c.pct(0.5), 3),
        commit_p99_ms=round(c.pct(0.99), 3),
        commits_per_s=round(c.rate, 1),
    )


FIELDS = ("steps_per_s", "step_p50_ms", "commit_p50_ms", "commit_p99_ms", "commits_per_s")


_WIDTHS = (9, 12, 14, 14, 10)
_TITLES = ("steps/s", "step p50 ms", "commit p50 ms", "commit p99 ms", "commits/s")


def _row(label: str, values: list[float]) -> str:
    return f"{label:<28} " + " ".join(
        f"{v:>{w}.{1 if w in (9, 10) else 3}f}" for v, w in zip(values, _WIDTHS, strict=True)
    )


def report(rounds: list[Round], loops: int, steps: int) -> str:
    lines = [
        f"JetStream fsync policy, one server (R1, file store): {loops} loops × {steps} steps; commits: 64 loops",
        f"{'policy':<28} " + " ".join(f"{t:>{w}}" for t, w in zip(_TITLES, _WIDTHS, strict=True)),
    ]
    lines += [_row(sync_label(r.sync_interval), [getattr(r, f) for f in FIELDS]) for r in rounds]
    med = {
        p: [statistics.median(getattr(r, f) for r in rounds if r.sync_interval == p) for f in FIELDS] for p in POLICIES
    }
    lines.append("medians:")
    lines += [_row(sync_label(p), med[p]) for p in POLICIES]
    ratios = [a / d if d else 0.0 for a, d in zip(med[SYNC_ALWAYS], med[SYNC_DEFAULT], strict=True)]
    lines.append("always / default: " + ", ".join(f"{t} ×{x:.2f}" for t, x in zip(_TITLES, ratios, strict=True)))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.durability", description=__doc__.split("\n\n")[0])
    p.add_argument("--loops", type=int, default=64, help="loops run at once (default 64)")
    p.add_argument("--steps", type=int, default=30, help="tool steps per loop (default 30)")
    p.add_argument("--rounds", type=int, default=2, help="rounds of each policy, alternating (default 2)")
    p.add_argument("--commit-ops", type=int, default=100, help="commits per loop in the 64-loop commit run")
    p.add_argument("--json", type=Path, default=None, help="also write the rounds here as JSON")
    args = p.parse_args(argv)
    rounds = [
        measure(policy, args.loops, args.steps, args.commit_ops) for _ in range(args.rounds) for policy in POLICIES
    ]
    print(report(rounds, args.loops, args.steps))
    if args.json is not None:
        args.json.write_text(json.dumps([asdict(r) for r in rounds], indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
