"""Following the history through a NATS restart: ``loopwire tail`` (every loop, and one loop) and
:func:`loopwire.follow_all` follow on after the server comes back (same port, same store), with
every record committed before and after it exactly once, in order, and say so in one line; a
server that does not come back ends ``tail`` with one ``error:`` line."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import anyio
import httpx
import pytest

from services.deployment import console_command
from shared.client import LoopClient
from shared.connect import connect
from shared.follow import Follower, Record, follow_all
from shared.natsserver import NatsServer, free_port
from shared.settings import Settings
from tests import natsfixtures
from tests.syshelpers import System, system

LOOPWIRE = str(Path(sys.executable).with_name("loopwire"))
DOWN_SECONDS = 3.0  # longer than a connection's first reconnect attempts
RESUMED = "the NATS connection was lost and is back: following on after seq"


class Lines:
    """A pipe's lines, read by a thread of their own (a test waits for them with a deadline)."""

    def __init__(self, pipe: IO[str]) -> None:
        self.q: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, args=(pipe,), daemon=True).start()

    def _read(self, pipe: IO[str]) -> None:
        for line in pipe:
            self.q.put(line.rstrip("\n"))

    def until(self, pred: object, timeout: float = 60.0) -> list[str]:
        """Lines read so far once one matches ``pred`` (a substring, or a count of lines)."""
        deadline = time.monotonic() + timeout
        while not self._met(pred):
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"not seen within {timeout}s: {pred!r}; got {self.seen}")
            try:
                self.seen.append(self.q.get(timeout=left))
            except queue.Empty:
                continue
        return self.seen

    def _met(self, pred: object) -> bool:
        if isinstance(pred, int):
            return len(self.seen) >= pred
        return any(str(pred) in line for line in self.seen)


@pytest.fixture
def server() -> Iterator[NatsServer]:
    with natsfixtures.own_server() as s:
        yield s


@pytest.fixture
def deployment(server: NatsServer) -> Iterator[System]:
    settings = Settings.from_env({}, nats_urls=(server.url,), prefix=natsfixtures.unique_prefix())
    with system(settings, model_steps=0, tools=()) as s:  # a committer: the records are the inputs
        yield s


async def _commit(settings: Settings, loop_id: str | None, texts: list[str]) -> str:
    """Start a loop (``loop_id`` None) and/or submit inputs; retried while the committer is not back yet."""
    nc = await connect(settings, name="test-inputs")
    try:
        client = LoopClient(nc, settings.names)
        with anyio.fail_after(60):
            while loop_id is None:
                try:
                    loop_id = (await client.start()).loop_id
                except Exception:
                    await anyio.sleep(0.3)
            for text in texts:
                while True:
                    try:
                        await client.input(loop_id, text)
                        break
                    except Exception:
                        await anyio.sleep(0.3)
    finally:
        await nc.close()
    return loop_id


def commit(settings: Settings, loop_id: str | None, *texts: str) -> str:
    return anyio.run(_commit, settings, loop_id, list(texts))


