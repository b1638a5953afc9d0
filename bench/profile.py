"""Profile the services on the hot path with py-spy while loops run (``python -m bench profile``).

Attaches ``py-spy record --format raw`` (collapsed stacks) to every committer, tool worker and
model-step process for the length of a run, then prints for each process the functions with the
most samples: *self* (where the CPU is) and *inclusive* (which call paths cost the most).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any


def py_spy() -> str | None:
    found = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    return found if Path(found).exists() else None


class Profiler:
    """py-spy attached to a set of pids until :meth:`stop`."""

    def __init__(self, pids: dict[str, int], out_dir: Path, rate: int = 250) -> None:
        self.out_dir = out_dir
        self.procs: dict[str, tuple[subprocess.Popen[bytes], Path]] = {}
        exe = py_spy()
        if exe is None:
            return
        out_dir.mkdir(parents=True, exist_ok=True)
        for name, pid in pids.items():
            path = out_dir / f"{name}.txt"
            p = subprocess.Popen(
                [
                    exe,
                    "record",
                    "--pid",
                    str(pid),
                    "--format",
                    "raw",
                    "--rate",
                    str(rate),
                    "--output",
                    str(path),
                    "--nonblocking",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            self.procs[name] = (p, path)

    def stop(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, (p, path) in self.procs.items():
            p.send_signal(2)  # SIGINT: py-spy writes its output and exits
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
            if path.exists():
                out[name] = summarise(path.read_text())
        return out


def _frame(f: str) -> str:
    # "function (path/to/file.py:123)" -> "function (file.py)"
    name, _, where = f.partition(" (")
    file = where.split(":")[0].rsplit("/", 1)[-1]
    return f"{name} ({file})" if file else name


_GENERIC = (
    "base_events.py",
    "events.py",
    "runners.py",
    "<frozen runpy>",
    "runner.py",
    "__main__.py",
    "_asyncio.py",
    "_eventloop.py",
    "tasks.py",
    "threading.py",
    "_tasks.py",
    "selectors.py",
)


def summarise(raw: str, top: int = 25) -> dict[str, Any]:
    """Self and inclusive shares of the busy (non-idle) samples per function, from collapsed stacks.

    Samples waiting in the event loop's ``select`` are idle and counted apart; the inclusive list
    leaves out the event loop's and the runner's own frames (every stack has them).
    """
    self_c: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    total = idle = 0
    for line in raw.splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack or not n.isdigit():
            continue
        count = int(n)
        frames = [_frame(f) for f in stack.split(";")]
        frames = [f for f in frames if "(" in f]
        if not frames:
            continue
        # Waiting in the event loop's select, or a thread blocked on a lock (anyio's idle worker
        # threads), is idle time, not work.
        if frames[-1].startswith(
            ("select (selectors.py)", "EpollSelector.select", "Condition.wait (threading.py)")
        ) or (frames[-1].startswith("wait (threading.py)")):
            idle += count
            continue
        total += count
        self_c[frames[-1]] += count
        for f in set(frames):
            if not f.endswith(tuple(f"({g})" for g in _GENERIC)):
                incl[f] += count
    busy = total or 1
    return {
        "samples": total + idle,
        "busy_samples": total,
        "idle_pct": round(100 * idle / max(1, total + idle), 1),
        "self": [(f, round(100 * c / busy, 1)) for f, c in self_c.most_common(top)],
        "inclusive": [(f, round(100 * c / busy, 1)) for f, c in incl.most_common(top)],
    }


def render(profiles: dict[str, Any], top: int = 15) -> str:
    lines = []
    for name, prof in profiles.items():
        lines.append(f"--- {name}: {prof['busy_samples']} busy samples ({prof['idle_pct']}% of all samples idle)")
        lines.append("  self%   function (share of busy samples)")
        for f, p in prof["self"][:top]:
            lines.append(f"  {p:5.1f}   {f}")
        lines.append("  incl%   function")
        for f, p in prof["inclusive"][:top]:
            lines.append(f"  {p:5.1f}   {f}")
    return "\n".join(lines)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used so far (Linux /proc)."""
    import os

    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


class CpuMeter:
    """CPU seconds used by each named process between construction and :meth:`stop`."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = dict(pids)
        self.start = {name: cpu_seconds(pid) for name, pid in self.pids.items()}

    def stop(self) -> dict[str, float]:
        return {name: round(cpu_seconds(pid) - self.start[name], 4) for name, pid in self.pids.items()}


def pids_by_comm(*names: str) -> list[int]:
    """Pids of the running processes whose command name is one of ``names`` (e.g. "postgres")."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if (d / "comm").read_text().strip() in names:
                    out.append(int(d.name))
            except OSError:
                continue
    return out


class GroupCpu:
    """CPU seconds used by a group of processes: fixed pids plus every process with a given name.

    Processes of the named kind that start during the measurement count in full (a Postgres
    backend per new connection); ones that exit before :meth:`stop` are missed, so stop while
    the measured system is still up.
    """

    def __init__(self, pids: list[int], comms: tuple[str, ...] = ()) -> None:
        self.pids = list(pids)
        self.comms = comms
        self.start = {pid: cpu_seconds(pid) for pid in self._all()}

    def _all(self) -> list[int]:
        return sorted(set(self.pids) | set(pids_by_comm(*self.comms) if self.comms else []))

    def stop(self) -> float:
        return round(sum(cpu_seconds(pid) - self.start.get(pid, 0.0) for pid in self._all()), 4)
