"""A set of loopwire service processes: each role's command, every process's environment and log file.

Everything that starts services as OS processes is built on :class:`Deployment`: the embedded stack
(``loopwire up`` / ``demo``), the system tests' ``System`` and ``Fleet``, and the benchmarks. A role
runs as ``python -m services.cli serve ...`` (:func:`service_command`), the entry a container runs.
Processes are started from the calling thread, which must be the main one: ``PR_SET_PDEATHSIG``
follows the thread that forks (see :mod:`shared.procs`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from shared.procs import ServiceProcess, Supervisor
from shared.settings import Settings

SERVE: Final = ("-m", "services.cli", "serve")
# Connection variables of another deployment that must not reach the services of an isolated one.
FOREIGN_CONNECTION_VARS: Final = (
    "LW_NATS_USER",
    "LW_NATS_PASSWORD",
    "LW_NATS_CREDS",
    "LW_NATS_TLS_CA",
    "LW_NATS_TLS_CERT",
    "LW_NATS_TLS_KEY",
    "LW_NATS_INBOX_PREFIX",
    "LW_NATS_MONITOR_URL",
)
LOG_TAIL_LINES: Final = 15


def service_command(service: str, *args: str) -> list[str]:
    """Arguments after the interpreter for one service: ``committer``, ``model-step``, ``tool NAME...``,
    ``mcp NAME -- COMMAND...`` or ``agent NAME ...``."""
    return [*SERVE, service, *args]


def tool_command(*tools: str) -> list[str]:
    """One tool worker serving ``tools`` (built-in names or ``module:attr``)."""
    return service_command("tool", *tools)


def console_command(port: int) -> list[str]:
    """The operator console on ``port``."""
    return ["-m", "services.cli", "console", "--port", str(port)]


def service_env(
    nats_urls: Sequence[str],
    prefix: str,
    replicas: int = 1,
    *,
    shards: int = 0,
    log_level: str = "INFO",
    isolated: bool = False,
    monitor_urls: Sequence[str] = (),
    extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The variables every process of a deployment gets (on top of this process's environment).

    ``isolated``: blank :data:`FOREIGN_CONNECTION_VARS` (empty is the default: no auth, no TLS).
    """
    env = dict.fromkeys(FOREIGN_CONNECTION_VARS, "") if isolated else {}
    env.update(
        {
            "LW_NATS_URL": ",".join(nats_urls),
            "LW_PREFIX": prefix,
            "LW_REPLICAS": str(replicas),
            # Blank (0): every process reads the deployment's count; a number chooses a new one's.
            "LW_SHARDS": str(shards) if shards else "",
            "LW_LOG_LEVEL": log_level,
        }
    )
    if monitor_urls:  # the servers' sync_interval is checked at start-up (services.synccheck)
        env["LW_NATS_MONITOR_URL"] = ",".join(monitor_urls)
    env.update(extra or {})
    return env


@dataclass
class Deployment:
    """Service processes sharing one environment; each logs to a file of its own in ``log_dir``."""

    env: dict[str, str]
    log_dir: Path
    role_env: dict[str, dict[str, str]] = field(default_factory=dict)  # by process name, e.g. a NATS identity
    sup: Supervisor = field(default_factory=Supervisor)
    _logs: int = 0

    @classmethod
    def for_settings(
        cls,
        settings: Settings,
        log_dir: Path,
        *,
        log_level: str = "INFO",
        env: Mapping[str, str] | None = None,
        role_env: dict[str, dict[str, str]] | None = None,
    ) -> Deployment:
        base = service_env(
            settings.nats_urls,
            settings.prefix,
            settings.replicas,
            shards=settings.shards,
            log_level=log_level,
            monitor_urls=settings.nats_monitor_urls,
            extra=env,
        )
        return cls(base, log_dir, role_env or {})

    @property
    def processes(self) -> list[ServiceProcess]:
        return self.sup.services

    def log_path(self, name: str) -> str:
        """A new log file for a process called ``name`` (numbered: a replacement gets its own)."""
        self._logs += 1
        return str(self.log_dir / f"{name}-{self._logs}.log")

    def process(
        self, name: str, args: Sequence[str], env: Mapping[str, str] | None = None, *, log_name: str = ""
    ) -> ServiceProcess:
        """A process (not started) with the deployment's env, ``name``'s role env and ``env`` on top."""
        full = {**self.env, **self.role_env.get(name, {}), **(env or {})}
        log = str(self.log_dir / log_name) if log_name else self.log_path(name)
        return ServiceProcess(name, list(args), full, log_path=log)

    def start(
        self,
        name: str,
        args: Sequence[str],
        env: Mapping[str, str] | None = None,
        *,
        timeout: float = 30.0,
        wait: bool = True,
    ) -> ServiceProcess:
        """Start one process; with ``wait``, return once it printed READY (else raise ServiceStartError)."""
        return self.sup.start(self.process(name, args, env), timeout=timeout, wait=wait)

    def start_all(self, procs: Sequence[ServiceProcess], *, timeout: float = 30.0) -> None:
        """Start every process at once, then wait until each is READY."""
        self.sup.start_all(procs, timeout=timeout)

    def replace(self, old: ServiceProcess, *, timeout: float = 30.0, wait: bool = True) -> ServiceProcess:
        """A fresh process with ``old``'s name, command and env (after a kill); ``old`` is stopped
        (SIGTERM, SIGKILL after 5 s) and forgotten."""
        old.stop(timeout=5)
        self.sup.remove(old)
        new = ServiceProcess(old.name, old.args, old.env, log_path=self.log_path(old.name))
        return self.sup.start(new, timeout=timeout, wait=wait)

    def running(self, name: str) -> list[ServiceProcess]:
        return [p for p in self.sup.by_name(name) if p.running]

    def dead(self) -> list[ServiceProcess]:
        return self.sup.dead()

    def stop_all(self, timeout: float = 15.0) -> None:
        """Stop every process (SIGTERM to all, then each waited for; SIGKILL at ``timeout``)."""
        self.sup.stop_all(timeout=timeout)

    def log_tails(self, lines: int = LOG_TAIL_LINES) -> str:
        """The last lines of every log file in ``log_dir`` (what explains a failure)."""
        out = []
        for p in sorted(self.log_dir.glob("*.log")):
            out.append(f"--- {p.name}\n" + "\n".join(p.read_text(errors="replace").splitlines()[-lines:]))
        return "\n".join(out)

    @contextlib.contextmanager
    def stopped_on_exit(self) -> Iterator[Deployment]:
        """Stop every process on the way out; print the log tails first when an exception leaves."""
        try:
            yield self
        except BaseException:
            print(self.log_tails())
            raise
        finally:
            self.stop_all()
