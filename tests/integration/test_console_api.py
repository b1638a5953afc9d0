"""``loopwire console`` as a process over HTTP: waiting for the history stream, and SSE resumption by sequence."""

from __future__ import annotations

import json
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import anyio
import httpx
import pytest
from nats.aio.client import Client as NATS

from services.deployment import Deployment, console_command
from shared.client import LoopClient
from shared.natsserver import free_port
from shared.replay import replay
from shared.settings import Settings
from tests import natsfixtures
from tests.integration.committer_fixtures import running_committer

pytestmark = pytest.mark.anyio


TOKEN = "s3cret-console-token"


@contextmanager
def console_process(settings: Settings, token: str) -> Iterator[str]:
    port = free_port()
    # The console refuses a server without a deployment (a thread of its own: a test's event loop may run here).
    with ThreadPoolExecutor(1) as pool:
        pool.submit(anyio.run, natsfixtures.create_deployment, settings).result()
    with tempfile.TemporaryDirectory(prefix="lw-console-") as d:
        console = Deployment.for_settings(settings, Path(d), env={"LW_CONSOLE_TOKEN": token})
        proc = console.start("console", console_command(port), timeout=30)
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            proc.stop(timeout=10)


@pytest.fixture
def console(settings: Settings) -> Iterator[str]:
    with console_process(settings, "") as url:
        yield url


@pytest.fixture
def guarded_console(settings: Settings) -> Iterator[str]:
    with console_process(settings, TOKEN) as url:
        yield url


async def frames(client: httpx.AsyncClient, url: str, headers: dict[str, str]) -> AsyncIterator[tuple[str, str, dict]]:
    """(id, event, data) of each SSE frame with data."""
    async with client.stream("GET", url, headers=headers) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        fid, kind = "", ""
        async for line in r.aiter_lines():
            if line.startswith("id: "):
                fid = line[4:]
            elif line.startswith("event: "):
                kind = line[7:]
            elif line.startswith("data: "):
                yield fid, kind, json.loads(line[6:])
            elif line == "":
                fid, kind = "", ""


async def commits(client: httpx.AsyncClient, url: str, headers: dict[str, str], n: int) -> list[int]:
    got: list[int] = []
    with anyio.fail_after(10):
        async for fid, kind, data in frames(client, url, headers):
            if kind == "commit":
                assert int(fid) == data["seq"]
                got.append(data["seq"])
                if len(got) == n:
                    return got
    raise AssertionError("the stream ended")


async def test_console_streams_resume_by_sequence(console: str, settings: Settings, nc: NATS) -> None:
    async with httpx.AsyncClient(base_url=console, timeout=10) as client, running_committer(settings):
        with anyio.fail_after(10):
            while (await client.get("/api/loops")).status_code != 200:
                await anyio.sleep(0.05)
        api = LoopClient(nc, settings.names)
        loop_id = (await api.start()).loop_id
        for k in range(3):
            await api.input(loop_id, f"input {k}")
        seqs = [seq async for seq, _ in replay(nc, loop_id, names=settings.names)]
        assert len(seqs) == 4
        url = f"/api/loops/{loop_id}/stream"

        # From the start, from ?after= and from Last-Event-ID (which wins): exactly the later records.
        assert await commits(client, url, {}, 4) == seqs
        assert await commits(client, f"{url}?after={seqs[1]}", {}, 2) == seqs[2:]
        assert await commits(client, f"{url}?after={seqs[0]}", {"Last-Event-ID": str(seqs[2])}, 1) == seqs[3:]

        # A record committed while the stream is open arrives once, after the earlier ones.
        async def later() -> None:
            await anyio.sleep(0.3)
            await api.input(loop_id, "later")

        async with anyio.create_task_group() as tg:
            tg.start_soon(later)
            got = await commits(client, url, {"Last-Event-ID": str(seqs[-1])}, 1)
        assert got[0] > seqs[-1]

        r = await client.get(url, headers={"Last-Event-ID": "abc"})
        assert r.status_code == 400 and r.json()["error"]["field"] == "Last-Event-ID"

        listed = (await client.get("/api/loops")).json()
        assert [s["loop_id"] for s in listed["loops"]] == [loop_id] and listed["loops"][0]["state"] == "running"
        events = (await client.get(f"/api/loops/{loop_id}/events?limit=2")).json()
        assert [e["seq"] for e in events["events"]] == [*seqs, got[0]][-2:] and events["more"] is True


async def test_a_page_of_large_records_is_read_whole_and_cut(console: str, settings: Settings, nc: NATS) -> None:
    async with running_committer(settings), httpx.AsyncClient(base_url=console, timeout=30) as client:
        api = LoopClient(nc, settings.names)
        loop_id = (await api.start()).loop_id
        big = 10  # 10 records of 900 kB: more than one Direct Get batch (8 MB) holds
        for k in range(big):
            await api.input(loop_id, f"{k}" + "x" * 900_000)
        with anyio.fail_after(10):
            while (await client.get(f"/api/loops/{loop_id}")).json().get("loop", {}).get("events") != big + 1:
                await anyio.sleep(0.05)
        doc = (await client.get(f"/api/loops/{loop_id}/events")).json()
        seqs = [seq async for seq, _ in replay(nc, loop_id, names=settings.names)]
        assert [e["seq"] for e in doc["events"]] == seqs and doc["more"] is False
        texts = [e["event"]["message"]["blocks"][0]["text"] for e in doc["events"][1:]]
        assert all(e["cut"] for e in doc["events"][1:]) and all(len(t) < 2100 for t in texts)
        assert [t[0] for t in texts] == [str(k) for k in range(big)]
        whole = (await client.get(f"/api/loops/{loop_id}/events/{seqs[1]}")).json()
        assert whole["event"]["message"]["blocks"][0]["text"] == "0" + "x" * 900_000
        other = await api.start()  # a record of another loop is not this loop's
        for seq in (other.seq, seqs[-1] + 10**6, 0, 2**64):
            r = await client.get(f"/api/loops/{loop_id}/events/{seq}")
            assert r.status_code == 404 and r.json()["error"]["kind"] == "not_found"


