"""nats-server nodes whose store directories sit on :mod:`tests.system.powerfs` mounts, and the power
cut: SIGKILL the node, drop what its file system had not synced, unmount, mount again, restart."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from shared.natsserver import NatsCluster, NatsServer, free_port
from shared.procs import die_with_parent

ROOT = Path(__file__).resolve().parents[2]


def fuse_missing() -> str:
    """Why no powerfs mount can be made here ("" when one can): /dev/fuse, fusermount3, mfusepy."""
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse"
    if shutil.which("fusermount3") is None:
        return "no fusermount3 (Debian package fuse3)"
    try:
        import mfusepy  # type: ignore[import-untyped]  # noqa: F401
    except (ImportError, OSError) as e:  # OSError: libfuse3 itself is missing
        return f"mfusepy unusable: {e}"
    return ""


@dataclass
class PowerMount:
    """One powerfs mount of ``backing`` at ``mount``, with its control socket."""

    base: Path
    backing: Path = field(init=False)
    mount: Path = field(init=False)
    control: Path = field(init=False)
    proc: subprocess.Popen[bytes] | None = None
    dropped: list[tuple[int, int]] = field(default_factory=list)  # (files, bytes) per power cut

    def __post_init__(self) -> None:
        self.backing, self.mount, self.control = self.base / "disk", self.base / "mnt", self.base / "ctl.sock"
        self.backing.mkdir(parents=True, exist_ok=True)
        self.mount.mkdir(parents=True, exist_ok=True)

    def up(self, timeout: float = 10.0) -> None:
        self.control.unlink(missing_ok=True)
        log = open(self.base / "powerfs.log", "ab")  # noqa: SIM115  # the child keeps it
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.system.powerfs", str(self.backing), str(self.mount), str(self.control)],
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            preexec_fn=die_with_parent,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while not (os.path.ismount(self.mount) and self.control.exists()):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"powerfs did not mount {self.mount}: {(self.base / 'powerfs.log').read_text()}")
            time.sleep(0.05)

    def cut_power(self) -> tuple[int, int]:
        """Drop every unsynced write; the mount answers EIO from then on. Returns (files, bytes)."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(30)
            s.connect(str(self.control))
            s.sendall(b"drop\n")
            _, files, dropped = s.recv(128).decode().split()
        self.dropped.append((int(files), int(dropped)))
        return self.dropped[-1]

    def down(self) -> None:
        """Unmount (lazily: a killed server's last handles may still be closing) and end the daemon."""
        subprocess.run(["fusermount3", "-u", "-z", str(self.mount)], capture_output=True, check=False)
        if self.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=5)
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(timeout=5)
            self.proc = None


@dataclass
class PowerCluster:
    """A 3-node JetStream cluster, each node's store on a powerfs mount of its own."""

    base: Path
    sync: str
    cluster: NatsCluster = field(init=False)
    mounts: list[PowerMount] = field(default_factory=list)

    def start(self, timeout: float = 30.0) -> PowerCluster:
        cports = [free_port() for _ in range(3)]
        self.mounts = [PowerMount(self.base / f"n{i + 1}") for i in range(3)]
        nodes = [
            NatsServer(
                name=f"n{i + 1}",
                store_dir=str(m.mount),
                log_file=str(m.base / "nats-server.log"),  # off the mount: it survives the cut
                cluster_port=cports[i],
                routes=cports,
                sync=self.sync,
            )
            for i, m in enumerate(self.mounts)
        ]
        self.cluster = NatsCluster(size=3, base_dir=str(self.base), nodes=nodes, sync=self.sync)
        for m in self.mounts:
            m.up()
        for n in nodes:
            n.start(wait=False)
        for n in nodes:
            n.wait_ready(timeout=timeout, jetstream=False)
        self.cluster.wait_meta_leader(timeout=timeout)
        return self

    def mount_of(self, node: NatsServer) -> PowerMount:
        return self.mounts[self.cluster.nodes.index(node)]

    def cut_power(self, nodes: list[NatsServer]) -> tuple[int, int]:
        """The same instant for every node in ``nodes``: SIGKILL all, then drop their unsynced writes."""
        for n in nodes:
            n.signal(signal.SIGKILL)
        for n in nodes:
            n.kill()  # reaps it
        files = dropped = 0
        for n in nodes:
            f, b = self.mount_of(n).cut_power()
            files, dropped = files + f, dropped + b
        for n in nodes:
            self.mount_of(n).down()
        return files, dropped

    def power_on(self, nodes: list[NatsServer], timeout: float = 60.0) -> None:
        """Mount each node's disk again and start its server (from the main thread: PDEATHSIG)."""
        for n in nodes:
            self.mount_of(n).up()
            n.start(wait=False)
        for n in nodes:
            n.wait_ready(timeout=timeout, jetstream=False)

    def cleanup(self) -> None:
        self.cluster.stop()
        for m in self.mounts:
            m.down()


@contextlib.contextmanager
def power_cluster(base: Path, sync: str) -> Iterator[PowerCluster]:
    pc = PowerCluster(base, sync)
    try:
        yield pc.start()
    finally:
        pc.cleanup()
