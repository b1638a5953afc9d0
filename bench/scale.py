"""``python -m bench scale``: committed steps/s and nats-server CPU by shard count on 3- and 5-node clusters.

Every run is a fresh cluster of ``nodes`` nats-servers with R3 streams, ``LW_SHARDS`` = the shard
count, one committer, model-step and calculator tool worker per node (process i connects to node i
first), the shards' stream leaders balanced over the nodes (``shared.placement``), a warm-up,
then the same load: 64 loops of ``steps`` tool steps at once (bench/scalerun.py measures the middle
of the run). Shard counts alternate in rounds (1, 2, 4, 8, 1, 2, 4, 8, ...) and the tables give the
medians, because a small shared machine drifts from one minute to the next; a run during which
other processes took much of the machine is done again (``OTHERS_MAX``), and the tables say how much
they took.

The plot goes to docs/scale.png for a full run and next to the JSON results for ``--quick``.
``python -m bench.scale --nodes 3 --shards 1 --quick`` runs a subset (a smoke test).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.common import RESULTS_DIR, Row, table
from bench.scalefigures import RunFigures, round_order, summarise, verdict
from bench.scalerun import one_run

DOC_PLOT = Path(__file__).resolve().parent.parent / "docs" / "scale.png"
LOOPS = 64
# A run during whose window other processes on the machine took more cores than this is done again.
OTHERS_MAX = 0.25
REDOS = 2


def sizes(quick: bool) -> dict[str, Any]:
    if quick:
        return {"nodes": (3, 5), "shards": (1, 2, 4), "rounds": 1, "steps": 30}
    return {"nodes": (3, 5), "shards": (1, 2, 4, 8), "rounds": 3, "steps": 100}


def _line(f: RunFigures) -> str:
    shares = "/".join(f"{v * 100:.0f}" for v in f.node_shares.values())
    busy = "?" if f.machine_busy is None else f"{f.machine_busy * 100:.0f} %"
    return (
        f"{f.steps_per_s:,.0f} steps/s; busiest server {f.busiest_core * 100:.0f} % of a core; servers' CPU by "
        f"node {shares} %; services {f.services_core:.2f} cores; machine busy {busy} (others "
        f"{f.other_core or 0:.2f} cores); leaders {f.leaders}"
    )


def _one(
    nodes: int, shards: int, rnd: int, steps: int, server_cpu: float | None = None, replicas: int = 3
) -> RunFigures:
    """One run, done again (up to ``REDOS`` times) while other processes took more than ``OTHERS_MAX``
    cores during its window; the least disturbed attempt."""
    tried: list[RunFigures] = []
    head = f"  round {rnd + 1}, {nodes} nodes, {shards} shard(s)"
    for attempt in range(1 + REDOS):
        f = asyncio.run(one_run(nodes, shards, LOOPS, steps, server_cpu=server_cpu, replicas=replicas))
        f.round = rnd
        tried.append(f)
        if f.other_core is None or f.other_core <= OTHERS_MAX or attempt == REDOS:
            print(f"{head}: {_line(f)}", flush=True)
            break
        print(f"{head}: other processes took {f.other_core:.2f} cores: again ({_line(f)})", flush=True)
    k = min(range(len(tried)), key=lambda i: tried[i].other_core or 0.0)
    if k != len(tried) - 1:
        print(f"    (kept attempt {k + 1}, the least disturbed)", flush=True)
    tried[k].attempts = len(tried)
    return tried[k]


def measure(
    nodes: Sequence[int],
    shards: Sequence[int],
    rounds: int,
    steps: int,
    server_cpu: float | None = None,
    replicas: int = 3,
) -> list[RunFigures]:
    """Every (round, nodes, shards) run, printing each as it ends."""
    return [_one(n, s, r, steps, server_cpu, replicas) for r, s in round_order(shards, rounds) for n in nodes]


def scale_table(rows: list[dict[str, Any]], steps: int, replicas: int = 3) -> str:
    body: list[list[Any]] = []
    for m in rows:
        shares = "/".join(f"{v * 100:.0f}" for v in m["node_shares"].values())
        busy = "?" if m["machine_busy"] is None else round(m["machine_busy"] * 100)
        body.append(
            [
                m["nodes"],
                m["shards"],
                m["rounds"],
                m["steps_per_s"],
                "" if m["ratio"] is None else f"{m['ratio']:.2f}",
                round(m["busiest_core"] * 100),
                round(m["busiest_share"] * 100),
                shares,
                round(m["services_core"], 2),
                m["services_us_per_step"],
                m["servers_us_per_step"],
                busy,
                "?" if m["other_core"] is None else round(m["other_core"], 2),
            ]
        )
    return table(
        f"scale: {LOOPS} loops × {steps} steps, R{replicas}, one committer + model-step + tool worker per node; "
        "medians of the alternating rounds (window: 20–80 % of each run's records)",
        [
            "nodes",
            "shards",
            "rounds",
            "steps/s",
            "× 1 shard",
            "busiest srv % core",
            "busiest srv % of srv CPU",
            "srv CPU by node %",
            "services cores",
            "services CPU µs/step",
            "servers CPU µs/step",
            "machine busy %",
            "other procs cores",
        ],
        body,
    )


def _rows(medians: list[dict[str, Any]], steps: int, replicas: int = 3) -> list[Row]:
    return [
        Row(
            scenario="scale",
            system="loopwire",
            config=f"{m['nodes']} nodes R{replicas}, {m['shards']} shard(s), {LOOPS} loops × {steps} steps",
            steps_per_s=m["steps_per_s"],
            durability=f"JetStream R{replicas} file store",
            extra=m,
        )
        for m in medians
    ]


def run(
    nodes: Sequence[int],
    shards: Sequence[int],
    rounds: int,
    steps: int,
    plot_path: Path,
    server_cpu: float | None = None,
    replicas: int = 3,
) -> dict[str, Any]:
    runs = measure(nodes, shards, rounds, steps, server_cpu, replicas)
    medians = summarise(runs)
    said = verdict(medians)
    from bench.scaleplot import plot

    where = plot(medians, runs, plot_path, steps=steps, loops=LOOPS)
    text = scale_table(medians, steps, replicas) + "\n" + "\n".join(said)
    return {
        "rows": _rows(medians, steps, replicas),
        "tables": [text],
        "runs": [r.to_json() for r in runs],
        "medians": medians,
        "verdict": said,
        "plot": where,
    }


def run_scale_scenario(ctx: dict[str, Any], quick: bool) -> dict[str, Any]:
    """The ``python -m bench scale`` entry: both cluster sizes, every shard count."""
    sz = sizes(quick)
    path = RESULTS_DIR / "scale-quick.png" if quick else DOC_PLOT
    out = run(sz["nodes"], sz["shards"], sz["rounds"], sz["steps"], path)
    ctx["scale"] = out["medians"]
    return out


def main(argv: list[str] | None = None) -> int:
    """A subset of the scenario (e.g. one shard count on one cluster size), tables only."""
    p = argparse.ArgumentParser(prog="python -m bench.scale", description=__doc__.split("\n", 1)[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--nodes", default="", help="cluster sizes, comma-separated (default 3,5)")
    p.add_argument("--shards", default="", help="shard counts, comma-separated (default 1,2,4,8; quick 1,2,4)")
    p.add_argument("--rounds", type=int, default=0)
    p.add_argument("--steps", type=int, default=0, help="tool steps per loop")
    p.add_argument("--plot", type=Path, default=RESULTS_DIR / "scale-subset.png")
    p.add_argument("--replicas", type=int, default=3, choices=(1, 3), help="replicas of every stream (default 3)")
    p.add_argument(
        "--server-cpu",
        type=float,
        default=None,
        help="each nats-server's CPU quota in cores, e.g. 0.15 (cgroups, root): servers as on machines of their own",
    )
    a = p.parse_args(argv)
    sz = sizes(a.quick)
    nodes = [int(x) for x in a.nodes.split(",")] if a.nodes else list(sz["nodes"])
    shards = [int(x) for x in a.shards.split(",")] if a.shards else list(sz["shards"])
    out = run(nodes, shards, a.rounds or sz["rounds"], a.steps or sz["steps"], a.plot, a.server_cpu, a.replicas)
    print("\n" + out["tables"][0] + f"\nplot: {out['plot']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
