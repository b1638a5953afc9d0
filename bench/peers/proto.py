"""The line protocol between a peer's worker process and the benchmark (stdout, one event a line).

    READY                       the worker is set up (imports, connections, schema)
    BEGIN <t>                   it starts the loops (wall clock, time.time())
    STEP <loop> <k> <t>         tool step k of a loop is durable (per the system's own durability)
    DONE <loop> <t>             the loop ended (final answer recorded)
    BYTES <n>                   storage the system used for the run (if the worker can tell)

A worker that recovers after a crash prints steps again that the system replays; the benchmark
keeps the first time it saw each (loop, k).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from shared.procs import die_with_parent


def emit(*fields: object) -> None:
    sys.stdout.write(" ".join(str(f) for f in fields) + "\n")
    sys.stdout.flush()


def now() -> float:
    return time.time()


@dataclass
class Collected:
    begin: float = 0.0
    steps: dict[tuple[str, int], float] = field(default_factory=dict)
    done: dict[str, float] = field(default_factory=dict)
    bytes: int = 0
    lines: list[str] = field(default_factory=list)

    def intervals(self) -> list[float]:
        out: list[float] = []
        by_loop: dict[str, list[tuple[int, float]]] = {}
        for (loop, k), t in self.steps.items():
            by_loop.setdefault(loop, []).append((k, t))
        for items in by_loop.values():
            ts = [t for _, t in sorted(items)]
            out.extend(b - a for a, b in itertools.pairwise(ts))
        return out

    def max_k(self, loop: str) -> int:
        return max((k for (lp, k) in self.steps if lp == loop), default=-1)


class Worker:
    """A peer worker subprocess whose stdout lines are parsed as they arrive."""

    def __init__(
        self, args: Sequence[str], env: dict[str, str] | None = None, log_path: str = "", group: bool = False
    ) -> None:
        # group: the worker forks children (hypercorn): run it in its own process group, kill the group.
        self.group = group
        self.collected = Collected()
        self._q: queue.Queue[str | None] = queue.Queue()
        log = open(log_path, "ab") if log_path else subprocess.DEVNULL  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, *args],
            env={**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=log,
            preexec_fn=die_with_parent,
            start_new_session=group,
        )
        if log is not subprocess.DEVNULL:
            log.close()  # type: ignore[union-attr]
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.ready = False

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            self._q.put(raw.decode(errors="replace").strip())
        self._q.put(None)

    def _handle(self, line: str) -> None:
        c = self.collected
        c.lines.append(line)
        parts = line.split()
        if not parts or (len(parts) > 1 and parts[1].startswith("warm")):
            return  # warm-up loops are not measured
        if parts[0] == "READY":
            self.ready = True
        elif parts[0] == "BEGIN":
            c.begin = float(parts[1])
        elif parts[0] == "STEP" and len(parts) == 4:
            c.steps.setdefault((parts[1], int(parts[2])), float(parts[3]))
        elif parts[0] == "DONE" and len(parts) == 3:
            c.done.setdefault(parts[1], float(parts[2]))
        elif parts[0] == "BYTES":
            c.bytes = int(parts[1])

    def pump(self, until: object, timeout: float) -> bool:
        """Read lines until ``until(collected, worker)`` is true; False on timeout or exit."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if until(self.collected, self):  # type: ignore[operator]
                return True
            try:
                line = self._q.get(timeout=0.05)
            except queue.Empty:
                continue
            if line is None:
                return bool(until(self.collected, self))  # type: ignore[operator]
            self._handle(line)
        return False

    def wait_ready(self, timeout: float = 120) -> None:
        if not self.pump(lambda c, w: w.ready, timeout):
            raise RuntimeError(f"worker not ready: {self.tail()}")

    def wait_done(self, loops: int, timeout: float) -> None:
        if not self.pump(lambda c, w: len(c.done) >= loops, timeout):
            raise RuntimeError(f"worker did not finish {loops} loops in {timeout}s: {self.tail()}")

    def tail(self) -> str:
        return " | ".join(self.collected.lines[-5:])

    def _signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if self.group:
                os.killpg(self.proc.pid, sig)
            else:
                os.kill(self.proc.pid, sig)

    def kill(self) -> None:
        self._signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc.poll() is None or self.group:
            self._signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()
            if self.group:
                self._signal(signal.SIGKILL)  # children that outlived the leader
