"""The shard count is the deployment's: every process reads it from shard 0's stream at connect.

Clients and services started without ``LW_SHARDS`` see every shard of a sharded deployment; a
process whose ``LW_SHARDS`` disagrees refuses to start in one line and creates or rewrites nothing;
growing is ``loopwire shards grow N``, refused while services run. Each service and each command is
its own OS process.
"""

from __future__ import annotations

import dataclasses
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

from services.deployment import service_command, service_env
from shared.client import LoopClient
from shared.connect import connect
from shared.natsserver import NatsCluster
from shared.replay import replay
from shared.settings import Settings
from shared.shards import META_GREW, META_SHARDS
from shared.streams import ensure_all
from tests import natsfixtures
from tests.syshelpers import loop_ids_per_shard, system, wait_history, write_script

pytestmark = [pytest.mark.anyio, pytest.mark.system]

ANSWERS = ["first answer", "second answer", "third answer"]


def _env(settings: Settings, **extra: str) -> dict[str, str]:
    """This process's environment for a loopwire process of ``settings``' deployment; ``LW_SHARDS``
    blank unless given (the deployment's count is read)."""
    base = service_env(settings.nats_urls, settings.prefix, settings.replicas)
    chosen = str(settings.shards) if settings.shards else ""
    return {**os.environ, **base, "LW_SHARDS": chosen, "COLUMNS": "200", "LW_CONNECT_SECONDS": "10", **extra}


def run(settings: Settings, *argv: str, timeout: float = 60.0, **extra: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "services.cli", *argv]
    return subprocess.run(cmd, env=_env(settings, **extra), capture_output=True, text=True, timeout=timeout)


async def arun(settings: Settings, *argv: str, **extra: str) -> subprocess.CompletedProcess[str]:
    return await anyio.to_thread.run_sync(lambda: run(settings, *argv, **extra))