def tail(settings: Settings, *args: str, **env: str) -> subprocess.Popen[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("LW_")}
    full |= {"LW_NATS_URL": settings.nats_urls[0], "LW_PREFIX": settings.prefix, **env}
    return subprocess.Popen(
        [LOOPWIRE, "tail", *args, "--json"], env=full, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def seqs(lines: list[str]) -> list[int]:
    return [r["seq"] for r in map(json.loads, lines) if r["seq"] is not None]


def inputs(lines: list[str]) -> list[str]:
    out = []
    for r in map(json.loads, lines):
        if r["event"]["type"] == "InputSubmitted":
            out.append(r["event"]["message"]["blocks"][0]["text"])
    return out


@pytest.mark.parametrize("one_loop", [False, True], ids=["every-loop", "one-loop"])
def test_tail_follows_on_after_a_nats_restart(server: NatsServer, deployment: System, one_loop: bool) -> None:
    settings = deployment.settings
    loop = commit(settings, None)  # LoopStarted: seq 1 (tail of every loop shows only new records)
    proc = tail(settings, *([loop] if one_loop else []))
    try:
        assert proc.stdout is not None and proc.stderr is not None
        out, err = Lines(proc.stdout), Lines(proc.stderr)
        err.until("following")
        commit(settings, loop, "before 1", "before 2")
        out.until('"before 2"')
        server.stop()
        time.sleep(DOWN_SECONDS)
        server.start()
        commit(settings, loop, "after 1", "after 2")
        out.until('"after 2"')
        err.until(RESUMED)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    assert inputs(out.seen) == ["before 1", "before 2", "after 1", "after 2"]  # none twice, none missing
    assert seqs(out.seen) == ([1] if one_loop else []) + [2, 3, 4, 5], out.seen  # every sequence, once
    assert [line for line in err.seen if RESUMED in line] == [f"{RESUMED} 3"], err.seen
    assert "Traceback" not in "\n".join(err.seen)


def test_tail_ends_in_one_line_when_nats_does_not_come_back(server: NatsServer, deployment: System) -> None:
    settings = deployment.settings
    commit(settings, None)
    proc = tail(settings, LW_CONNECT_SECONDS="2")
    assert proc.stderr is not None
    err = Lines(proc.stderr)
    err.until("following")
    server.stop()
    assert proc.wait(timeout=30) == 1
    lines = [line for line in err.until("error:") if line.strip()]
    assert lines[1:] == [
        f"error: lost the connection to NATS at {server.url}; it did not come back within 2 s (LW_CONNECT_SECONDS)"
    ], lines


@pytest.mark.anyio
async def test_follow_all_follows_on_after_a_nats_restart(server: NatsServer, deployment: System) -> None:
    settings = deployment.settings
    got: list[int] = []
    resumed: list[dict[int, int]] = []

    async def on_record(r: Record) -> None:
        got.append(r.seq)

    async def on_resume(f: Follower) -> None:
        resumed.append(f.positions)

    loop = await _commit(settings, None, ["one"])
    nc = await connect(settings, name="test-follower")
    try:
        async with await follow_all(nc, settings.names, on_record, from_seq=None, on_resume=on_resume):
            await _commit(settings, loop, ["two"])
            with anyio.fail_after(20):
                while len(got) < 1:
                    await anyio.sleep(0.05)
            server.restart()  # from the main thread: the server dies with the thread that started it
            await _commit(settings, loop, ["three", "four"])
            with anyio.fail_after(60):
                while len(got) < 3:
                    await anyio.sleep(0.05)
            await anyio.sleep(0.5)  # nothing more comes (no record twice)
    finally:
        await nc.close()
    assert got == [3, 4, 5] and resumed == [{0: 3}], (got, resumed)


def _page(url: str, seen: list[int], ended: list[str], stop: threading.Event) -> None:
    """What the console's page does: follow a loop's event stream, and after a drop reconnect with
    Last-Event-ID (the last committed sequence it got)."""
    last: str | None = None
    while not stop.is_set():
        headers = {"Accept": "text/event-stream", **({"Last-Event-ID": last} if last else {})}
        try:
            with httpx.stream("GET", url, headers=headers, timeout=httpx.Timeout(5, read=60)) as r:
                event = ""
                for line in r.iter_lines():
                    if stop.is_set():
                        return
                    if line.startswith("id: "):
                        last = line[4:]
                    elif line.startswith("event: "):
                        event = line[7:]
                    elif line.startswith("data: ") and event == "commit":
                        seen.append(json.loads(line[6:])["seq"])
                    elif line.startswith("data: ") and event == "error":
                        ended.append(json.loads(line[6:])["message"])
        except httpx.HTTPError:
            pass
        time.sleep(0.5)


def test_the_console_page_resumes_after_a_nats_restart(server: NatsServer, deployment: System) -> None:
    settings = deployment.settings
    port = free_port()
    deployment.start("console", console_command(port), env={"LW_CONSOLE_TOKEN": ""})
    loop = commit(settings, None, "before")  # seqs 1, 2
    seen: list[int] = []
    ended: list[str] = []
    stop = threading.Event()
    page = threading.Thread(
        target=_page, args=(f"http://127.0.0.1:{port}/api/loops/{loop}/stream", seen, ended, stop), daemon=True
    )
    page.start()
    try:
        deadline = time.monotonic() + 30
        while seen != [1, 2] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert seen == [1, 2]
        server.stop()
        time.sleep(DOWN_SECONDS)
        server.start()
        commit(settings, loop, "after 1", "after 2")
        deadline = time.monotonic() + 8  # well before nats-py's own consumer reset (two missed 5 s heartbeats)
        while len(seen) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        stop.set()
    assert seen == [1, 2, 3, 4], (seen, ended)  # every record once, in order, soon after the restart
    assert ended == ["the console's NATS connection was lost and is back: resuming after the last record"]
    summary = httpx.get(f"http://127.0.0.1:{port}/api/loops", timeout=10).json()["loops"]
    assert [(s["loop_id"], s["last_seq"]) for s in summary] == [(loop, 4)], summary  # the index followed on
