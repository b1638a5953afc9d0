"""A fault scenario's figures (:class:`ScenarioReport`) and the table that prints them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class ScenarioReport:
    scenario: str
    loops: int
    loops_completed: int = 0
    steps_committed: int = 0
    wall_seconds: float = 0.0
    max_stall_seconds: float = 0.0  # no loop at all advanced
    max_loop_stall_seconds: float = 0.0  # one loop did not advance (normal waits included)
    client_errors: dict[str, int] = field(default_factory=dict)
    tool_fault_results: dict[str, int] = field(default_factory=dict)
    tool_retries: int = 0  # seen on the live subjects (a retried call's result is the tool's answer)
    observer_read_errors: int = 0
    faults: list[str] = field(default_factory=list)
    fresh_loops_ok: bool = False
    violations: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def format_table(reports: Sequence[ScenarioReport]) -> str:
    head = (
        "scenario",
        "loops done",
        "steps",
        "wall s",
        "max stall s (all loops)",
        "max stall s (one loop)",
        "client errors",
        "tool fault results",
        "violations",
    )
    rows = [
        (
            r.scenario,
            f"{r.loops_completed}/{r.loops}",
            str(r.steps_committed),
            f"{r.wall_seconds:.1f}",
            f"{r.max_stall_seconds:.1f}",
            f"{r.max_loop_stall_seconds:.1f}",
            ", ".join(f"{k}×{v}" for k, v in sorted(r.client_errors.items())) or "0",
            ", ".join(
                [f"{k.removeprefix('error: ')}×{v}" for k, v in sorted(r.tool_fault_results.items())]
                + ([f"retried×{r.tool_retries}"] if r.tool_retries else [])
            )
            or "0",
            str(len(r.violations)),
        )
        for r in reports
    ]
    widths = (
        [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(head)] if rows else [len(h) for h in head]
    )
    lines = [
        "| " + " | ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)) + " |",
        "|" + "|".join("-" * (w + 2) for w in widths) + "|",
    ]
    lines += ["| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |" for row in rows]
    return "\n".join(lines)
