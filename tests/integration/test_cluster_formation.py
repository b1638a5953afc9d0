"""Streams and buckets are created while a cluster is still forming.

A JetStream cluster that has too few JetStream peers refuses a replicated stream with error 10005
("no suitable peers for placement"). Here the third node first runs without JetStream (so every R3
creation gets 10005, deterministically), then is restarted with it, as a node joining late would.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import nats
import pytest

from services.deployment import Deployment, service_command, service_env
from shared.jserrors import JetStreamUnavailableError
from shared.natsserver import NatsServer, free_port
from shared.settings import Settings
from shared.streams import ensure_all
from tests import natsfixtures

pytestmark = [pytest.mark.anyio, pytest.mark.cluster]


@pytest.fixture
def forming() -> Iterator[list[NatsServer]]:
    """Three routed nodes; only n1 and n2 run JetStream."""
    with tempfile.TemporaryDirectory(prefix="lw-forming-") as base:
        ports = [free_port() for _ in range(3)]
        nodes = [
            NatsServer(name=f"n{i + 1}", store_dir=str(Path(base) / f"n{i + 1}"), cluster_port=ports[i], routes=ports)
            for i in range(3)
        ]
        nodes[2].jetstream = False
        try:
            for n in nodes:
                n.start(wait=False)
            for n in nodes:
                n.wait_ready(timeout=30, jetstream=False)
            yield nodes
        finally:
            for n in nodes:
                n.stop()


def r3(nodes: list[NatsServer]) -> Settings:
    return Settings.from_env({}, nats_urls=(nodes[0].url,), prefix=natsfixtures.unique_prefix(), replicas=3)


def join_with_jetstream(node: NatsServer) -> None:
    node.stop()
    node.jetstream = True
    node.start(wait=False)


async def test_creation_waits_for_the_cluster_to_form(forming: list[NatsServer], tmp_path: Path) -> None:
    settings = r3(forming)
    nc = await nats.connect(forming[0].url)
    try:
        js = nc.jetstream(timeout=5)
        with anyio.fail_after(30):  # a meta leader first: then placement is what fails
            while True:
                try:
                    await js.account_info()
                    break
                except Exception:
                    await anyio.sleep(0.2)
        # Nothing can be placed yet: bounded, then a clear error naming the refusal.
        t0 = time.monotonic()
        with pytest.raises(JetStreamUnavailableError, match=r"no suitable peers|10005"):
            await ensure_all(js, settings, wait_seconds=2)
        assert time.monotonic() - t0 < 10

        # A committer started now waits; once the third node joins with JetStream, it serves.
        committer = Deployment(service_env([forming[0].url], settings.prefix, 3), tmp_path)
        proc = committer.start("committer", service_command("committer"), wait=False)
        try:
            await anyio.sleep(2)
            assert proc.running, proc.log_tail()
            await anyio.to_thread.run_sync(join_with_jetstream, forming[2])
            await anyio.to_thread.run_sync(proc.wait_ready, 60)
            await ensure_all(js, settings)  # the committer created everything with 3 replicas
            info = await js.stream_info(settings.names.history_stream)
            assert info.config.num_replicas == 3
        finally:
            proc.stop()
    finally:
        await nc.close()
