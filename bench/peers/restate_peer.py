"""Restate: the server from the npm package ``@restatedev/restate-server``, the handler in the Python SDK.

``AgentLoop`` is a virtual object (one per loop key, Restate's per-session single writer); its
``run`` handler journals the instant model call and the calculator call with ``ctx.run_typed``
per step. The SDK app is served by hypercorn (HTTP/2) and registered with the server's admin API;
loops are invoked through the ingress. Default durability: every journal entry is appended to
Restate's log (Bifrost, local loglet on RocksDB with a WAL fsync, ``rocksdb-disable-wal-fsync =
false``) before the handler continues. A killed service process is retried by the server (default
retry policy: 500 ms initial, × 2), which replays the journal on the restarted process.

Processes: the server (``restate_server()``), the service (``python -m hypercorn
bench.peers.restate_peer:app``), the driver (``python -m bench.peers.restate_peer drive ...``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.peers.proto import emit, now
from bench.workload import instant_model, instant_tool

RESTATE_VERSION = "1.7.12"
CACHE = Path(os.environ.get("LW_BENCH_CACHE", Path.home() / ".cache" / "loopwire-bench"))


try:
    import restate
except ImportError:  # restate-sdk not installed: the peers scenario reports it
    restate = None


def _app() -> Any:
    agent = restate.VirtualObject("AgentLoop")

    @agent.handler()
    async def run(ctx: restate.ObjectContext, req: dict[str, Any]) -> str:
        steps = int(req["steps"])
        loop = ctx.key()
        k = 0
        while True:
            r = await ctx.run_typed("model", instant_model, restate.RunOptions(), k, steps)
            if "tool_call" not in r:
                emit("DONE", loop, now())
                return str(r["text"])
            await ctx.run_typed("tool", instant_tool, restate.RunOptions(), r["tool_call"]["args"])
            emit("STEP", loop, k, now())  # replays after a retry print again: the first time counts
            k += 1

    return restate.app([agent])


app = _app() if restate is not None else None


def server_binary() -> Path:
    """The restate-server binary from the npm package (installed into the cache on first use)."""
    prefix = CACHE / "restate"
    exe = prefix / "node_modules" / ".bin" / "restate-server"
    if not exe.exists():
        npm = shutil.which("npm")
        if npm is None:
            raise RuntimeError("npm is not installed: cannot install @restatedev/restate-server")
        prefix.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [
                npm,
                "install",
                "--no-audit",
                "--no-fund",
                "--prefix",
                str(prefix),
                f"@restatedev/restate-server@{RESTATE_VERSION}",
            ],
            check=True,
            capture_output=True,
            timeout=600,
        )
    return exe


@dataclass
class RestateServer:
    work: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="lw-bench-restate-")))
    proc: subprocess.Popen[bytes] | None = None
    ports: dict[str, int] = field(default_factory=dict)

    @property
    def admin(self) -> str:
        return f"http://127.0.0.1:{self.ports['admin']}"

    @property
    def ingress(self) -> str:
        return f"http://127.0.0.1:{self.ports['ingress']}"

    @property
    def data_dir(self) -> Path:
        return self.work / "data"

    def start(self, timeout: float = 60) -> RestateServer:
        from shared.natsserver import free_port
        from shared.procs import die_with_parent

        self.ports = {"node": free_port(), "admin": free_port(), "ingress": free_port()}
        cfg = self.work / "restate.toml"
        cfg.write_text(
            f'base-dir = "{self.data_dir}"\ndisable-telemetry = true\nlisten-mode = "tcp"\n'
            f'bind-address = "127.0.0.1:{self.ports["node"]}"\n'
            f'[admin]\nbind-address = "127.0.0.1:{self.ports["admin"]}"\n'
            f'[ingress]\nbind-address = "127.0.0.1:{self.ports["ingress"]}"\n'
        )
        log = open(self.work / "server.log", "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [str(server_binary()), "--config-file", str(cfg), "--no-logo"],
            stdout=log,
            stderr=log,
            stdin=subprocess.DEVNULL,
            preexec_fn=die_with_parent,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{self.ingress}/restate/health", timeout=1):
                    pass
                with urllib.request.urlopen(f"{self.admin}/health", timeout=1):
                    return self
            except OSError:
                time.sleep(0.2)
        raise RuntimeError(f"restate-server not healthy after {timeout}s")

    def register(self, uri: str, timeout: float = 30) -> None:
        body = json.dumps({"uri": uri, "force": True}).encode()
        deadline = time.monotonic() + timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            try:
                req = urllib.request.Request(
                    f"{self.admin}/deployments", data=body, headers={"content-type": "application/json"}
                )
                with urllib.request.urlopen(req, timeout=10):
                    return
            except OSError as e:
                last = e
                time.sleep(0.3)
        raise RuntimeError(f"could not register {uri} with restate: {last}")

    def disk_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.data_dir.rglob("*") if p.is_file())

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        shutil.rmtree(self.work, ignore_errors=True)


async def drive(ingress: str, loops: int, steps: int, prefix: str) -> None:
    import httpx

    limits = httpx.Limits(max_connections=max(loops, 10), max_keepalive_connections=max(loops, 10))
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        emit("READY")

        async def one(i: int, prefix: str = prefix, steps: int = steps) -> None:
            loop = f"{prefix}-{i}"
            r = await client.post(f"{ingress}/AgentLoop/{loop}/run", json={"steps": steps})
            r.raise_for_status()
            emit("DONE", loop, now())

        await asyncio.gather(*(one(i, prefix=f"warm{prefix}", steps=5) for i in range(min(loops, 4))))
        emit("BEGIN", now())
        await asyncio.gather(*(one(i) for i in range(loops)))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.peers.restate_peer")
    p.add_argument("mode", choices=("drive",))
    p.add_argument("--ingress", required=True)
    p.add_argument("--loops", type=int, default=1)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--prefix", default="rs")
    a = p.parse_args(argv)
    asyncio.run(drive(a.ingress, a.loops, a.steps, a.prefix))
    return 0


if __name__ == "__main__":
    sys.exit(main())
