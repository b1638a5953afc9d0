"""Tables shared by several scenarios: CPU per step by process, and nats-server traffic per step."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from bench.common import Row, table

# (label, loopwire process-name prefixes, floor process-name prefixes): the floor's driver runs the
# loops in the benchmark process, where loopwire runs them in the model-step.
PROCESS_GROUPS: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...] = (
    ("model-step / floor driver (runs the loops)", ("model-step",), ("driver",)),
    ("tool worker / tool responder", ("tools",), ("floor-tool",)),
    ("committer / commit responder", ("committer",), ("floor-commit",)),
    ("nats-server (all nodes)", ("nats-",), ("nats-",)),
    ("benchmark process (starts loops, waits for their end)", ("bench",), ()),
)


def _grp(d: dict[str, int], prefixes: tuple[str, ...]) -> int:
    return sum(v for k, v in d.items() if prefixes and k.startswith(prefixes))


def cpu_table(pairs: dict[str, Any]) -> str:
    """CPU µs per committed step by process, loopwire next to the floor: the medians of the
    alternating 64-loop runs (``bench.scenarios.cpu_pairs_summary``)."""
    title = (
        "where the CPU goes: CPU µs per committed step, 64 loops, 1 replica (user+system, /proc; "
        "medians of the alternating runs)"
    )
    headers = ["process", "loopwire", "floor", "× floor"]
    if not pairs:
        return table(title, headers, [])
    a, b = pairs["by_process"]["loopwire"], pairs["by_process"]["floor"]
    rows: list[list[Any]] = []
    for label, mine, theirs in PROCESS_GROUPS:
        x, y = _grp(a, mine), _grp(b, theirs)
        rows.append([label, x, y, f"{x / y:.2f}" if y else ""])
    ta, tb = sum(a.values()), sum(b.values())
    rows.append(["total (all processes)", ta, tb, f"{ta / tb:.2f}" if tb else ""])
    rows.append(["median of the rounds' ratios", "", "", f"{pairs['ratio']:.2f}"])
    return table(title, headers, rows)


def traffic_table(runs: Sequence[tuple[str, Row | None]]) -> str:
    """nats-server counters per committed step (``/varz``, summed over nodes), one line per run."""
    rows: list[list[Any]] = []
    for label, r in runs:
        tr = r.extra.get("traffic") if r is not None else None
        if not tr:
            rows.append([label, "not measured", "", "", "", ""])
            continue
        rows.append([label, tr["nodes"], tr["in_msgs"], tr["out_msgs"], round(tr["in_bytes"]), round(tr["out_bytes"])])
    return table(
        "messages through nats-server per committed step (/varz before → after the run, summed over nodes)",
        ["run", "nodes", "msgs in", "msgs out", "bytes in", "bytes out"],
        rows,
    )
