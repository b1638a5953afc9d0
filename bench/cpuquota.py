"""A CPU quota per process, through the kernel's cgroup CPU controller (v1 or v2; needs root).

``python -m bench.scale --server-cpu 0.15`` gives each nats-server node 15 % of one core, as a node on a
machine (or container) of its own with a CPU limit would have: the busiest server, not the machine this
benchmark shares between every process, then limits the rate, which is what sharding is for.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

PERIOD_US = 100_000
_V1 = Path("/sys/fs/cgroup/cpu")
_V2 = Path("/sys/fs/cgroup")


def _root() -> tuple[Path, bool]:
    if (_V1 / "cpu.cfs_quota_us").exists():
        return _V1, False
    if (_V2 / "cgroup.controllers").exists() and "cpu" in (_V2 / "cgroup.controllers").read_text():
        return _V2, True
    raise RuntimeError("no cgroup CPU controller here: --server-cpu needs one (and root)")


def limit(pid: int, cores: float, name: str) -> Path:
    """Put ``pid`` (all its threads) in a new cgroup allowed ``cores`` of CPU time; the group's path."""
    root, v2 = _root()
    group = root / f"lw-bench-{name}-{pid}"
    group.mkdir(exist_ok=True)
    quota = max(1000, round(cores * PERIOD_US))
    if v2:
        (group / "cpu.max").write_text(f"{quota} {PERIOD_US}")
    else:
        (group / "cpu.cfs_period_us").write_text(str(PERIOD_US))
        (group / "cpu.cfs_quota_us").write_text(str(quota))
    (group / "cgroup.procs").write_text(str(pid))
    return group


def release(group: Path) -> None:
    """Remove a group made by :func:`limit` (its process has exited, or is moved back to the root)."""
    with contextlib.suppress(OSError):
        for pid in (group / "cgroup.procs").read_text().split():
            (group.parent / "cgroup.procs").write_text(pid)
    with contextlib.suppress(OSError):
        os.rmdir(group)
