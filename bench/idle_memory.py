"""``python -m bench idle-memory``: the memory an idle loop costs each service.

One R1 deployment (one committer, one model-step, one calculator worker). The resident set of the
committer, the model-step and nats-server is read from ``/proc`` before and after ``loops`` loops each ran one
one-step turn and went idle; the difference per loop is what an idle loop costs each process (what
docs/scaling.md multiplies out). The processes keep what they keep for idle loops for as long as
they run, so the reading is taken after a pause that lets nothing more be freed.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from bench.lw import Deployment

PAUSE_SECONDS = 3.0


def rss_bytes(pid: int) -> int:
    """The process's resident set, from /proc (Linux)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def _pid(d: Deployment, role: str) -> int:
    if role == "nats-server":
        assert d.server is not None and d.server.proc is not None
        return d.server.proc.pid
    return d.pids(role)[0]


def per_loop(before: int, after: int, loops: int) -> float:
    """Bytes per loop of a growth from ``before`` to ``after`` over ``loops`` loops (never negative)."""
    return max(0, after - before) / loops


async def _measure(d: Deployment, loops: int) -> dict[str, Any]:
    await d.connect()
    await d.warm_up()
    roles = ("committer", "model-step", "nats-server")
    before = {role: rss_bytes(_pid(d, role)) for role in roles}
    t0 = time.monotonic()
    batch = 1000
    for start in range(0, loops, batch):
        await d.run_loops(min(batch, loops - start), 1, timeout=900)
    wall = time.monotonic() - t0
    await asyncio.sleep(PAUSE_SECONDS)
    after = {role: rss_bytes(_pid(d, role)) for role in roles}
    return {
        "loops": loops,
        "seconds": round(wall, 1),
        "rss_before_mib": {r: round(before[r] / 2**20, 1) for r in roles},
        "rss_after_mib": {r: round(after[r] / 2**20, 1) for r in roles},
        "bytes_per_idle_loop": {r: round(per_loop(before[r], after[r], loops)) for r in roles},
    }


def run_idle_memory_scenario(ctx: dict[str, Any], quick: bool) -> dict[str, Any]:
    loops = 1000 if quick else 10_000
    d = Deployment(env_extra={"LW_LOG_LEVEL": "WARNING"})
    d.start()
    try:
        result = asyncio.run(_run(d, loops))
    finally:
        d.stop()
    lines = [f"idle loops: {loops} (each one one-step turn, then idle), {result['seconds']} s to run them"]
    for role, b in result["bytes_per_idle_loop"].items():
        lines.append(
            f"  {role:<10} RSS {result['rss_before_mib'][role]} → {result['rss_after_mib'][role]} MiB: "
            f"{b / 1024:.1f} KiB per idle loop"
        )
    print("\n".join(lines))
    return {"scenario": "idle-memory", **result}


async def _run(d: Deployment, loops: int) -> dict[str, Any]:
    try:
        return await _measure(d, loops)
    finally:
        await d.close()
