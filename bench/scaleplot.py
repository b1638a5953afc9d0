"""The ``scale`` plot: steps/s, the busiest nats-server's CPU and the CPU per step against the shard count,
one line per cluster size."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.scalefigures import RunFigures


def plot(medians: Sequence[dict[str, Any]], runs: Sequence[RunFigures], path: Path, *, steps: int, loops: int) -> str:
    """Write the PNG; says where, or why it was skipped."""
    if not medians:
        return "skipped: nothing measured"
    try:
        import matplotlib
    except ImportError:
        return "skipped: matplotlib not installed (pip install -e '.[bench]')"

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(17, 4.8))
    shard_counts = sorted({m["shards"] for m in medians})
    for nodes in sorted({m["nodes"] for m in medians}):
        mine = [m for m in medians if m["nodes"] == nodes]
        xs = [m["shards"] for m in mine]
        line = ax1.plot(xs, [m["steps_per_s"] for m in mine], marker="o", label=f"{nodes} nodes (median)")[0]
        dots = [r for r in runs if r.nodes == nodes]
        ax1.scatter([r.shards for r in dots], [r.steps_per_s for r in dots], s=10, alpha=0.4, color=line.get_color())
        ax2.plot(
            xs,
            [m["busiest_core"] * 100 for m in mine],
            marker="o",
            color=line.get_color(),
            label=f"{nodes} nodes: busiest server, % of one core",
        )
        ax2.plot(
            xs,
            [m["busiest_share"] * 100 for m in mine],
            marker="s",
            linestyle="--",
            color=line.get_color(),
            label=f"{nodes} nodes: busiest server, % of all servers' CPU (even: {100 / nodes:.0f})",
        )
        ax3.plot(
            xs,
            [m["services_us_per_step"] for m in mine],
            marker="o",
            color=line.get_color(),
            label=f"{nodes} nodes: services",
        )
        ax3.plot(
            xs,
            [m["servers_us_per_step"] for m in mine],
            marker="s",
            linestyle="--",
            color=line.get_color(),
            label=f"{nodes} nodes: nats-servers (all)",
        )
    ax1.set_ylabel("committed tool steps / s (higher is better)")
    ax1.set_title("Throughput by shard count")
    ax1.set_ylim(bottom=0)
    ax2.set_ylabel("%")
    ax2.set_title("The busiest nats-server's CPU")
    ax2.set_ylim(bottom=0)
    ax3.set_ylabel("CPU µs per committed step (lower is better)")
    ax3.set_title("CPU per step")
    ax3.set_ylim(bottom=0)
    for ax in (ax1, ax2, ax3):
        ax.set_xscale("log", base=2)
        ax.set_xticks(shard_counts, [str(s) for s in shard_counts])
        ax.set_xlabel("shards (LW_SHARDS)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    rounds = max(m["rounds"] for m in medians)
    fig.suptitle(
        f"{medians[0]['cpus']} vCPU VM; local nats-server cluster, R3 streams; {loops} loops × {steps} steps, "
        f"instant scripted model + calculator tool; one committer, model-step, tool worker per node; "
        f"medians of {rounds} alternating round(s)",
        fontsize=8,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)
