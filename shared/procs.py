"""Start loopwire services as separate OS processes and stop them cleanly (tests, embedded mode, benches).

A service prints ``READY`` on stdout once it serves (``services.runner``); :meth:`ServiceProcess.start`
waits for that line. Children get ``PR_SET_PDEATHSIG`` so they die with their parent even when the
parent is SIGKILLed: no orphan keeps a port open. (The signal follows the *thread* that started
the child, so start processes from the main thread.)
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from shared.errors import ServiceStartError as ServiceStartError

READY_LINE = "READY"
_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """preexec_fn: deliver SIGKILL to this child when its parent exits (Linux)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


@dataclass
class ServiceProcess:
    """One service process, e.g. ``ServiceProcess("committer", ["-m", "services.committer"], env)``."""

    name: str
    args: list[str]
    env: dict[str, str] = field(default_factory=dict)
    log_path: str = ""
    proc: subprocess.Popen[bytes] | None = None

    def start(self, *, timeout: float = 30.0, wait: bool = True) -> ServiceProcess:
        env = {**os.environ, **self.env, "PYTHONUNBUFFERED": "1"}
        log = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
        try:
            self.proc = subprocess.Popen(
                [sys.executable, *self.args],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=log,
                preexec_fn=die_with_parent,
            )
        finally:
            if log is not subprocess.DEVNULL:
                log.close()  # type: ignore[union-attr]
        if wait:
            self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout: float = 30.0) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        buf = b""
        fd = self.proc.stdout.fileno()
        while time.monotonic() < deadline:
            r, _, _ = select.select([fd], [], [], 0.1)
            if r:
                chunk = os.read(fd, 4096)
                if not chunk:
                    break
                buf += chunk
                if READY_LINE.encode() in buf:
                    return
            elif self.proc.poll() is not None:
                break
        code = self.proc.poll()
        self.kill()
        raise ServiceStartError(f"{self.name} not ready after {timeout}s (exit {code}): {self.log_tail()}")

    def log_tail(self, n: int = 30) -> str:
        if not self.log_path:
            return ""
        with contextlib.suppress(OSError):
            return "\n".join(Path(self.log_path).read_text(errors="replace").splitlines()[-n:])
        return ""

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        if self.running:
            assert self.proc is not None
            self.proc.send_signal(sig)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        self.signal(signal.SIGCONT)
        if self.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=10)

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM, wait, then SIGKILL; returns the exit status."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.signal(signal.SIGCONT)
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        return self.proc.returncode


@dataclass
class Supervisor:
    """Several service processes, stopped in reverse start order."""

    services: list[ServiceProcess] = field(default_factory=list)

    def start(self, svc: ServiceProcess, *, timeout: float = 30.0, wait: bool = True) -> ServiceProcess:
        self.services.append(svc)
        return svc.start(timeout=timeout, wait=wait)

    def start_all(self, procs: Sequence[ServiceProcess], *, timeout: float = 30.0) -> None:
        """Start every process at once, then wait for each READY (faster than one after the other)."""
        for svc in procs:
            self.start(svc, wait=False)
        for svc in procs:
            svc.wait_ready(timeout)

    def remove(self, svc: ServiceProcess) -> None:
        """Forget ``svc`` (stopped, or about to be replaced): :meth:`stop_all` no longer sees it."""
        self.services.remove(svc)

    def by_name(self, name: str) -> list[ServiceProcess]:
        return [s for s in self.services if s.name == name]

    def dead(self) -> list[ServiceProcess]:
        """The processes that exited (or never started)."""
        return [s for s in self.services if not s.running]

    def stop_all(self, timeout: float = 15.0) -> None:
        for svc in reversed(self.services):
            svc.signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for svc in reversed(self.services):
            svc.stop(timeout=max(0.1, deadline - time.monotonic()))

    def __enter__(self) -> Supervisor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_all()
