"""nats-server cluster operations for fault scenarios (blocking calls moved off the event loop)."""

from __future__ import annotations

import time

import anyio

from shared.natsserver import NatsCluster, NatsServer


async def stream_leader(cluster: NatsCluster, stream: str, timeout: float = 30.0) -> NatsServer:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        leader = await anyio.to_thread.run_sync(cluster.stream_leader, stream)
        if leader is not None:
            return leader
        await anyio.sleep(0.2)
    raise TimeoutError(f"no leader for {stream}")


async def restart_node(cluster: NatsCluster, node: NatsServer, timeout: float = 60.0) -> None:
    node.start(wait=False)  # Popen in the main thread (PDEATHSIG)
    await anyio.to_thread.run_sync(lambda: node.wait_ready(timeout=timeout, jetstream=False))
    await anyio.to_thread.run_sync(lambda: cluster.wait_meta_leader(timeout=timeout))


def restore_cluster(cluster: NatsCluster) -> None:
    """Start every node that is down (a failed scenario must not leave the module's cluster broken)."""
    for node in cluster.nodes:
        if not node.running:
            node.start(wait=False)
    for node in cluster.nodes:
        node.wait_ready(timeout=30, jetstream=False)
    cluster.wait_meta_leader(timeout=30)
