"""A fault scenario's service processes (:class:`Fleet`): started, killed, stopped and replaced
without blocking the event loop, each role its own OS process (see docs/reliability.md).
"""

from __future__ import annotations

import contextlib
import random
import signal
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import anyio

from services.deployment import Deployment, service_command, tool_command
from shared.natsserver import NatsCluster
from shared.procs import ServiceProcess
from shared.settings import Settings
from tests.syshelpers import System

ROLES: dict[str, list[str]] = {
    "committer": service_command("committer"),
    "model-step": service_command("model-step"),
    "tools-calc": tool_command("calculator", "clock"),
    "tools-sleep": tool_command("sleep"),
    # one tool per process (a NATS identity per tool: see test_security)
    "tools-calculator": tool_command("calculator"),
    "tools-clock": tool_command("clock"),
    # records every execution it starts in the file LW_LEDGER names (tests/system/ledger_tool.py)
    "tools-ledger": tool_command(
        "tests.system.ledger_tool:ledger",
        "tests.system.ledger_tool:ledger_idem",
        "tests.system.ledger_tool:ledger_destructive",
    ),
}
DEFAULT_FLEET: dict[str, int] = {"committer": 2, "model-step": 2, "tools-calc": 2, "tools-sleep": 2}


@dataclass
class Fleet:
    """Service processes of one scenario (a :class:`System`), started and replaced without blocking the loop."""

    sysm: System
    cluster: NatsCluster | None = None
    rng: random.Random = field(default_factory=lambda: random.Random(7))

    @property
    def settings(self) -> Settings:
        return self.sysm.settings

    @property
    def deployment(self) -> Deployment:
        return self.sysm.deployment

    def new_process(self, role: str, env: dict[str, str] | None = None) -> ServiceProcess:
        return self.deployment.process(role, ROLES[role], env)

    def start_all(self, counts: dict[str, int], timeout: float = 60.0) -> None:
        """Start every process at once, then wait for each READY (main thread: PDEATHSIG)."""
        procs = [self.new_process(role) for role, n in counts.items() for _ in range(n)]
        self.deployment.start_all(procs, timeout=timeout)

    def live(self, role: str) -> list[ServiceProcess]:
        return self.deployment.running(role)

    def pick(self, role: str) -> ServiceProcess:
        return self.rng.choice(self.live(role))

    async def spawn(self, role: str, env: dict[str, str] | None = None, timeout: float = 60.0) -> ServiceProcess:
        p = self.deployment.start(role, ROLES[role], env, wait=False)  # Popen here, in the main thread
        await anyio.to_thread.run_sync(p.wait_ready, timeout)
        return p

    async def replace(self, old: ServiceProcess) -> ServiceProcess:
        """A fresh process of ``old``'s role; ``old`` (already dead) is forgotten."""
        old.kill()
        p = self.deployment.replace(old, wait=False)  # Popen here, in the event loop's (main) thread
        await anyio.to_thread.run_sync(p.wait_ready, 60.0)
        return p

    async def stop(self, p: ServiceProcess, timeout: float = 30.0) -> int | None:
        """SIGTERM (graceful drain) without blocking the event loop."""
        code = await anyio.to_thread.run_sync(p.stop, timeout)
        self.deployment.sup.remove(p)
        return code

    def all_running(self) -> list[str]:
        """Names of processes that died unexpectedly (empty when every one runs)."""
        return [
            f"{p.name}[{p.proc.pid if p.proc else '?'}] exit {p.proc.poll() if p.proc else '?'}"
            for p in self.deployment.dead()
        ]


@contextmanager
def fleet(
    settings: Settings,
    cluster: NatsCluster | None = None,
    counts: dict[str, int] | None = None,
    env: dict[str, str] | None = None,
    log_dir: Path | None = None,
    role_env: dict[str, dict[str, str]] | None = None,
) -> Iterator[Fleet]:
    """Start the fleet (logs in ``log_dir``, e.g. pytest's tmp_path so they outlive a failure, else a temp dir);
    ``role_env``: each role's own variables (e.g. its NATS identity)."""
    with contextlib.ExitStack() as stack:
        if log_dir is None:
            log_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="lw-faults-")))
        log_dir.mkdir(parents=True, exist_ok=True)
        d = Deployment.for_settings(settings, log_dir, env=env, role_env=role_env)
        f = Fleet(sysm=System(settings, d), cluster=cluster)
        with d.stopped_on_exit():
            f.start_all(counts or DEFAULT_FLEET)
            yield f


def sigstop(p: ServiceProcess) -> None:
    p.signal(signal.SIGSTOP)


def sigcont(p: ServiceProcess) -> None:
    p.signal(signal.SIGCONT)
