"""Readers of every loop with LW_SHARDS=3: loops in every shard are listed, read and followed by
``follow_all``, ``loopwire loops`` / ``history`` / ``tail`` and the console's index, pages and SSE."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from nats.aio.client import Client as NATS

from shared.client import LoopClient
from shared.connect import connect
from shared.follow import Record, follow_all
from shared.replay import loops, replay
from shared.settings import Settings
from tests import natsfixtures
from tests.integration.committer_fixtures import running_committer
from tests.integration.test_console_api import commits, console_process

pytestmark = pytest.mark.anyio

SHARDS = 3
LOOPWIRE = shutil.which("loopwire", path=str(Path(sys.executable).parent)) or "loopwire"


@pytest.fixture
def sharded(nats_url: str) -> Settings:
    return Settings.from_env({}, nats_urls=(nats_url,), prefix=natsfixtures.unique_prefix(), shards=SHARDS)


@pytest.fixture
async def snc(sharded: Settings) -> AsyncIterator[NATS]:
    conn = await connect(sharded, name="test")
    try:
        yield conn
    finally:
        await conn.close()


def ids_in_every_shard(settings: Settings, per_shard: int = 2) -> list[str]:
    found: dict[int, list[str]] = {k: [] for k in settings.names.shard_ids}
    while any(len(v) < per_shard for v in found.values()):
        loop_id = str(uuid.uuid4())
        k = settings.names.shard_of(loop_id)
        if len(found[k]) < per_shard:
            found[k].append(loop_id)
    return sorted(x for v in found.values() for x in v)


async def start_loops(nc: NATS, settings: Settings) -> dict[str, list[int]]:
    """Loops in every shard, each with a start and two inputs: their record sequences."""
    api = LoopClient(nc, settings.names)
    for loop_id in ids_in_every_shard(settings):
        await api.start(loop_id)
        for k in range(2):
            await api.input(loop_id, f"input {k} of {loop_id}")
    return {
        loop_id: [seq async for seq, _ in replay(nc, loop_id, names=settings.names)]
        for loop_id in await loops(nc, settings.names)
    }


def cli_env(settings: Settings) -> dict[str, str]:
    return {
        **os.environ,
        "LW_NATS_URL": settings.nats_urls[0],
        "LW_PREFIX": settings.prefix,
        "LW_SHARDS": str(settings.shards),
        "COLUMNS": "200",
        "PYTHONUNBUFFERED": "1",
    }


def cli(settings: Settings, *args: str) -> list[dict[str, Any]]:
    done = subprocess.run(
        [LOOPWIRE, *args, "--json"], env=cli_env(settings), capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def popen(settings: Settings, *args: str) -> subprocess.Popen[str]:
    env = cli_env(settings)
    pipe = subprocess.PIPE
    return subprocess.Popen([LOOPWIRE, *args], env=env, stdout=pipe, stderr=pipe, text=True, start_new_session=True)


@pytest.fixture
def console_of(sharded: Settings) -> Iterator[str]:
    with console_process(sharded, "") as url:
        yield url


async def test_follow_all_catches_up_on_every_shard_then_follows(sharded: Settings, snc: NATS) -> None:
    async with running_committer(sharded):
        seqs = await start_loops(snc, sharded)
        assert {sharded.names.shard_of(x) for x in seqs} == set(range(SHARDS))
        got: dict[str, list[int]] = {}

        async def on_record(r: Record) -> None:
            assert r.shard == sharded.names.shard_of(r.loop_id) and r.event().loop_id == r.loop_id
            got.setdefault(r.loop_id, []).append(r.seq)

        async with await follow_all(snc, sharded.names, on_record) as f:
            with anyio.fail_after(10):
                await f.caught_up.wait()
            assert got == seqs  # every record stored before, once, in order per loop
            loop_id = next(iter(seqs))
            seq = (await LoopClient(snc, sharded.names).input(loop_id, "later")).seq
            with anyio.fail_after(10):
                while got[loop_id][-1] != seq:
                    await anyio.sleep(0.02)

        new: list[Record] = []

        async def on_new(r: Record) -> None:
            new.append(r)

        async with await follow_all(snc, sharded.names, on_new, from_seq=None) as f:
            assert f.caught_up.is_set()  # nothing stored before counts
            await anyio.sleep(0.2)
            assert new == []


async def test_cli_lists_reads_and_tails_loops_of_every_shard(sharded: Settings, snc: NATS) -> None:
    async with running_committer(sharded):
        seqs = await start_loops(snc, sharded)
        listed = await anyio.to_thread.run_sync(cli, sharded, "loops")
        assert sorted(r["loop_id"] for r in listed) == sorted(seqs)
        for loop_id, want in seqs.items():
            records = await anyio.to_thread.run_sync(cli, sharded, "history", loop_id[:8])
            assert [r["seq"] for r in records] == want

        tail = popen(sharded, "tail", "--from", "1", "--json", "--no-tokens")
        try:
            assert tail.stdout is not None
            seen: dict[str, list[int]] = {}
            with anyio.fail_after(30):
                while seen != seqs:
                    line = await anyio.to_thread.run_sync(tail.stdout.readline)
                    assert line, "tail ended"
                    r = json.loads(line)
                    seen.setdefault(r["event"]["loop_id"], []).append(r["seq"])
        finally:
            tail.send_signal(signal.SIGINT)
            _, err = await anyio.to_thread.run_sync(lambda: tail.communicate(timeout=10))
        assert tail.returncode == 0, err


async def test_console_lists_and_reads_loops_of_every_shard(sharded: Settings, snc: NATS, console_of: str) -> None:
    async with running_committer(sharded), httpx.AsyncClient(base_url=console_of, timeout=10) as client:
        seqs = await start_loops(snc, sharded)
        with anyio.fail_after(10):
            while True:
                r = await client.get("/api/loops")
                if r.status_code == 200 and r.json()["total"] == len(seqs):
                    break
                await anyio.sleep(0.05)
        assert sorted(s["loop_id"] for s in r.json()["loops"]) == sorted(seqs)
        for loop_id, want in seqs.items():
            events = (await client.get(f"/api/loops/{loop_id}/events")).json()
            assert [e["seq"] for e in events["events"]] == want
            assert all(e["event"]["loop_id"] == loop_id for e in events["events"])
            one = (await client.get(f"/api/loops/{loop_id}/events/{want[-1]}")).json()
            assert one["ok"] and one["event"]["loop_id"] == loop_id
            assert await commits(client, f"/api/loops/{loop_id}/stream", {}, len(want)) == want
