"""Shared pieces of every scenario: percentiles, result rows, tables, JSON output, machine facts."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def pct(values: Sequence[float], p: float) -> float:
    """The p-quantile (0..1) of ``values`` by nearest rank; 0.0 for no values."""
    if not values:
        return 0.0
    xs = sorted(values)
    k = min(len(xs) - 1, max(0, round(p * (len(xs) - 1))))
    return xs[k]


def ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


@dataclass
class Row:
    """One measured figure set; ``extra`` holds scenario-specific columns."""

    scenario: str
    system: str
    config: str
    steps: int = 0
    seconds: float = 0.0
    p50_ms: float = 0.0
    p99_ms: float = 0.0
    steps_per_s: float = 0.0
    durability: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_latencies(
        cls,
        scenario: str,
        system: str,
        config: str,
        latencies: Sequence[float],
        seconds: float,
        *,
        steps: int | None = None,
        durability: str = "",
        **extra: Any,
    ) -> Row:
        n = len(latencies) if steps is None else steps
        return cls(
            scenario=scenario,
            system=system,
            config=config,
            steps=n,
            seconds=round(seconds, 4),
            p50_ms=ms(pct(latencies, 0.50)),
            p99_ms=ms(pct(latencies, 0.99)),
            steps_per_s=round(n / seconds, 1) if seconds > 0 else 0.0,
            durability=durability,
            extra=dict(extra),
        )


def table(title: str, headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A plain aligned text table (also valid inside a Markdown code block)."""
    body = [[_cell(v) for v in r] for r in rows]
    widths = [len(h) for h in headers]
    for r in body:
        for i, v in enumerate(r):
            widths[i] = max(widths[i], len(v))
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))
    out = [title, line, "  ".join("-" * w for w in widths)]
    for r in body:
        out.append("  ".join(v.rjust(w) if _numeric(v) else v.ljust(w) for v, w in zip(r, widths, strict=True)))
    return "\n".join(out)


def _cell(v: Any) -> str:
    if isinstance(v, float):
        if v == 0:
            return "0"
        if abs(v) >= 1000:
            return f"{v:,.0f}"
        if abs(v) >= 100:
            return f"{v:.1f}"
        return f"{v:.3g}" if abs(v) < 1 else f"{v:.2f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def _numeric(s: str) -> bool:
    return bool(s) and s.replace(",", "").replace(".", "").replace("-", "").replace("x", "").isdigit()


def ratio(a: float, b: float) -> float:
    return round(a / b, 3) if b else 0.0


def machine_facts() -> dict[str, Any]:
    """What the figures depend on: CPU, memory, load, versions."""
    facts: dict[str, Any] = {
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
    }
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                facts["cpu_model"] = line.split(":", 1)[1].strip()
                break
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                facts["mem_gib"] = round(int(line.split()[1]) / 1024 / 1024, 1)
                break
    except OSError:
        pass
    facts["versions"] = _versions()
    return facts


def cpu_stat() -> list[int] | None:
    """The machine's CPU time counters (the first line of ``/proc/stat``); None where there is none."""
    try:
        return [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None


def steal_share(before: list[int] | None, after: list[int] | None) -> float | None:
    """The share of the machine's CPU time between two :func:`cpu_stat` readings that the hypervisor
    gave to other guests (``steal``): on a shared virtual machine the wall-clock figures of a run
    with much steal are slower than the code, and the CPU figures less comparable with other runs."""
    if not before or not after or len(before) < 8 or len(after) < 8:
        return None
    d = [b - a for a, b in zip(before[:8], after[:8], strict=True)]  # user .. steal (guest is inside user)
    total = sum(d)
    return d[7] / total if total > 0 else None


def _versions() -> dict[str, str]:
    from importlib import metadata

    out: dict[str, str] = {}
    for dist in (
        "nats-py",
        "msgspec",
        "anyio",
        "uvloop",
        "langgraph",
        "langgraph-checkpoint-postgres",
        "psycopg",
        "dbos",
        "restate-sdk",
        "hypercorn",
        "matplotlib",
    ):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "not installed"
    try:
        from shared.natsserver import server_binary

        v = subprocess.run([server_binary(), "--version"], capture_output=True, text=True, timeout=10).stdout
        out["nats-server"] = v.strip().split()[-1] if v.strip() else "?"
    except Exception:
        out["nats-server"] = "?"
    pg = shutil.which("postgres") or next(iter(sorted(Path("/usr/lib/postgresql").glob("*/bin/postgres"))), None)
    if pg:
        with contextlib.suppress(Exception):
            out["postgres"] = subprocess.run(
                [str(pg), "--version"], capture_output=True, text=True, timeout=10
            ).stdout.strip()
    return out


def write_json(scenario: str, payload: dict[str, Any], out_dir: Path | None = None) -> Path:
    d = out_dir or RESULTS_DIR
    d.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = d / f"{scenario}-{stamp}.json"
    path.write_text(json.dumps(payload, indent=2, default=_json_default))
    latest = d / f"{scenario}-latest.json"
    latest.write_text(path.read_text())
    return path


def _json_default(o: Any) -> Any:
    if isinstance(o, Row):
        return asdict(o)
    if isinstance(o, Path):
        return str(o)
    raise TypeError(type(o).__name__)


def mean(values: Sequence[float]) -> float:
    return statistics.fmean(values) if values else 0.0
