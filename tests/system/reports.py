"""Figures the system suite collects during a run: printed at the end and written as JSON.

JSON goes to ``$LW_RELIABILITY_OUT`` when set, else to a temporary directory (CI) or, in long mode,
to ``bench/results/reliability-<name>.json``.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.system.scenarioreport import ScenarioReport, format_table

SCENARIOS: list[ScenarioReport] = []
EXTRA: dict[str, Any] = {}
_written: list[Path] = []


def add_scenario(r: ScenarioReport) -> None:
    SCENARIOS.append(r)


def add_figure(name: str, value: Any) -> None:
    EXTRA[name] = value


def output_path(name: str, long: bool) -> Path:
    explicit = os.environ.get("LW_RELIABILITY_OUT", "").strip()
    if explicit:
        base = Path(explicit)
    elif long:
        base = Path(__file__).resolve().parents[2] / "bench" / "results"
    else:
        base = Path(tempfile.gettempdir()) / "loopwire-reliability"
    base.mkdir(parents=True, exist_ok=True)
    return base / f"reliability-{name}.json"


def write(name: str, long: bool, payload: dict[str, Any]) -> Path:
    path = output_path(name, long)
    doc = {"generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "long": long, **payload}
    path.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    _written.append(path)
    return path


def summary() -> str:
    parts: list[str] = []
    if SCENARIOS:
        parts.append(format_table(SCENARIOS))
    for k, v in sorted(EXTRA.items()):
        parts.append(f"{k}: {v}")
    for p in _written:
        parts.append(f"written: {p}")
    return "\n".join(parts)
