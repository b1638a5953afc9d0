"""The figures of the ``scale`` scenario: one measured run, medians by shard count, and what limited them.

Pure functions of measured numbers (no I/O), so the unit tests can check them.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

# The machine counts as saturated above this busy share of all its cores (/proc/stat).
SATURATED = 0.85
# A nats-server above this share of one core may itself be what limits the rate.
SERVER_HOT = 0.8
# Other processes' CPU (cores) worth a sentence: the machine was shared during the windows.
OTHERS_NOTED = 0.15


def rotated(urls: Sequence[str], i: int) -> list[str]:
    """``urls`` starting at node ``i`` (mod their number): process i connects there first."""
    k = i % len(urls)
    return [*urls[k:], *urls[:k]]


def round_order(shard_counts: Sequence[int], rounds: int) -> list[tuple[int, int]]:
    """(round, shards) in the order they run: every shard count once per round (1, 2, 4, 1, 2, 4, ...)."""
    return [(r, s) for r in range(rounds) for s in shard_counts]


def busy_share(before: Sequence[int] | None, after: Sequence[int] | None) -> float | None:
    """The share of the machine's CPU time (all cores) spent busy between two ``/proc/stat`` readings
    (everything but idle and iowait); None without readings or without time between them."""
    if not before or not after or len(before) < 5 or len(after) < 5:
        return None
    d = [b - a for a, b in zip(before, after, strict=False)][:8]
    total = sum(d)
    if total <= 0:
        return None
    return (total - d[3] - d[4]) / total


@dataclass
class RunFigures:
    """One measured window of one run: committed records and the CPU seconds of every process."""

    nodes: int
    shards: int
    round: int
    seconds: float  # the window's wall time
    steps: int  # records committed in the window (all StepDone but a few start and end records)
    servers: dict[str, float]  # CPU seconds by nats-server node name
    services: dict[str, float]  # CPU seconds by service process
    bench: float = 0.0  # the benchmark process's own CPU seconds
    machine_busy: float | None = None  # busy share of all cores (/proc/stat)
    cpus: int = 1
    leaders: dict[str, int] = field(default_factory=dict)  # shard streams led by each node
    quiet_before: float | None = None  # the machine's busy share just before the run's cluster started
    attempts: int = 1  # runs made for this one (a disturbed one is done again)
    run_seconds: float = 0.0  # the whole run: first start → last loop idle
    run_steps: int = 0  # the tool steps of the whole run

    @property
    def steps_per_s(self) -> float:
        return self.steps / self.seconds if self.seconds > 0 else 0.0

    @property
    def server_total(self) -> float:
        return sum(self.servers.values())

    @property
    def busiest(self) -> str:
        return max(self.servers, key=lambda n: self.servers[n]) if self.servers else ""

    @property
    def busiest_core(self) -> float:
        """The busiest nats-server's CPU as a share of one core over the window."""
        return self.servers.get(self.busiest, 0.0) / self.seconds if self.seconds > 0 else 0.0

    @property
    def node_shares(self) -> dict[str, float]:
        """Each node's share of all the nats-servers' CPU."""
        total = self.server_total
        return {n: (v / total if total > 0 else 0.0) for n, v in sorted(self.servers.items())}

    @property
    def busiest_share(self) -> float:
        """The busiest nats-server's share of all the nats-servers' CPU (1/nodes when even)."""
        return max(self.node_shares.values(), default=0.0)

    @property
    def services_core(self) -> float:
        """The service processes' CPU in cores over the window."""
        return sum(self.services.values()) / self.seconds if self.seconds > 0 else 0.0

    @property
    def services_share(self) -> float:
        """The service processes' share of the CPU every measured process used."""
        total = sum(self.services.values()) + self.server_total + self.bench
        return sum(self.services.values()) / total if total > 0 else 0.0

    @property
    def services_us_per_step(self) -> float:
        return sum(self.services.values()) / self.steps * 1e6 if self.steps else 0.0

    @property
    def servers_us_per_step(self) -> float:
        return self.server_total / self.steps * 1e6 if self.steps else 0.0

    @property
    def other_core(self) -> float | None:
        """Cores used by processes outside the deployment and the benchmark (others on the machine)."""
        if self.machine_busy is None or self.seconds <= 0:
            return None
        measured = (sum(self.services.values()) + self.server_total + self.bench) / self.seconds
        return max(0.0, self.machine_busy * self.cpus - measured)

    def to_json(self) -> dict[str, Any]:
        return {
            "nodes": self.nodes,
            "shards": self.shards,
            "round": self.round,
            "window_seconds": round(self.seconds, 3),
            "window_records": self.steps,
            "steps_per_s": round(self.steps_per_s, 1),
            "run_seconds": round(self.run_seconds, 3),
            "run_steps": self.run_steps,
            "run_steps_per_s": round(self.run_steps / self.run_seconds, 1) if self.run_seconds > 0 else 0.0,
            "server_cpu_s": self.servers,
            "service_cpu_s": self.services,
            "bench_cpu_s": self.bench,
            "busiest_server": self.busiest,
            "busiest_server_core": round(self.busiest_core, 3),
            "busiest_server_share": round(self.busiest_share, 3),
            "node_shares": {n: round(v, 3) for n, v in self.node_shares.items()},
            "services_core": round(self.services_core, 3),
            "services_share": round(self.services_share, 3),
            "services_us_per_step": round(self.services_us_per_step),
            "servers_us_per_step": round(self.servers_us_per_step),
            "machine_busy": None if self.machine_busy is None else round(self.machine_busy, 3),
            "other_core": None if self.other_core is None else round(self.other_core, 3),
            "machine_busy_before": None if self.quiet_before is None else round(self.quiet_before, 3),
            "cpus": self.cpus,
            "leaders": self.leaders,
            "attempts": self.attempts,
        }