def _one_line_refusal(done: subprocess.CompletedProcess[str], chosen: int, recorded: int) -> None:
    assert done.returncode != 0, done.stderr[-2000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    lines = [x for x in done.stderr.splitlines() if f"LW_SHARDS={chosen}" in x]
    assert len(lines) == 1 and f"has {recorded} shard" in lines[0], done.stderr[-2000:]


async def _streams(nc: NATS, prefix: str) -> set[str]:
    """The streams of ``prefix`` on the server, every page of the listing (the suite's shared server
    holds many more streams than one page lists)."""
    names: set[str] = set()
    listed = 0
    while page := await nc.jetstream().streams_info(offset=listed):
        listed += len(page)
        names |= {s.config.name or "" for s in page}
    return {n for n in names if prefix.upper() in n.upper()}


async def _metadata(nc: NATS, settings: Settings) -> dict[str, str]:
    info = await nc.jetstream().stream_info(settings.names.history_stream_of(0))
    return dict(info.config.metadata or {})


def _tail_until(settings: Settings, loop_id: str, want: str, timeout: float = 30.0) -> list[str]:
    """``loopwire tail LOOP --json``'s lines until one holds ``want`` (then it is stopped)."""
    cmd = [sys.executable, "-m", "services.cli", "tail", loop_id, "--json", "--no-tokens"]
    proc = subprocess.Popen(cmd, env=_env(settings), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    try:
        assert proc.stdout is not None
        os.set_blocking(proc.stdout.fileno(), False)
        while time.monotonic() < deadline and not any(want in x for x in lines):
            line = proc.stdout.readline()
            if line:
                lines.append(line)
            elif proc.poll() is not None:
                break
            else:
                time.sleep(0.05)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    return lines


async def test_clients_and_services_without_lw_shards_see_every_shard_of_a_three_node_cluster(
    nats_cluster: NatsCluster, tmp_path: Path
) -> None:
    three = Settings.from_env(
        {}, nats_urls=tuple(nats_cluster.urls), prefix=natsfixtures.unique_prefix(), replicas=3, shards=3
    )
    unset = dataclasses.replace(three, shards=0)
    chat = write_script(tmp_path, ANSWERS, "chat.json")
    nc = await connect(three, name="test")
    try:
        await ensure_all(nc.jetstream(timeout=10), three, wait_seconds=60)  # a 3-shard deployment
        ids = loop_ids_per_shard(three.names, 2)
        every = sorted(x for v in ids.values() for x in v)
        with system(unset, tools=()):  # the services are told no count either
            lc = LoopClient(nc, three.names, timeout=30)
            for loop_id in every:
                await lc.start(loop_id, model=chat)
                await lc.input(loop_id, "hello")
            for loop_id in every:
                await wait_history(nc, three, loop_id, lambda h: h.idle and h.turns == 1, timeout=60)

            done = await arun(unset, "streams", "--json")
            assert done.returncode == 0, done.stderr
            assert {json.loads(x)["shard"] for x in done.stdout.splitlines()} == {0, 1, 2}

            done = await arun(unset, "loops", "--json")
            assert done.returncode == 0, done.stderr
            assert sorted(json.loads(x)["loop_id"] for x in done.stdout.splitlines()) == every

            far = ids[2][0]
            done = await arun(unset, "history", far, "--json")
            assert done.returncode == 0, done.stderr
            stored = [seq async for seq, _ in replay(nc, far, settings=three)]
            assert [json.loads(x)["seq"] for x in done.stdout.splitlines()] == stored

            other = ids[1][0]
            started = time.monotonic()
            done = await arun(unset, "send", other, "again", "--wait")
            assert done.returncode == 0, done.stderr
            assert "second answer" in done.stdout and time.monotonic() - started < 30

            lines = await anyio.to_thread.run_sync(lambda: _tail_until(unset, far, "first answer"))
            assert any("first answer" in x for x in lines), lines

            done = await arun(unset, "shards", "--json")
            assert done.returncode == 0, done.stderr
            assert json.loads(done.stdout)["shards"] == 3
    finally:
        await nc.close()


@pytest.mark.parametrize("chosen", [5, 2])
async def test_a_tool_worker_with_another_shard_count_refuses_and_creates_nothing(
    settings: Settings, nc: NATS, chosen: int
) -> None:
    three = dataclasses.replace(settings, shards=3)
    await ensure_all(nc.jetstream(timeout=10), three)
    before = await _streams(nc, settings.prefix)
    done = await arun(settings, "serve", "tool", "calculator", LW_SHARDS=str(chosen))
    _one_line_refusal(done, chosen, 3)
    assert await _streams(nc, settings.prefix) == before  # no stray results buckets


async def test_a_model_step_with_three_shards_refuses_a_one_shard_deployment_and_rewrites_nothing(
    settings: Settings, nc: NATS, tmp_path: Path
) -> None:
    one = dataclasses.replace(settings, shards=1)
    chat = write_script(tmp_path, ANSWERS, "chat.json")
    loop_id = str(uuid.uuid4())
    with system(one, tools=()):
        await LoopClient(nc, one.names).start(loop_id, model=chat)
        await LoopClient(nc, one.names).input(loop_id, "hello")
        await wait_history(nc, one, loop_id, lambda h: h.idle and h.turns == 1)
        before_meta, before = await _metadata(nc, settings), await _streams(nc, settings.prefix)
        env = _env(settings, LW_SHARDS="3")
        done = await anyio.to_thread.run_sync(
            lambda: subprocess.run(
                [sys.executable, *service_command("model-step")], env=env, capture_output=True, text=True, timeout=60
            )
        )
        _one_line_refusal(done, 3, 1)
        assert await _metadata(nc, settings) == before_meta
        assert META_GREW not in before_meta
        assert await _streams(nc, settings.prefix) == before


async def test_shards_grow_refuses_while_services_run_and_grows_once_they_stopped(
    settings: Settings, nc: NATS, tmp_path: Path
) -> None:
    one = dataclasses.replace(settings, shards=1)
    chat = write_script(tmp_path, ANSWERS, "chat.json")
    old = str(uuid.uuid4())
    with system(one, tools=("calculator",)):
        lc = LoopClient(nc, one.names)
        await lc.start(old, model=chat)
        await lc.input(old, "hello")
        await wait_history(nc, one, old, lambda h: h.idle and h.turns == 1)
        done = await arun(settings, "shards", "grow", "3")
        assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr
        assert "still running" in done.stderr and "committer" in done.stderr and "model-step" in done.stderr
        assert (await _metadata(nc, settings)).get(META_SHARDS) == "1"
        assert settings.names.history_stream_of(0) + "_1" not in await _streams(nc, settings.prefix)

    done = await arun(settings, "shards", "grow", "3")
    assert done.returncode == 0, done.stderr
    meta = await _metadata(nc, settings)
    assert meta.get(META_SHARDS) == "3" and meta.get(META_GREW) == "1"
    three = dataclasses.replace(settings, shards=3)
    assert {three.names.history_stream_of(k) for k in (1, 2)} <= await _streams(nc, settings.prefix)

    unset = dataclasses.replace(settings, shards=0)
    with system(unset, tools=("calculator",)):  # started again without LW_SHARDS: they read 3
        lc = LoopClient(nc, three.names)
        await lc.input(old, "again")
        await wait_history(nc, three, old, lambda h: h.idle and h.turns == 2)
        new = [x for v in loop_ids_per_shard(three.names, 1).values() for x in v]
        for loop_id in new:
            await lc.start(loop_id, model=chat)
            await lc.input(loop_id, "hi")
        for loop_id in new:
            await wait_history(nc, three, loop_id, lambda h: h.idle and h.turns == 1)