async def test_without_the_token_an_existing_loop_and_an_unknown_one_look_the_same(
    guarded_console: str, settings: Settings, nc: NATS
) -> None:
    async with running_committer(settings), httpx.AsyncClient(base_url=guarded_console, timeout=10) as client:
        loop_id = (await LoopClient(nc, settings.names).start()).loop_id
        unknown = str(uuid.uuid4())
        authed = {"X-Loopwire-Token": TOKEN}
        with anyio.fail_after(10):  # the console's index has seen the loop
            while (await client.get(f"/api/loops/{loop_id}", headers=authed)).status_code != 200:
                await anyio.sleep(0.05)
        for headers in ({}, {"X-Loopwire-Token": "wrong"}):
            pages = [await client.get(f"/loops/{i}", headers=headers) for i in (loop_id, unknown)]
            assert [p.status_code for p in pages] == [200, 200]
            assert pages[0].text == pages[1].text
            apis = [await client.get(f"/api/loops/{i}", headers=headers) for i in (loop_id, unknown)]
            assert [a.status_code for a in apis] == [401, 401]
            assert apis[0].json() == apis[1].json()
        # With the token the page may say what it found.
        assert (await client.get(f"/loops/{loop_id}", headers=authed)).status_code == 200
        assert (await client.get(f"/loops/{unknown}", headers=authed)).status_code == 404


# Numbers as a client may send them: other scripts' digits (which str.isdigit() takes and int() may
# not), too large for a sequence, negative, and not numbers at all.
BAD_NUMBERS = ["²", "١٢", "99999999999999999999999", "9" * 5000, "-1", "1.5", "1 2", "0x10", "abc"]


async def test_every_malformed_number_is_a_clear_400(console: str, settings: Settings, nc: NATS) -> None:
    async with running_committer(settings), httpx.AsyncClient(base_url=console, timeout=10) as client:
        loop_id = (await LoopClient(nc, settings.names).start()).loop_id
        with anyio.fail_after(10):
            while (await client.get(f"/api/loops/{loop_id}")).status_code != 200:
                await anyio.sleep(0.05)
        post = {"Origin": console}
        for value in BAD_NUMBERS:
            cases = {
                "at": await client.post(f"/api/loops/{loop_id}/fork", json={"at": value}, headers=post),
                "max_iterations": await client.post("/api/loops", json={"max_iterations": value}, headers=post),
                "Last-Event-ID": await client.get(
                    f"/api/loops/{loop_id}/stream", headers={b"Last-Event-ID": value.encode()}
                ),
                "after": await client.get(f"/api/loops/{loop_id}/stream", params={"after": value}),
                "before": await client.get(f"/api/loops/{loop_id}/events", params={"before": value}),
                "page": await client.get("/api/loops", params={"page": value}),
            }
            for field, r in cases.items():
                assert r.status_code == 400, (value, field, r.status_code, r.text[:300])
                error = r.json()["error"]
                assert error["kind"] == "invalid" and error["field"] == field, (value, field, error)


async def test_a_loop_s_verified_mark_is_its_history_checked_against_its_digest_chain(
    console: str, settings: Settings, nc: NATS
) -> None:
    async with running_committer(settings), httpx.AsyncClient(base_url=console, timeout=10) as client:
        api = LoopClient(nc, settings.names)
        loop_id = (await api.start()).loop_id
        await api.input(loop_id, "hello")
        with anyio.fail_after(10):
            while (await client.get(f"/api/loops/{loop_id}")).json().get("loop", {}).get("events") != 2:
                await anyio.sleep(0.05)
        doc = (await client.get(f"/api/loops/{loop_id}/verify")).json()
        assert doc["ok"] and doc["verified"] is True and doc["records"] == doc["chained"] == 2 and not doc["problems"]
        # A record published straight into the stream with a digest that is not its own.
        ack = await nc.jetstream().publish(
            settings.names.hist(loop_id),
            b'{"type":"InputSubmitted"}',
            headers={"Lw-Chain-Index": "3", "Lw-Digest-Prev": "0" * 64, "Lw-Digest": "1" * 64},
        )
        doc = (await client.get(f"/api/loops/{loop_id}/verify")).json()
        assert doc["ok"] and doc["verified"] is False and doc["records"] == 3
        assert [(p["problem"], p["seq"]) for p in doc["problems"]] == [("changed", ack.seq), ("broken", ack.seq)]
        unknown = await client.get(f"/api/loops/{uuid.uuid4()}/verify")
        assert unknown.status_code == 404 and unknown.json()["error"]["kind"] == "not_found"
