"""Sharded deployments: growing from one shard (``loopwire shards grow``) keeps every loop readable and
drivable, and the shard count is otherwise chosen once. Checked from the stored records of each shard's stream."""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import anyio
import pytest
from nats.aio.client import Client as NATS

from bench.lw import stored_at
from services.deployment import service_command, service_env
from shared import placement, shards
from shared.client import LoopClient
from shared.connect import connect
from shared.events import Limits
from shared.jserrors import JetStreamError, JetStreamUnavailableError
from shared.natsserver import NatsCluster
from shared.replay import loops, replay
from shared.settings import Settings
from shared.shards import META_GREW, META_SHARDS
from shared.streamreads import direct_get_batch
from shared.streams import ensure_all
from shared.subjects import H_TIMESTAMP, Names, kv_stream
from tests import natsfixtures
from tests.syshelpers import loop_ids_per_shard, system, wait_history, write_script
from tests.system.clusterops import restore_cluster

pytestmark = [pytest.mark.anyio, pytest.mark.system]


def _calc_step() -> list[dict[str, object]]:
    return [
        {"kind": "tool_use", "index": 0, "id": "call_0_{k}", "name": "calculator"},
        {"kind": "tool_use", "index": 0, "text": '{"expression": "6*7"}'},
        {"kind": "finish", "finish_reason": "tool_use"},
    ]


async def _records_by_stream(nc: NATS, settings: Settings, loop_id: str) -> dict[str, int]:
    """How many records of ``loop_id`` each history stream holds (a loop lives in exactly one)."""
    names = settings.names
    out: dict[str, int] = {}
    for h in shards.history_streams(names):
        info = await nc.jetstream().stream_info(h.stream, subjects_filter=names.hist_in(h.shard, loop_id))
        if info.state.subjects:
            out[h.stream] = sum(info.state.subjects.values())
    return out


async def test_a_deployment_grown_from_one_shard_keeps_its_loops_readable_and_drivable(
    settings: Settings, nc: NATS, tmp_path: Path
) -> None:
    one = settings
    three = dataclasses.replace(settings, shards=3)
    chat = write_script(tmp_path, ["first answer", "second answer"], "chat.json")
    gated = write_script(tmp_path, {"responses": [_calc_step(), "42 it is"]}, "gated.json")
    idle, parked = str(uuid.uuid4()), str(uuid.uuid4())
    with system(one, tools=("calculator",)):
        lc = LoopClient(nc, one.names)
        await lc.start(idle, model=chat)
        await lc.input(idle, "hello")
        await lc.start(parked, model=gated, policy={"calculator": "ask"})
        await lc.input(parked, "compute")
        await wait_history(nc, one, idle, lambda h: h.idle and h.turns == 1)
        before = [(seq, type(e).__name__) for seq, e in [r async for r in replay(nc, idle, settings=one)]]
        h = await wait_history(nc, one, parked, lambda h: bool(h.open_gates))
        (gate,) = h.open_gates

    # Every service stopped, the deployment grown, then every service started again (reading three).
    grow = [sys.executable, "-m", "services.cli", "shards", "grow", "3"]
    env = {**os.environ, **service_env(settings.nats_urls, settings.prefix)}
    grown = await anyio.to_thread.run_sync(
        lambda: subprocess.run(grow, env=env, capture_output=True, text=True, timeout=60, check=False)
    )
    assert grown.returncode == 0, grown.stderr
    with system(settings, tools=("calculator",)):
        info = await nc.jetstream().stream_info(three.names.history_stream_of(0))
        assert (info.config.metadata or {}).get(META_SHARDS) == "3"
        assert (info.config.metadata or {}).get(META_GREW) == "1"
        lc = LoopClient(nc, three.names)
        again = [(seq, type(e).__name__) for seq, e in [r async for r in replay(nc, idle, settings=three)]]
        assert again == before  # readable, unchanged
        await lc.input(idle, "and again")
        await lc.answer(parked, gate.gate.id, "approve")
        await wait_history(nc, three, idle, lambda h: h.idle and h.turns == 2)
        await wait_history(nc, three, parked, lambda h: h.idle and h.turns == 1)
        # The old loops went on in shard 0's stream, whatever their hash says.
        for loop_id in (idle, parked):
            assert list(await _records_by_stream(nc, three, loop_id)) == [three.names.history_stream_of(0)]
        # New loops live in their own shards and run.
        new = list(itertools.chain(*loop_ids_per_shard(three.names, 3).values()))
        for loop_id in new:
            await lc.start(loop_id, model=chat)
            await lc.input(loop_id, "hi")
        for loop_id in new:
            await wait_history(nc, three, loop_id, lambda h: h.idle and h.turns == 1)
            where = await _records_by_stream(nc, three, loop_id)
            assert list(where) == [three.names.history_stream_of(three.names.shard_of(loop_id))]
        assert set(await loops(nc, three.names)) == {idle, parked, *new}


