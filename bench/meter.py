"""Measuring one run: CPU per process and nats-server traffic; figures of alternating rounds."""

from __future__ import annotations

import statistics
from typing import Any

from bench.common import table
from bench.profile import CpuMeter
from bench.traffic import Traffic, snapshot


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


def add_cpu(total: dict[str, float], meter: RunMeter) -> None:
    """Add ``meter``'s CPU seconds by process to ``total``."""
    for name, used in meter.cpu.items():
        total[name] = total.get(name, 0.0) + used


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
