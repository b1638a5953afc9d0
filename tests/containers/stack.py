"""compose.yaml's topology run by Docker, built and started with testcontainers; loops driven from the
host as the operator user (through nats-1's published port) or by ``docker compose run cli``.

The images come from this machine alone (deploy/images/build-base.sh): no image registry is used.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import anyio
import docker
import pytest
from testcontainers.compose import DockerCompose
from testcontainers.core.image import DockerImage

from shared.client import LoopClient
from shared.connect import connect
from shared.settings import Settings
from shared.turns import TurnOutcome, wait_for_turn
from tests.syshelpers import check_history_invariants, history, wait_history
from tests.system.faultchecks import turn_violations

ROOT: Final = Path(__file__).resolve().parents[2]
BASE_IMAGE: Final = "loopwire-base:bookworm"
NATS_IMAGE: Final = "loopwire-nats:2.15.1"
PROJECT_IMAGE: Final = "loopwire:latest"
CLI_ENV: Final = {"LW_NATS_USER": "operator", "LW_NATS_PASSWORD": "dev-operator"}


def prepare_images() -> dict[str, float]:
    """The engine, the compose plugin and the base images (each made once), then the project image
    built by testcontainers; the seconds each part took."""
    took: dict[str, float] = {}
    t = time.monotonic()
    subprocess.run(["bash", str(ROOT / "deploy/images/build-base.sh")], check=True, timeout=1800)
    took["build-base.sh"] = time.monotonic() - t
    t = time.monotonic()
    # network_mode host: pip reaches PyPI through the host (dockerd runs without NAT rules here).
    image = DockerImage(
        path=ROOT,
        tag=PROJECT_IMAGE,
        clean_up=False,
        buildargs={"BASE_IMAGE": BASE_IMAGE},
        network_mode="host",
    )
    image.build()
    took["docker build"] = time.monotonic() - t
    return took


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Stack:
    """One running compose project."""

    compose: DockerCompose
    project: str
    nats_port: int

    def cmd(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """``docker compose ARGS`` for this project; raises with its output if it fails."""
        full = [*self.compose.docker_compose_command(), *args]
        proc = subprocess.run(full, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
        assert proc.returncode == 0, f"{' '.join(full)}: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
        return proc

    def cli(self, *args: str, timeout: float = 120) -> str:
        """The loopwire CLI in a one-off container of the ``cli`` service; its stdout."""
        return self.cmd("run", "--rm", "-T", "cli", *args, timeout=timeout).stdout

    def containers(self, service: str) -> list[docker.models.containers.Container]:
        client = docker.from_env()
        labels = [f"com.docker.compose.project={self.project}", f"com.docker.compose.service={service}"]
        found = client.containers.list(all=True, filters={"label": labels})
        return sorted(found, key=lambda c: int(c.labels.get("com.docker.compose.container-number", "0")))

    def settings(self) -> Settings:
        env = {
            "LW_NATS_URL": f"nats://127.0.0.1:{self.nats_port}",
            "LW_PREFIX": "lw",
            "LW_SHARDS": os.environ.get("LW_SHARDS", "1"),
            "LW_NATS_INBOX_PREFIX": "_INBOX_operator",
            **CLI_ENV,
        }
        return Settings.from_env(env)

    def nats_logs(self) -> str:
        return self.cmd("logs", "--no-color", "nats-1", "nats-2", "nats-3").stdout

    def down(self) -> None:
        """``down --volumes``: every container, volume and network of the project removed.

        Debian's engine (20.10) now and then keeps a removed container's endpoint on the project's
        network and refuses to remove it: with every container and volume gone, the network is
        pruned instead, or else left behind with a warning (nothing of the stack runs).
        """
        full = [*self.compose.docker_compose_command(), "down", "--volumes", "--timeout", "45"]
        proc = subprocess.run(full, cwd=ROOT, capture_output=True, text=True, timeout=300)
        if proc.returncode == 0:
            return
        stuck = "has active endpoints" in proc.stderr and not self.all_containers()
        assert stuck, f"{' '.join(full)}: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
        label = f"label=com.docker.compose.project={self.project}"
        subprocess.run(["docker", "network", "prune", "-f", "--filter", label], capture_output=True, timeout=60)
        left = docker.from_env().networks.list(filters={"label": f"com.docker.compose.project={self.project}"})
        print(f"warning: a stale endpoint on {self.project}_default; {'left behind' if left else 'pruned'}")

    def all_containers(self) -> list[docker.models.containers.Container]:
        client = docker.from_env()
        return list(client.containers.list(all=True, filters={"label": f"com.docker.compose.project={self.project}"}))

    def up(self, *extra: str) -> None:
        """Bring every service to its wanted state again (after kills, stops or a scale)."""
        self.cmd("up", "-d", "--wait", "--wait-timeout", "150", *extra, timeout=300)


@contextmanager
def running_stack(env: dict[str, str] | None = None) -> Iterator[Stack]:
    """compose.yaml up (default services and replicas), with the local images; down -v afterwards."""
    project = f"lwtest{uuid.uuid4().hex[:8]}"
    port = free_port()  # never the host's own 4222
    values = {
        "COMPOSE_PROJECT_NAME": project,
        "LW_NATS_IMAGE": NATS_IMAGE,
        "LW_BASE_IMAGE": BASE_IMAGE,
        "LW_NATS_PORT": str(port),
        **(env or {}),
    }
    with pytest.MonkeyPatch.context() as mp:
        for k, v in values.items():
            mp.setenv(k, v)  # testcontainers' compose commands inherit the environment
        # wait=False, then a bounded wait: `up --wait` alone waits for ever on a service that keeps
        # restarting without becoming healthy.
        compose = DockerCompose(ROOT, compose_file_name="compose.yaml", wait=False)
        stack = Stack(compose, project, port)
        try:
            compose.start()
            stack.up()
            yield stack
        finally:
            try:
                print(stack.cmd("logs", "--no-color", "--tail", "40", timeout=120).stdout[-20_000:])
            finally:
                stack.down()


async def start_turns(stack: Stack, n: int, text: str = "what is 17*23?") -> list[tuple[str, str, int]]:
    """``n`` new loops, each given ``text``: (loop id, command id, seq) of each input."""
    settings = stack.settings()
    nc = await connect(settings)
    try:
        client = LoopClient(nc, settings.names)
        out = []
        for _ in range(n):
            loop_id = str(uuid.uuid4())
            await client.start(loop_id)
            res = await client.input(loop_id, text)
            out.append((loop_id, res.command_id, res.seq))
        return out
    finally:
        await nc.close()


async def finish_turns(stack: Stack, turns: Sequence[tuple[str, str, int]], timeout: float) -> list[TurnOutcome]:
    """Wait for every turn to end; their outcomes, in order."""
    settings = stack.settings()
    nc = await connect(settings)
    outcomes: dict[int, TurnOutcome] = {}
    try:

        async def one(i: int, loop_id: str, command_id: str, seq: int) -> None:
            outcomes[i] = await wait_for_turn(nc, settings.names, loop_id, command_id, seq)

        with anyio.fail_after(timeout):
            async with anyio.create_task_group() as tg:
                for i, (loop_id, command_id, seq) in enumerate(turns):
                    tg.start_soon(one, i, loop_id, command_id, seq)
    finally:
        await nc.close()
    return [outcomes[i] for i in range(len(turns))]


async def check_histories(stack: Stack, loop_ids: Sequence[str]) -> dict[str, list[str]]:
    """Every loop's stored records once it is idle: valid, unique, in order, every turn whole; each
    loop's types. (The turn's end and LoopIdle are separate commits: a turn seen ended may not be idle yet.)"""
    settings = stack.settings()
    nc = await connect(settings)
    kinds: dict[str, list[str]] = {}
    try:
        for loop_id in loop_ids:
            await wait_history(nc, settings, loop_id, lambda h: h.idle, timeout=60)
            events = await history(nc, settings, loop_id)
            check_history_invariants(events)
            assert turn_violations(events) == [], loop_id
            kinds[loop_id] = [type(e).__name__ for _, e in events]
    finally:
        await nc.close()
    return kinds
