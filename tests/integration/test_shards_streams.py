"""``loopwire streams`` on a 3-node R3 cluster with LW_SHARDS=3: every shard's four streams with their
leaders, and ``--balance`` leaves each node leading exactly one shard's four streams."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import anyio
import pytest

from shared import placement
from shared.connect import connect
from shared.natsserver import NatsCluster
from shared.settings import Settings
from shared.streams import ensure_all
from tests import natsfixtures

pytestmark = [pytest.mark.anyio, pytest.mark.cluster]

LOOPWIRE = shutil.which("loopwire", path=str(Path(sys.executable).parent)) or "loopwire"


def streams_cmd(settings: Settings, *args: str) -> str:
    env = {
        **os.environ,
        "LW_NATS_URL": ",".join(settings.nats_urls),
        "LW_PREFIX": settings.prefix,
        "LW_SHARDS": str(settings.shards),
        "COLUMNS": "200",
    }
    done = subprocess.run([LOOPWIRE, "streams", *args], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


async def test_streams_lists_every_shard_and_balance_puts_one_shard_on_each_node(nats_cluster: NatsCluster) -> None:
    settings = Settings.from_env(
        {}, nats_urls=tuple(nats_cluster.urls), prefix=natsfixtures.unique_prefix(), replicas=3, shards=3
    )
    nc = await connect(settings, name="test")
    try:
        await ensure_all(nc.jetstream(), settings)
        first = nats_cluster.nodes[0].name
        # Start from the worst case: one node leads everything.
        for p in await placement.read(nc, settings.names):
            await placement.step_down(nc, p.stream, first)
    finally:
        await nc.close()

    rows = [json.loads(x) for x in (await anyio.to_thread.run_sync(streams_cmd, settings, "--json")).splitlines()]
    assert [(r["shard"], r["kind"]) for r in rows] == [
        (k, kind) for k in range(3) for kind in ("history", "work", "leases", "results")
    ]
    assert {r["leader"] for r in rows} == {first}
    assert all(r["replicas"] == 3 and len(r["followers"]) == 2 and not r["missing"] for r in rows)
    assert rows[0]["name"] == settings.names.history_stream_of(0) and rows[3]["stream"] == f"KV_{rows[3]['name']}"

    text = await anyio.to_thread.run_sync(streams_cmd, settings, "--balance")
    assert text.count("moved the leader of") == 8  # two shards' four streams leave the first node

    rows = [json.loads(x) for x in (await anyio.to_thread.run_sync(streams_cmd, settings, "--json")).splitlines()]
    led: dict[str, set[int]] = defaultdict(set)
    for r in rows:
        led[r["leader"]].add(r["shard"])
        assert nats_cluster.stream_leader(r["stream"]).name == r["leader"]  # type: ignore[union-attr]
    # Every node leads exactly one shard, all four of its streams.
    assert sorted(led) == sorted(n.name for n in nats_cluster.nodes)
    assert all(len(shards) == 1 for shards in led.values())

    again = await anyio.to_thread.run_sync(streams_cmd, settings, "--balance")
    assert "balanced already: nothing moved" in again