def test_a_service_with_another_shard_count_refuses_to_start(settings: Settings) -> None:
    # The deployment exists with three shards; a committer configured with two must not use it.
    three = dataclasses.replace(settings, shards=3)
    with system(three, committers=1, model_steps=0, tools=()):
        env = service_env(settings.nats_urls, settings.prefix, shards=2, extra={"LW_CONNECT_SECONDS": "10"})
        done = subprocess.run(
            [sys.executable, *service_command("committer")],
            env={**os.environ, **env},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert done.returncode != 0
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert "cannot start: LW_SHARDS=2 but the deployment" in done.stderr, done.stderr[-2000:]


# --- one shard's leader lost ----------------------------------------------------------------------

STEPS = 40
SLEEP = 0.2  # each step's tool call: a loop steps about every SLEEP seconds
PER_SHARD = 3
KILL_AFTER = 3.0
# A loop of a shard whose leaders live elsewhere steps every SLEEP (plus a commit); a gap this long
# means the kill stalled it. The stalled shard's loops wait for its leader elections.
OTHER_SHARD_GAP = 2.0
ELECTION_BOUND = 15.0


def _sleep_script(steps: int) -> dict[str, object]:
    step = [
        {"kind": "tool_use", "index": 0, "id": "sleep_{k}", "name": "sleep"},
        {"kind": "tool_use", "index": 0, "text": json.dumps({"seconds": SLEEP})},
        {"kind": "finish", "finish_reason": "tool_use"},
    ]
    return {"responses": [*([step] * steps), "slept"]}


async def _stored_at(nc: NATS, names: Names, loop_id: str) -> list[float]:
    """When each of the loop's records was stored (the server's own stamp), in order."""
    home = await shards.home_of(nc, names, loop_id)
    out: list[float] = []
    start = 1
    while True:
        b = await direct_get_batch(nc, home.stream, home.subject, start_seq=start)
        out += [stored_at(m.headers.get(H_TIMESTAMP, "")) for m in b.messages]
        if not b.messages or b.num_pending == 0:
            return out
        start = b.messages[-1].seq + 1


def _electing(e: Exception) -> bool:
    """A read refused while a leader is elected: no answer, or the server's 503 (its meta leader lost)."""
    return isinstance(e, JetStreamUnavailableError) or (isinstance(e, JetStreamError) and e.retryable)


async def _until_idle(nc: NATS, settings: Settings, loop_id: str, timeout: float = 120.0) -> None:
    """Until the loop rests after its turn; reads of a shard whose leader is being elected are retried."""
    with anyio.fail_after(timeout):
        while True:
            try:
                await wait_history(nc, settings, loop_id, lambda h: h.idle and h.turns == 1, timeout=timeout)
                return
            except (JetStreamUnavailableError, JetStreamError) as e:
                if not _electing(e):
                    raise
            await anyio.sleep(0.5)


def _longest_gap(stamps: list[float], since: float) -> float:
    """The longest time between two consecutive records stored after ``since`` (or from ``since``)."""
    later = [since, *[t for t in stamps if t > since]]
    return max((b - a for a, b in itertools.pairwise(later)), default=0.0)


@pytest.mark.parametrize("urls", ["survivors", "all"])
async def test_killing_one_shard_s_leader_node_stalls_only_that_shard(
    nats_cluster: NatsCluster, tmp_path: Path, urls: str
) -> None:
    """``survivors``: the services and the client know only the nodes that stay up, and the tools
    bucket is led off the victim. ``all``: each lists every node, as deployed, the victim's first
    (``LW_NATS_IN_ORDER=1``), so every one of them is connected to the victim when it dies and
    reconnects elsewhere; the tools bucket stays where the cluster put it."""
    names_of = natsfixtures.unique_prefix()
    settings = Settings.from_env({}, nats_urls=tuple(nats_cluster.urls), prefix=names_of, replicas=3, shards=3)
    names = settings.names
    nc = await connect(settings, name="test")
    try:
        await ensure_all(nc.jetstream(), settings)
        await placement.balance(nc, names)
        leaders = {p.shard: p.leader for p in await placement.read(nc, names) if p.kind == "history"}
        victim_shard = 1
        victim = next(n for n in nats_cluster.nodes if n.name == leaders[victim_shard])
        others = [n for n in nats_cluster.nodes if n is not victim]
        if urls == "survivors":
            # What every shard shares (the tools bucket) stays off the victim node.
            await placement.step_down(nc, kv_stream(names.tools_bucket), others[0].name)
            served = dataclasses.replace(settings, nats_urls=tuple(n.url for n in others))
            env: dict[str, str] = {}
        else:
            served = dataclasses.replace(settings, nats_urls=(victim.url, *(n.url for n in others)), nats_in_order=True)
            env = {"LW_NATS_IN_ORDER": "1"}
        await nc.close()
        nc = await connect(served, name="test")
        model = write_script(tmp_path, _sleep_script(STEPS), "sleepy.json")
        ids = loop_ids_per_shard(names, PER_SHARD)
        with system(served, committers=2, model_steps=2, tools=("sleep",), env=env):
            # The model-steps made each shard's work consumer: its leader joins its shard's node.
            await placement.balance(nc, names)
            assert {p.shard: p.leader for p in await placement.read(nc, names) if p.kind == "history"} == leaders
            lc = LoopClient(nc, names)
            for loop_id in itertools.chain(*ids.values()):
                await lc.start(loop_id, model=model, limits=Limits(max_iterations=STEPS + 5))
                await lc.input(loop_id, "sleep")
            await anyio.sleep(KILL_AFTER)
            killed_at = time.time()
            victim.kill()
            for loop_id in itertools.chain(*ids.values()):
                await _until_idle(nc, served, loop_id)
            gaps = {k: [_longest_gap(await _stored_at(nc, names, x), killed_at) for x in v] for k, v in ids.items()}
    finally:
        await nc.close()
        restore_cluster(nats_cluster)
    print(f"longest gap after the kill, per shard (s): { {k: [round(g, 2) for g in v] for k, v in gaps.items()} }")
    for k, v in gaps.items():
        if k == victim_shard:
            assert max(v) <= ELECTION_BOUND, gaps
        else:
            assert max(v) <= OTHER_SHARD_GAP, gaps
            assert max(v) < max(gaps[victim_shard]), gaps  # the kill did stall the victim's shard