def _median(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else 0.0


def summarise(runs: Sequence[RunFigures]) -> list[dict[str, Any]]:
    """Medians by (nodes, shards) over the rounds, with the rate against one shard.

    ``ratio``: the median of each round's rate ÷ the same round's one-shard rate on as many nodes
    (both measured in the same minutes); rounds without a one-shard run are left out of it.
    """
    base = {(r.nodes, r.round): r.steps_per_s for r in runs if r.shards == 1}
    out: list[dict[str, Any]] = []
    for nodes, shards in sorted({(r.nodes, r.shards) for r in runs}):
        mine = [r for r in runs if (r.nodes, r.shards) == (nodes, shards)]
        ratios = [r.steps_per_s / base[(nodes, r.round)] for r in mine if base.get((nodes, r.round))]
        names = sorted({n for r in mine for n in r.servers})
        busy = [r.machine_busy for r in mine if r.machine_busy is not None]
        other = [o for o in (r.other_core for r in mine) if o is not None]
        out.append(
            {
                "nodes": nodes,
                "shards": shards,
                "rounds": len(mine),
                "steps_per_s": round(_median([r.steps_per_s for r in mine]), 1),
                "all_steps_per_s": [round(r.steps_per_s, 1) for r in mine],
                "ratio": round(_median(ratios), 3) if ratios else None,
                "busiest_core": round(_median([r.busiest_core for r in mine]), 3),
                "busiest_share": round(_median([r.busiest_share for r in mine]), 3),
                "node_shares": {n: round(_median([r.node_shares.get(n, 0.0) for r in mine]), 3) for n in names},
                "services_core": round(_median([r.services_core for r in mine]), 3),
                "services_share": round(_median([r.services_share for r in mine]), 3),
                "services_us_per_step": round(_median([r.services_us_per_step for r in mine])),
                "servers_us_per_step": round(_median([r.servers_us_per_step for r in mine])),
                "machine_busy": round(_median(busy), 3) if busy else None,
                "other_core": round(_median(other), 3) if other else None,
                "cpus": mine[0].cpus,
            }
        )
    return out


def bottleneck(row: dict[str, Any]) -> str:
    """What limited a median row: ``services`` or ``machine CPU`` (the cores saturated, no server hot;
    the services took at least half of the measured CPU, or not), ``server`` or ``not CPU``."""
    busy = row.get("machine_busy")
    if busy is None:
        return "unknown"
    hot = row["busiest_core"] >= SERVER_HOT
    if busy >= SATURATED:
        if hot and row["services_share"] < 0.5:
            return "server"
        return "services" if row["services_share"] >= 0.5 else "machine CPU"
    return "server" if hot else "not CPU"


def _pct_range(xs: Sequence[float]) -> str:
    lo, hi = min(xs) * 100, max(xs) * 100
    return f"{lo:.0f} %" if round(lo) == round(hi) else f"{lo:.0f}–{hi:.0f} %"


def _cpu_limited(nodes: int, mine: Sequence[dict[str, Any]], kinds: set[str], busy_text: str) -> str:
    who = (
        "the services, not the busiest server, were the bottleneck"
        if kinds == {"services"}
        else "the machine's CPU, shared by the services and the nats-servers, not the busiest server, was the "
        "bottleneck"
    )
    svc = [r["services_share"] for r in mine]
    srv = [r["servers_us_per_step"] / ((r["servers_us_per_step"] + r["services_us_per_step"]) or 1) for r in mine]
    hot = max(r["busiest_core"] for r in mine)
    return (
        f"{nodes} nodes: {who}: the {mine[0]['cpus']} cores were saturated (busy {busy_text}), the "
        f"service processes used {_pct_range(svc)} of the measured CPU and the nats-servers together about "
        f"{_pct_range(srv)}, and the busiest nats-server at most {hot * 100:.0f} % of one core. More shards "
        "spread the servers' work over the nodes but cannot raise the rate here: every process shares the same cores."
    )


def _per_step(nodes: int, mine: Sequence[dict[str, Any]]) -> str | None:
    one = next((r for r in mine if r["shards"] == 1), None)
    most = max(mine, key=lambda r: r["shards"])
    if one is None or most is one:
        return None
    return (
        f"{nodes} nodes: CPU per committed step, services + nats-servers: {one['services_us_per_step']:,} + "
        f"{one['servers_us_per_step']:,} µs with 1 shard, {most['services_us_per_step']:,} + "
        f"{most['servers_us_per_step']:,} µs with {most['shards']}."
    )


def verdict(rows: Sequence[dict[str, Any]]) -> list[str]:
    """Sentences per node count on what limited its runs, from the medians."""
    out: list[str] = []
    for nodes in sorted({r["nodes"] for r in rows}):
        mine = [r for r in rows if r["nodes"] == nodes]
        kinds = {bottleneck(r) for r in mine}
        busy = [r["machine_busy"] for r in mine if r["machine_busy"] is not None]
        hot = max(r["busiest_core"] for r in mine)
        busy_text = _pct_range(busy) if busy else "not known"
        if kinds <= {"services", "machine CPU"}:
            out.append(_cpu_limited(nodes, mine, kinds, busy_text))
        elif kinds == {"server"}:
            out.append(
                f"{nodes} nodes: the busiest nats-server was hot (up to {hot * 100:.0f} % of one core; machine busy "
                f"{busy_text}): the servers' work limited the rate."
            )
        elif kinds == {"not CPU"}:
            out.append(
                f"{nodes} nodes: the machine was not saturated (busy {busy_text}) and no server was hot (at most "
                f"{hot * 100:.0f} % of one core): latency, not CPU, set the rate."
            )
        else:
            each = ", ".join(f"{r['shards']} shard(s): {bottleneck(r)}" for r in mine)
            out.append(f"{nodes} nodes: the limit changed with the shard count ({each}; machine busy {busy_text}).")
        per_step = _per_step(nodes, mine)
        if per_step:
            out.append(per_step)
        others = [r["other_core"] for r in mine if r.get("other_core") is not None]
        if others and max(others) >= OTHERS_NOTED:
            out.append(
                f"{nodes} nodes: processes outside the benchmark used {min(others):.2f}–{max(others):.2f} cores "
                "(medians) during the windows: the rates are lower, and noisier, than on a quiet machine."
            )
    return out
