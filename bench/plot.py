"""The benchmark plot: steps/s and per-step p99 for every system (peers), plus the floor, one PNG."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def plot(ctx: dict[str, Any], path: Path) -> str:
    """Write the plot when the run measured peers or the floor; says where, or why it was skipped."""
    rows = ctx.get("peers_rows") or []
    floor = ctx.get("floor")
    if not rows and not floor:
        return "skipped: neither the peers nor the floor were measured"
    try:
        import matplotlib
    except ImportError:
        return "skipped: matplotlib not installed (pip install -e '.[bench]')"

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    systems: list[str] = []
    for r in rows:
        if r.system not in systems:
            systems.append(r.system)
    by = {(r.system, r.extra.get("mode")): r for r in rows}
    labels, seq_rate, conc_rate, p99, p50 = [], [], [], [], []
    if floor:
        labels.append("nats-py floor")
        seq_rate.append(floor["seq"].steps_per_s)
        conc_rate.append(floor["concurrent"].steps_per_s)
        p99.append(floor["seq"].p99_ms)
        p50.append(floor["seq"].p50_ms)
    for s in systems:
        seq, conc = by.get((s, "sequential")), by.get((s, "concurrent"))
        if seq is None or conc is None:
            continue
        labels.append(s)
        seq_rate.append(seq.steps_per_s)
        conc_rate.append(conc.steps_per_s)
        p99.append(seq.p99_ms)
        p50.append(seq.p50_ms)
    blocked = {**(ctx.get("peers_blocked") or {}), **(ctx.get("peers_skipped") or {})}
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.8))
    x = range(len(labels))
    w = 0.4
    b1 = ax1.bar([i - w / 2 for i in x], seq_rate, w, label="1 loop")
    conc_label = "concurrent loops"
    if rows:
        c = next((r for r in rows if r.extra.get("mode") == "concurrent"), None)
        if c is not None:
            conc_label = f"{c.steps // 20 if c.steps >= 20 else c.steps} loops × 20 steps"
    b2 = ax1.bar([i + w / 2 for i in x], conc_rate, w, label=conc_label + " (floor: 64 loops)")
    ax1.bar_label(b1, fmt="%.0f", fontsize=7)
    ax1.bar_label(b2, fmt="%.0f", fontsize=7)
    ax1.set_yscale("log")
    ax1.set_xticks(list(x), labels, rotation=20, ha="right")
    ax1.set_ylabel("durable tool steps / s, log scale (higher is better)")
    ax1.set_title("Throughput, same agent-loop workload")
    ax1.legend(fontsize=8)
    b3 = ax2.bar([i - w / 2 for i in x], p50, w, color="tab:olive", label="p50")
    b4 = ax2.bar([i + w / 2 for i in x], p99, w, color="tab:red", label="p99")
    ax2.bar_label(b3, fmt="%.1f", fontsize=7)
    ax2.bar_label(b4, fmt="%.1f", fontsize=7)
    ax2.set_xticks(list(x), labels, rotation=20, ha="right")
    ax2.set_ylabel("per-step latency, ms, 1 loop (lower is better)")
    ax2.set_title("Per-step latency (p50, p99)")
    ax2.legend(fontsize=8)
    for ax in (ax1, ax2):
        ax.grid(axis="y", alpha=0.3)
    note = "2 vCPU VM; instant scripted model + calculator tool; each system at its default durability"
    if blocked:
        note += "; not measured: " + ", ".join(blocked)
    fig.suptitle(note, fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)
