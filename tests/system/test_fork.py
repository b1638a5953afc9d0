"""Forks: branch a loop from any committed point, with a per-tool re-execution policy.

Every service is its own process on one nats-server (committer, model-step, the ledger tool worker,
which appends each execution it starts to a file). Checked from the stored records and the ledger.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Literal

import anyio
import httpx
import pytest
from nats.aio.client import Client as NATS

from services.deployment import Deployment, console_command
from shared import events as ev
from shared import shaping
from shared.client import CommitClient, LoopClient
from shared.connect import connect
from shared.content import AIMessage, TextBlock, ToolResultMessage, UserMessage, text_of
from shared.events import ForkChanges
from shared.forking import ForkSpec, build_fork, content_of, valid_points
from shared.history import LoopHistory, fold
from shared.natsserver import NatsServer, free_port
from shared.protocol import ConflictError, InvalidRequestError, NotFoundError, UnavailableError
from shared.settings import Settings
from shared.streamreads import get_msg
from shared.wiretypes import Reexecution
from tests import natsfixtures
from tests.syshelpers import check_every_record_chained, check_history_invariants, history, wait_history
from tests.system import reports
from tests.system.faultscript import write_model
from tests.system.fleet import fleet

pytestmark = [pytest.mark.anyio, pytest.mark.system, pytest.mark.timeout(240)]


def _call(tool: str, note: str) -> list[dict[str, Any]]:
    return [
        {"kind": "tool_use", "index": 0, "id": "c_{k}", "name": tool},
        {"kind": "tool_use", "index": 0, "text": json.dumps({"note": note, "hold": 0.01})},
        {"kind": "finish", "finish_reason": "tool_use"},
    ]


def five_steps(tool: str) -> dict[str, Any]:
    """Turn 1: two tool steps and an answer; turn 2: one tool step and an answer (5 steps)."""
    return {
        "responses": [_call(tool, "a"), _call(tool, "b"), "turn one done", _call(tool, "c"), "turn two done"],
        "repeat_last": True,
        "by_first_user_text": {"edited": ["EDITED ANSWER"]},
    }


def finished(h: LoopHistory) -> bool:
    return h.open_turn is None and not h.pending_inputs and h.idle and not h.forming


async def stored_bytes(nc: NATS, settings: Settings, loop_id: str) -> list[bytes]:
    out = []
    for seq, _ in await history(nc, settings, loop_id):
        m = await get_msg(nc, settings.names.history_stream, seq=seq)
        assert m is not None
        out.append(m.data)
    return out


def ledger_runs(path: Path, tool: str) -> int:
    return sum(1 for line in path.read_text().splitlines() if line.strip() and json.loads(line)["tool"] == tool)


@pytest.fixture
async def env(nats_server: NatsServer, tmp_path: Path) -> AsyncIterator[tuple[NATS, Settings, LoopClient, Path]]:
    async with ledger_stack((nats_server.url,), tmp_path, {}) as stack:
        yield stack


@asynccontextmanager
async def ledger_stack(
    urls: tuple[str, ...], tmp_path: Path, environ: dict[str, str]
) -> AsyncIterator[tuple[NATS, Settings, LoopClient, Path]]:
    """A committer, a model-step and the ledger tool connected to the servers at ``urls`` (settings
    from ``environ``): the connection, the settings, a loop client and the ledger file."""
    settings = Settings.from_env(environ, nats_urls=urls, prefix=natsfixtures.unique_prefix())
    # Created first: services started at once on a cluster could look for a bucket not created yet.
    await natsfixtures.create_deployment(settings)
    ledger = tmp_path / "ledger.jsonl"
    ledger.touch()
    counts = {"committer": 1, "tools-ledger": 1, "model-step": 1}
    with fleet(settings, counts=counts, env={"LW_LEDGER": str(ledger)}, log_dir=tmp_path / "logs"):
        nc = await connect(settings)
        try:
            yield nc, settings, LoopClient(nc, settings.names, timeout=15), ledger
        finally:
            await nc.close()


async def two_turn_loop(nc: NATS, settings: Settings, api: LoopClient, model: str) -> str:
    loop_id = (await api.start(model=model)).loop_id
    await api.input(loop_id, "one")
    await wait_history(nc, settings, loop_id, lambda h: finished(h) and h.turns == 1, timeout=60)
    await api.input(loop_id, "two")
    await wait_history(nc, settings, loop_id, lambda h: finished(h) and h.turns == 2, timeout=60)
    return loop_id


async def test_fork_at_every_valid_point(env: tuple[NATS, Settings, LoopClient, Path], tmp_path: Path) -> None:
    nc, settings, api, ledger = env
    source = await two_turn_loop(nc, settings, api, write_model(tmp_path, five_steps("ledger_idem"), "m.json"))
    records = await history(nc, settings, source)
    assert sum(isinstance(e, ev.StepDone) for _, e in records) == 5
    before = await stored_bytes(nc, settings, source)
    points = valid_points(records)
    kinds = [type(e).__name__ for s, e in records if s in points]
    assert kinds == ["InputSubmitted", "StepDone", "StepDone", "TurnDone", "InputSubmitted", "StepDone", "TurnDone"]
    runs = ledger_runs(ledger, "ledger_idem")
    assert runs == 3
    forks = {at: (await api.fork(source, at=at)).loop_id for at in points}
    for at, fork in forks.items():
        h = await wait_history(nc, settings, fork, finished, timeout=60)
        got = await history(nc, settings, fork)
        check_history_invariants(got)
        assert isinstance(got[0][1], ev.LoopForked) and got[0][1].source_seq == at
        copied = [content_of(e) for _, e in got[1 : 1 + got[0][1].records]]
        assert copied == [content_of(e) for s, e in records if s <= at], at
        # Every branch finishes the turn it was forked in (the model is scripted by position).
        turns = sum(isinstance(e, ev.InputSubmitted) for s, e in records if s <= at)
        assert h.turns == turns, at
        assert text_of(h.messages[-1]) == ("turn one done", "turn two done")[turns - 1], at
        assert sum(isinstance(m, AIMessage) for m in h.messages) == (3, 5)[turns - 1], at
        # A continued turn derives its step ids from its own turn id, like any turn.
        index: dict[str, int] = {}
        for _, e in got:
            if isinstance(e, ev.StepDone):
                assert e.step_id == ev.step_id_for(e.turn_id, index.get(e.turn_id, 0)), at
                index[e.turn_id] = index.get(e.turn_id, 0) + 1
    assert await stored_bytes(nc, settings, source) == before
    # ledger_idem is idempotent: each repeated call took the source's result (reuse): nothing ran.
    assert ledger_runs(ledger, "ledger_idem") == runs
    # Every branch's chain continues its source's at the fork point (tool steps, turns, forks).
    await check_every_record_chained(nc, settings, loops=1 + len(forks))


@pytest.mark.parametrize(
    ("policy", "runs"), [("reuse", 0), ("rerun", 1), ("ask", 1), ("ask", 0)], ids=["reuse", "rerun", "ask", "ask-deny"]
)
async def test_reexecution_policy(
    policy: Reexecution, runs: int, env: tuple[NATS, Settings, LoopClient, Path], tmp_path: Path
) -> None:
    nc, settings, api, ledger = env
    model = write_model(tmp_path, {"responses": [_call("ledger", "x"), "done"], "repeat_last": True}, "m.json")
    source = (await api.start(model=model)).loop_id
    await api.input(source, "go")
    await wait_history(nc, settings, source, finished, timeout=60)
    assert ledger_runs(ledger, "ledger") == 1
    at = next(s for s, e in await history(nc, settings, source) if isinstance(e, ev.InputSubmitted))
    fork = (await api.fork(source, at=at, reexecution={"ledger": policy} if policy != "ask" else None)).loop_id
    if policy == "ask":  # ledger is unannotated: the default is ask
        h = await wait_history(nc, settings, fork, lambda h: bool(h.open_gates), timeout=60)
        gate = h.open_gates[0].gate
        assert gate.reason == "fork_rerun" and gate.tool_name == "ledger"
        assert ledger_runs(ledger, "ledger") == 1
        # approve runs it again; deny takes the source's result
        await api.answer(fork, gate.id, "approve" if runs else "deny")
    h = await wait_history(nc, settings, fork, finished, timeout=60)
    assert ledger_runs(ledger, "ledger") == 1 + runs
    results = [text_of(m) for m in h.messages if isinstance(m, ToolResultMessage)]
    assert results == ["recorded x"], results


async def test_input_edit_and_errors(env: tuple[NATS, Settings, LoopClient, Path], tmp_path: Path) -> None:
    nc, settings, api, _ = env
    model = write_model(tmp_path, five_steps("ledger_idem"), "m.json")
    source = (await api.start(model=model)).loop_id
    await api.input(source, "one")
    h = await wait_history(nc, settings, source, lambda h: finished(h) and h.turns == 1, timeout=60)
    records = await history(nc, settings, source)
    inp = next(s for s, e in records if isinstance(e, ev.InputSubmitted))
    started = next(s for s, e in records if isinstance(e, ev.TurnStarted))

    # --input replaces the input the point ends with: the model sees the edit, never the old text.
    edited = (await api.fork(source, at=inp, input="edited")).loop_id
    eh = await wait_history(nc, settings, edited, finished, timeout=60)
    users = [text_of(m) for m in eh.messages if isinstance(m, UserMessage)]
    assert users == ["edited"] and text_of(eh.messages[-1]) == "EDITED ANSWER", eh.messages

    # Invalid points name the nearest valid ones; unknown loops; nothing is written for either.
    bad = "00000000-0000-4000-8000-000000000001"
    with pytest.raises(InvalidRequestError, match=f"nearest valid: {inp}"):
        await api.fork(source, at=started, loop_id=bad)
    with pytest.raises(NotFoundError):
        await api.fork("00000000-0000-4000-8000-000000000002", loop_id=bad)
    assert await history(nc, settings, bad) == []

    # A repeated fork command answers the same sequence; another command on that loop id conflicts.
    cid = "00000000-0000-4000-8000-000000000003"
    first = await api.fork(source, command_id=cid)
    again = await api.fork(source, command_id=cid, loop_id=first.loop_id)
    assert again.seq == first.seq
    with pytest.raises(ConflictError):
        await api.fork(source, loop_id=first.loop_id)

    # A fork of a fork of a fork; then 20 concurrent forks of one loop: all whole, all different.
    chain = source
    for _ in range(3):
        chain = (await api.fork(chain)).loop_id
        await wait_history(nc, settings, chain, finished, timeout=60)
    ch = await history(nc, settings, chain)
    assert [content_of(e) for _, e in ch[1:]][: len(records) - 1] == [content_of(e) for _, e in records[:-1]]
    made: list[str] = []

    async def one() -> None:
        made.append((await api.fork(source)).loop_id)

    async with anyio.create_task_group() as tg:
        for _ in range(20):
            tg.start_soon(one)
    assert len(set(made)) == 20
    for f in made:
        fh = await wait_history(nc, settings, f, lambda h: not h.forming, timeout=30)
        assert fh.forked is not None and fh.forked.source_loop_id == source and fh.turns == h.turns

    # A closed loop forks into an open one.
    await api.close(source)
    reopened = (await api.fork(source)).loop_id
    await api.input(reopened, "more")
    rh = await wait_history(nc, settings, reopened, lambda h: finished(h) and h.turns == 2, timeout=60)
    assert not rh.closed


async def test_partial_fork_is_invisible_until_repeated(
    env: tuple[NATS, Settings, LoopClient, Path], tmp_path: Path
) -> None:
    """A committer that died between a fork's batches leaves a forming loop nothing drives or commands;
    repeating the fork command writes the rest and the loop is whole."""
    nc, settings, api, _ = env
    source = await two_turn_loop(nc, settings, api, write_model(tmp_path, five_steps("ledger_idem"), "m.json"))
    records = await history(nc, settings, source)
    fork_id, cid = "00000000-0000-4000-8000-0000000000f1", "00000000-0000-4000-8000-0000000000c1"
    at = valid_points(records)[-1]
    spec = ForkSpec(fork_id, source, at, cid, ev.now_rfc3339(), ForkChanges(input="three"), {})
    from services.committer.api import _derived_id

    events = build_fork(spec, records, _derived_id(fork_id, "fork", cid, 0))
    await CommitClient(nc, settings.names).commit(fork_id, 0, events[:4])  # the first batch only
    with pytest.raises(NotFoundError, match="still being forked"):
        await api.input(fork_id, "hello")
    await anyio.sleep(1.0)
    assert len(await history(nc, settings, fork_id)) == 4  # nothing drove it
    res = await api.fork(source, at=at, input="three", loop_id=fork_id, command_id=cid)
    h = await wait_history(nc, settings, fork_id, lambda h: finished(h) and h.turns == 3, timeout=60)
    assert res.seq == h.formed_seq and h.forked is not None
    check_history_invariants(await history(nc, settings, fork_id))


def cli(settings: Settings, *argv: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "services.cli", *argv, "--nats-url", settings.nats_urls[0], "--prefix", settings.prefix],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


async def acli(settings: Settings, *argv: str) -> str:
    return await anyio.to_thread.run_sync(lambda: cli(settings, *argv))


async def test_cli_fork_lineage_diff(env: tuple[NATS, Settings, LoopClient, Path], tmp_path: Path) -> None:
    nc, settings, api, _ = env
    model = write_model(tmp_path, five_steps("ledger_idem"), "m.json")
    source = (await api.start(model=model)).loop_id
    await api.input(source, "one")
    await wait_history(nc, settings, source, finished, timeout=60)
    inp = next(s for s, e in await history(nc, settings, source) if isinstance(e, ev.InputSubmitted))
    child = (await acli(settings, "fork", source, "--at", str(inp), "--input", "edited")).strip()
    await wait_history(nc, settings, child, finished, timeout=60)
    grandchild = (await acli(settings, "fork", child)).strip()
    await wait_history(nc, settings, grandchild, lambda h: not h.forming, timeout=30)

    tree = await acli(settings, "lineage", grandchild)
    lines = tree.splitlines()
    assert lines[0].startswith(source) and child in lines[1] and f"forked at seq {inp}" in lines[1], tree
    assert grandchild in lines[2] and lines[2].startswith("    └─ ") and lines[2].endswith("◀"), tree

    diff = json.loads(await acli(settings, "diff", source, child, "--json"))
    assert diff["common"] == 1  # LoopStarted; then the inputs differ
    assert diff["only_a"][0]["type"] == "InputSubmitted" and diff["only_b"][0]["type"] == "InputSubmitted"
    text = await acli(settings, "diff", source, child)
    assert "common prefix: 1 records" in text and "EDITED ANSWER" in text and "turn one done" in text, text
    same = await acli(settings, "diff", child, grandchild)
    assert "the branches are equal" in same, same
    # A loop's words are printed as they are, never read as markup ("[/b]" once ended the command).
    odd = (await acli(settings, "fork", source, "--at", str(inp), "--input", "[/b]x[dm]")).strip()
    await wait_history(nc, settings, odd, finished, timeout=60)
    assert "user: [/b]x[dm]" in await acli(settings, "diff", source, odd)

    rows = [json.loads(line) for line in (await acli(settings, "loops", "--json")).splitlines()]
    parent = {r["loop_id"]: r["parent"] for r in rows}
    assert parent == {source: None, child: source, grandchild: child, odd: source}


async def test_console_forks_from_a_point_and_shows_lineage(
    env: tuple[NATS, Settings, LoopClient, Path], tmp_path: Path
) -> None:
    nc, settings, api, _ = env
    model = write_model(tmp_path, five_steps("ledger_idem"), "m.json")
    source = (await api.start(model=model)).loop_id
    await api.input(source, "one")
    await wait_history(nc, settings, source, finished, timeout=60)
    records = await history(nc, settings, source)
    inp = next(s for s, e in records if isinstance(e, ev.InputSubmitted))
    port = free_port()
    console = Deployment.for_settings(settings, tmp_path, env={"LW_CONSOLE_TOKEN": ""})
    proc = console.process("console", console_command(port), log_name="console.log")
    await anyio.to_thread.run_sync(lambda: proc.start(timeout=30))
    base = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient(base_url=base, timeout=15, headers={"origin": base}) as client:
            with anyio.fail_after(20):
                while (await client.get(f"/api/loops/{source}")).status_code != 200:
                    await anyio.sleep(0.1)
            doc = (await client.get(f"/api/loops/{source}/lineage")).json()
            assert doc["points"] == valid_points(records) and doc["parent"] is None
            cid = "00000000-0000-4000-8000-0000000000c7"
            bad = (await client.post(f"/api/loops/{source}/fork", json={"command_id": cid, "at": "1"})).json()
            assert not bad["ok"] and "nearest valid" in bad["error"]["message"]
            body = {"command_id": cid, "at": str(inp), "input": "edited"}
            made = (await client.post(f"/api/loops/{source}/fork", json=body)).json()
            again = (await client.post(f"/api/loops/{source}/fork", json=body)).json()
            assert made["ok"] and again["loop_id"] == made["loop_id"], (made, again)
            child = made["loop_id"]
            h = await wait_history(nc, settings, child, finished, timeout=60)
            assert text_of(h.messages[-1]) == "EDITED ANSWER"
            with anyio.fail_after(20):
                while not (doc := (await client.get(f"/api/loops/{source}/lineage")).json())["children"]:
                    await anyio.sleep(0.1)
            assert [(c["loop_id"], c["at"]) for c in doc["children"]] == [(child, inp)]
            up = (await client.get(f"/api/loops/{child}/lineage")).json()
            assert up["parent"] == source and up["forked_at"] == inp
            page = await client.get(f"/loops/{child}")
            assert page.status_code == 200 and 'id="lineage"' in page.text
    finally:
        await anyio.to_thread.run_sync(lambda: proc.stop(timeout=10))


async def test_a_committer_killed_mid_fork_leaves_no_loop_or_a_whole_one(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    """A fork of 3,000 records takes several batches; SIGKILL the committer as soon as the first lands."""
    settings = Settings.from_env({}, nats_urls=(nats_server.url,), prefix=natsfixtures.unique_prefix())
    with fleet(settings, counts={"committer": 1}, log_dir=tmp_path / "logs") as f:
        nc = await connect(settings)
        try:
            api = LoopClient(nc, settings.names, timeout=5)
            source = (await api.start(model="demo")).loop_id
            commits = CommitClient(nc, settings.names)
            last = (await history(nc, settings, source))[-1][0]
            text = "x" * 4000
            for _ in range(30):  # inputs written directly (no work signal: nothing drives the source)
                batch = [
                    ev.make(
                        ev.InputSubmitted,
                        loop_id=source,
                        message=UserMessage(blocks=[TextBlock(text=text)]),
                        cause=ev.Cause(command_id=ev.new_id()),
                    )
                    for _ in range(100)
                ]
                last = (await commits.commit(source, last, batch)).last_seq
            records = await history(nc, settings, source)
            before = await stored_bytes(nc, settings, source)
            fork_id, cid = ev.new_id(), ev.new_id()
            seen: list[int] = []

            async def watch_and_kill() -> None:
                with anyio.fail_after(20):
                    while (
                        await get_msg(nc, settings.names.history_stream, last_by_subj=settings.names.hist(fork_id))
                        is None
                    ):
                        await anyio.sleep(0.001)
                f.live("committer")[0].kill()
                seen.append(len(await history(nc, settings, fork_id)))

            async def fork() -> None:
                with contextlib.suppress(UnavailableError):
                    await api.fork(source, loop_id=fork_id, command_id=cid)

            async with anyio.create_task_group() as tg:
                tg.start_soon(watch_and_kill)
                tg.start_soon(fork)
            stored = await history(nc, settings, fork_id)
            h = fold(stored)
            whole = len(records) + 1  # LoopForked + LoopStarted + the 3,000 inputs
            assert len(stored) in range(1, whole + 1) and (h.forming == (len(stored) < whole)), len(stored)
            await f.spawn("committer")
            if h.forming:
                with pytest.raises(NotFoundError, match="still being forked"):
                    await api.input(fork_id, "hello")
            res = await api.fork(source, loop_id=fork_id, command_id=cid)
            got = await history(nc, settings, fork_id)
            h = fold(got)
            assert len(got) == whole and not h.forming and res.seq == got[-1][0] and len(h.pending_inputs) == 3000
            check_history_invariants(got)
            assert [content_of(e) for _, e in got[1:]] == [content_of(e) for _, e in records]
            assert await stored_bytes(nc, settings, source) == before
            reports.add_figure("fork killed mid-way", {"records stored at the kill": seen[0], "whole": whole})
        finally:
            await nc.close()


async def test_fork_at_a_point_with_an_open_gate(env: tuple[NATS, Settings, LoopClient, Path], tmp_path: Path) -> None:
    """An input sent while a gate waits is a fork point: the fork has its own copy of the gate to answer."""
    nc, settings, api, ledger = env
    model = write_model(tmp_path, {"responses": [_call("ledger", "x"), "done"], "repeat_last": True}, "m.json")
    source = (await api.start(model=model, policy={"ledger": "ask"})).loop_id
    await api.input(source, "one")
    h = await wait_history(nc, settings, source, lambda h: bool(h.open_gates), timeout=60)
    source_gate = h.open_gates[0].gate.id
    at = (await api.input(source, "two")).seq
    fork = (await api.fork(source, at=at)).loop_id
    fh = await wait_history(nc, settings, fork, lambda h: not h.forming and bool(h.open_gates), timeout=30)
    gate = fh.open_gates[0]
    assert gate.gate.id != source_gate and gate.gate.tool_name == "ledger" and len(fh.pending_inputs) == 1
    with pytest.raises(NotFoundError):
        await api.answer(fork, source_gate, "approve")  # the source's gate id means nothing in the fork
    await api.answer(fork, gate.gate.id, "approve")
    # (the input waiting at the point folds into the running turn after its tool step, as in any loop)
    fh = await wait_history(nc, settings, fork, finished, timeout=60)
    assert ledger_runs(ledger, "ledger") == 1 and fh.turns == 1
    assert [text_of(m) for m in fh.messages if isinstance(m, UserMessage)] == ["one", "two"]
    check_history_invariants(await history(nc, settings, fork))
    sh = await wait_history(nc, settings, source, lambda h: bool(h.open_gates), timeout=5)
    assert sh.open_gates[0].gate.id == source_gate and sh.turns == 1  # the source still waits
    await check_every_record_chained(nc, settings, loops=2)  # gates opened, answered, copied


def held_call(tool: str, hold: float) -> list[dict[str, Any]]:
    return [
        {"kind": "tool_use", "index": 0, "id": "c_{k}", "name": tool},
        {"kind": "tool_use", "index": 0, "text": json.dumps({"note": "x", "hold": hold})},
        {"kind": "finish", "finish_reason": "tool_use"},
    ]


def results_of(h: LoopHistory) -> list[str]:
    return [text_of(m) for m in h.messages if isinstance(m, ToolResultMessage)]


@pytest.mark.parametrize("answer", ["deny", "approve"])
async def test_a_fork_never_runs_again_unasked_a_call_its_source_is_running(
    answer: Literal["deny", "approve"], env: tuple[NATS, Settings, LoopClient, Path], tmp_path: Path
) -> None:
    """A destructive call runs at most once across a loop and its fork, unless an operator approves."""
    nc, settings, api, ledger = env
    tool = "ledger_destructive"
    model = write_model(tmp_path, {"responses": [held_call(tool, 5.0), "done"], "repeat_last": True}, "m.json")
    source = (await api.start(model=model)).loop_id
    await api.input(source, "go")
    with anyio.fail_after(30):  # the source's call has started on its worker and holds for 5 s
        while ledger_runs(ledger, tool) < 1:
            await anyio.sleep(0.05)
    await anyio.sleep(1)
    fork = (await api.fork(source)).loop_id  # from the input: the source's step is not committed yet
    # The fork meets the same call while the source runs it: it asks at once (a destructive tool
    # may not run twice; the fork knows only what it copied of its source), never runs it on its own.
    h = await wait_history(nc, settings, fork, lambda h: bool(h.open_gates), timeout=60)
    gate = h.open_gates[0].gate
    assert gate.reason == "fork_rerun" and gate.tool_name == tool
    src = await wait_history(nc, settings, source, finished, timeout=60)
    assert results_of(src) == ["recorded x"]
    assert ledger_runs(ledger, tool) == 1
    await api.answer(fork, gate.id, answer)
    h = await wait_history(nc, settings, fork, finished, timeout=60)
    assert ledger_runs(ledger, tool) == (2 if answer == "approve" else 1)
    # Denied: the fork copied no result of the call (it was in flight), so none is taken.
    assert results_of(h) == ["recorded x" if answer == "approve" else shaping.fork_no_source_result(tool)]
    check_history_invariants(await history(nc, settings, fork))


@pytest.mark.parametrize(("reexecution", "runs"), [("reuse", 1), ("ask", 2)])
async def test_approving_a_gate_a_fork_copied_open_after_its_source_ran_the_call(
    reexecution: Reexecution, runs: int, env: tuple[NATS, Settings, LoopClient, Path], tmp_path: Path
) -> None:
    """Approved in the fork, the call is still one the source ran after the point: the fork's
    re-execution rule decides — reuse takes the source's result; ask asks again before a second run."""
    nc, settings, api, ledger = env
    tool = "ledger_destructive"
    model = write_model(tmp_path, {"responses": [held_call(tool, 0.01), "done"], "repeat_last": True}, "m.json")
    source = (await api.start(model=model, policy={tool: "ask"})).loop_id
    await api.input(source, "one")
    h = await wait_history(nc, settings, source, lambda h: bool(h.open_gates), timeout=60)
    at = (await api.input(source, "two")).seq  # a point where the gate is open
    await api.answer(source, h.open_gates[0].gate.id, "approve")
    await wait_history(nc, settings, source, lambda h: finished(h) and h.turns >= 1, timeout=60)
    assert ledger_runs(ledger, tool) == 1
    fork = (await api.fork(source, at=at, reexecution={tool: reexecution})).loop_id
    fh = await wait_history(nc, settings, fork, lambda h: not h.forming and bool(h.open_gates), timeout=30)
    await api.answer(fork, fh.open_gates[0].gate.id, "approve")
    if reexecution == "ask":
        fh = await wait_history(
            nc, settings, fork, lambda h: any(g.gate.reason == "fork_rerun" for g in h.open_gates), timeout=60
        )
        assert ledger_runs(ledger, tool) == 1
        await api.answer(fork, fh.open_gates[0].gate.id, "approve")
    fh = await wait_history(nc, settings, fork, finished, timeout=60)
    assert ledger_runs(ledger, tool) == runs
    assert results_of(fh)[0] == "recorded x"
    check_history_invariants(await history(nc, settings, fork))
