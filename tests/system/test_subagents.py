"""Sub-agents: an agent tool whose calls run child loops; every service its own OS process.

The parent's and the child's conversations come from one script (chosen by their first user text):
the parent calls the agent tool ``researcher``; the child calls tools and answers. Everything is
checked from stored records: the child's history, the parent's StepDone and the tool result store.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import anyio
import httpx
import msgspec
import pytest
from nats.aio.client import Client as NATS

from services.tools.agent import child_loop_id
from shared import events as ev
from shared.client import LoopClient
from shared.content import ToolResultMessage, text_of
from shared.forking import descendants, origins
from shared.history import LoopHistory
from shared.natsserver import free_port
from shared.protocol import InvalidRequestError
from shared.replay import loops
from shared.results import DONE, ResultStore
from shared.settings import Settings
from tests.syshelpers import (
    System,
    check_history_invariants,
    collect_live,
    history,
    system,
    wait_for,
    wait_history,
    write_script,
)

pytestmark = [pytest.mark.anyio, pytest.mark.system, pytest.mark.timeout(180)]

PARENT_INPUT = "delegate the sum"
TASK = "compute 6*7 with the tools"
CHILD_ANSWER = "The child says: 42."


def _call(k: int, name: str, args: dict[str, object]) -> list[dict[str, object]]:
    return [
        {"kind": "tool_use", "index": 0, "id": f"call_{k}", "name": name},
        {"kind": "tool_use", "index": 0, "text": json.dumps(args)},
        {"kind": "finish", "finish_reason": "tool_use"},
    ]


def _script(tmp: Path, child_steps: list[object]) -> str:
    return write_script(
        tmp,
        {
            "responses": [],
            "by_first_user_text": {
                PARENT_INPUT: [_call(0, "researcher", {"task": TASK}), "Parent is done."],
                TASK: [*child_steps, CHILD_ANSWER],
            },
        },
    )


def _agent(s: System, model: str, tmp: Path, *extra: str) -> None:
    instructions = tmp / "instructions.txt"
    instructions.write_text("You research things.")
    s.start(
        "agent",
        [
            "-m",
            "services.cli",
            "serve",
            "agent",
            "researcher",
            "--model",
            model,
            "--tools",
            "calculator,sleep",
            "--instructions",
            str(instructions),
            *extra,
        ],
    )


async def _run_parent(nc: NATS, settings: Settings, model: str) -> tuple[LoopClient, str, list[ev.Event]]:
    """A new parent loop on ``model``, its input sent; its client, id and live events from the start."""
    lc = LoopClient(nc, settings.names)
    parent = str(uuid.uuid4())
    live = await collect_live(nc, settings, parent)
    await lc.start(parent, model=model)
    await lc.input(parent, PARENT_INPUT)
    return lc, parent, live


async def _parent_call(nc: NATS, settings: Settings, parent: str) -> tuple[str, ToolResultMessage]:
    """The parent's committed agent call: its execution id and its result."""
    for _, e in await history(nc, settings, parent):
        if isinstance(e, ev.StepDone) and len(e.messages) > 1:
            result = e.messages[1]
            assert isinstance(result, ToolResultMessage)
            return ev.execution_id_for(e.step_id, result.tool_use_id), result
    raise AssertionError("the parent has no tool step")


async def _children(nc: NATS, settings: Settings, parent: str) -> list[str]:
    return descendants(await origins(nc, settings.names, await loops(nc, settings.names)), parent)


async def _answer_of(nc: NATS, settings: Settings, child: str) -> str:
    events = [e for _, e in await history(nc, settings, child)]
    done = [e for e in events if isinstance(e, ev.TurnDone)]
    assert len(done) == 1, [type(e).__name__ for e in events]
    assert done[0].message is not None
    return text_of(done[0].message)


async def _check_one_child(nc: NATS, settings: Settings, parent: str) -> str:
    """Exactly one child loop for the call, named by the call, whose answer is the call's result."""
    execution_id, result = await _parent_call(nc, settings, parent)
    children = await _children(nc, settings, parent)
    assert children == [child_loop_id(execution_id)]
    child = children[0]
    records = await history(nc, settings, child)
    check_history_invariants(records)
    started = records[0][1]
    assert isinstance(started, ev.LoopStarted) and started.parent is not None
    assert started.parent.loop_id == parent and started.parent.tool_execution_id == execution_id
    assert started.parent.tool_name == "researcher" and started.system == "You research things."
    assert sum(isinstance(e, ev.InputSubmitted) for _, e in records) == 1
    answer = await _answer_of(nc, settings, child)
    assert not result.is_error and text_of(result) == answer == CHILD_ANSWER
    # The worker's durable record of the call holds the same answer (a repeat is answered from it).
    record = await ResultStore(nc, settings.names).call("researcher", execution_id, loop_id=parent)
    assert record is not None and record.state == DONE
    assert answer in bytes(record.reply).decode()
    return child


async def test_the_parent_gets_the_child_s_answer_and_sees_its_progress(
    settings: Settings, nc: NATS, tmp_path: Path
) -> None:
    model = _script(tmp_path, [_call(0, "calculator", {"expression": "6*7"})])
    with system(settings, tools=("calculator", "sleep")) as s:
        _agent(s, model, tmp_path)
        lc, parent, live = await _run_parent(nc, settings, model)
        h = await wait_history(nc, settings, parent, lambda h: h.idle, timeout=40)
        assert h.turns == 1
        child = await _check_one_child(nc, settings, parent)
        first = (await history(nc, settings, child))[0][1]
        assert isinstance(first, ev.LoopStarted) and first.parent is not None
        started_parent = first.parent
        # The child ran its own tool: a tool step, then the answer.
        child_steps = [e for _, e in await history(nc, settings, child) if isinstance(e, ev.StepDone)]
        assert "42" in text_of(child_steps[0].messages[1])
        await anyio.sleep(0.3)
        progress = [e.message for e in live if isinstance(e, ev.ToolCallProgress)]
        assert any(f"child loop {child}" in m for m in progress), progress
        assert any("calculator started" in m for m in progress), progress
        assert any("tool call completed" in m for m in progress), progress
        # The parent's turn ended with its own answer after the call.
        final = [e for _, e in await history(nc, settings, parent) if isinstance(e, ev.TurnDone)]
        assert final and final[0].message is not None and text_of(final[0].message) == "Parent is done."
        # The committer refuses a loop that names itself as its parent, with a typed error.
        with pytest.raises(InvalidRequestError) as refused:
            await lc.start(child, parent=ev.ParentRef(**{**msgspec.structs.asdict(started_parent), "loop_id": child}))
        assert refused.value.body.field == "parent"
        # lineage shows the child under its parent.
        out = _cli(s, "lineage", child, "--json")
        rows = [json.loads(line) for line in out.splitlines()]
        assert [(r["loop_id"], r["depth"], r.get("link")) for r in rows] == [(parent, 0, None), (child, 1, "child")]
        # loops --json names each child's parent loop and agent tool (a fork's source stays "parent").
        loops = {r["loop_id"]: r for r in map(json.loads, _cli(s, "loops", "--json").splitlines())}
        assert (loops[child]["agent_parent"], loops[child]["agent_tool"], loops[child]["parent"]) == (
            parent,
            "researcher",
            None,
        )
        assert loops[parent]["agent_parent"] is None


async def test_interrupting_the_parent_interrupts_and_closes_the_child(
    settings: Settings, nc: NATS, tmp_path: Path
) -> None:
    model = _script(tmp_path, [_call(0, "sleep", {"seconds": 60})])
    with system(settings, tools=("calculator", "sleep")) as s:
        _agent(s, model, tmp_path)
        lc, parent, live = await _run_parent(nc, settings, model)

        async def sleeping() -> bool:
            return any(isinstance(e, ev.ToolCallProgress) and "sleep started" in e.message for e in live)

        await wait_for(sleeping, timeout=30)
        children = await _children(nc, settings, parent)
        assert len(children) == 1
        await lc.interrupt(parent)
        h = await wait_history(nc, settings, children[0], lambda h: h.closed, timeout=20)
        events = [type(e).__name__ for _, e in await history(nc, settings, children[0])]
        assert "TurnInterrupted" in events and "TurnDone" not in events and h.closed
        parent_events = [type(e).__name__ for _, e in await history(nc, settings, parent)]
        assert "TurnInterrupted" in parent_events and "StepDone" not in parent_events


@pytest.mark.parametrize("via", ["cli", "console"])
async def test_a_child_s_permission_gate_is_answered_in_the_parent_s_inbox(
    settings: Settings, nc: NATS, tmp_path: Path, via: str
) -> None:
    model = _script(tmp_path, [_call(0, "calculator", {"expression": "6*7"})])
    with system(settings, tools=("calculator", "sleep")) as s:
        _agent(s, model, tmp_path, "--policy", "calculator=ask")
        _, parent, _ = await _run_parent(nc, settings, model)

        async def listed() -> list[dict[str, object]]:
            out = _cli(s, "gates", parent, "--json")
            return [json.loads(line) for line in out.splitlines() if line.strip()]

        gates = await wait_for(listed, timeout=30, interval=0.5)
        assert len(gates) == 1
        gate = gates[0]
        children = await _children(nc, settings, parent)
        assert gate["loop_id"] == children[0] and gate["parent"] == parent and gate["tool"] == "calculator"
        # The console shows it in the parent's page, and the child under the parent in its lineage.
        port = free_port()
        s.start("console", ["-m", "services.cli", "console", "--port", str(port)])
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as web:

            async def on_parent_page() -> list[dict[str, object]]:
                doc = (await web.get(f"/api/loops/{parent}")).json()
                return doc["loop"]["open_gates"] if doc.get("ok") else []

            shown = await wait_for(on_parent_page, timeout=20, interval=0.3)
            assert [(g["gate_id"], g["loop_id"], g["child_of"]) for g in shown] == [
                (gate["gate_id"], children[0], parent)
            ]
            lineage = (await web.get(f"/api/loops/{parent}/lineage")).json()
            assert [(c["loop_id"], c["link"], c["tool"]) for c in lineage["children"]] == [
                (children[0], "child", "researcher")
            ]
            # Waiting longer than the caller's heartbeat-loss window: the call stays alive.
            await anyio.sleep(4)
            assert "StepDone" not in [type(e).__name__ for _, e in await history(nc, settings, parent)]
            if via == "cli":
                _cli(s, "approve", str(gate["gate_id"]))
            else:
                body = {"command_id": str(uuid.uuid4()), "gate_id": gate["gate_id"], "action": "approve"}
                answered = (await web.post(f"/api/loops/{children[0]}/answer", json=body)).json()
                assert answered["ok"], answered
        await wait_history(nc, settings, parent, lambda h: h.idle, timeout=30)
        await _check_one_child(nc, settings, parent)


@pytest.mark.parametrize("victim", ["agent", "model-step", "model-step SIGTERM"])
async def test_a_crash_mid_child_resumes_the_same_child(
    settings: Settings, nc: NATS, tmp_path: Path, victim: str
) -> None:
    model = _script(tmp_path, [_call(0, "sleep", {"seconds": 3})])
    with system(settings, tools=("calculator", "sleep")) as s:
        _agent(s, model, tmp_path)
        _, parent, _ = await _run_parent(nc, settings, model)

        async def child_waits() -> str | None:
            # The child's tool step is running: its turn started, no step committed yet.
            kids = await _children(nc, settings, parent)
            if not kids:
                return None
            names = [type(e).__name__ for _, e in await history(nc, settings, kids[0])]
            return kids[0] if "TurnStarted" in names and "StepDone" not in names else None

        child = await wait_for(child_waits, timeout=30)
        await anyio.sleep(0.5)  # the child's sleep call is under way
        svc = next(p for p in s.sup.services if p.name == victim.split(" ")[0])
        if victim.endswith("SIGTERM"):
            # A graceful stop cuts the parent's drive and cancels its call: the child is not abandoned.
            svc.stop(timeout=10)
        else:
            svc.kill()
        s.replace(svc)
        h: LoopHistory = await wait_history(nc, settings, parent, lambda h: h.idle, timeout=60)
        assert h.turns == 1
        assert await _check_one_child(nc, settings, parent) == child
        parent_records = await history(nc, settings, parent)
        check_history_invariants(parent_records)
        assert sum(isinstance(e, ev.StepDone) for _, e in parent_records) == 2


def _cli(s: System, *args: str) -> str:
    env = {**os.environ, **s.env}
    done = subprocess.run(
        [sys.executable, "-m", "services.cli", *args], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


async def test_a_failed_child_is_an_error_result_with_its_reason(settings: Settings, nc: NATS, tmp_path: Path) -> None:
    model = write_script(
        tmp_path,
        {
            "responses": [],
            "by_first_user_text": {
                PARENT_INPUT: [_call(0, "researcher", {"task": TASK}), "Parent is done."],
                TASK: [[{"error": "the child's model broke"}]],
            },
        },
    )
    with system(settings, tools=("calculator", "sleep")) as s:
        _agent(s, model, tmp_path)
        _, parent, _ = await _run_parent(nc, settings, model)
        await wait_history(nc, settings, parent, lambda h: h.idle, timeout=60)
        execution_id, result = await _parent_call(nc, settings, parent)
        child = child_loop_id(execution_id)
        failed = [e for _, e in await history(nc, settings, child) if isinstance(e, ev.TurnFailed)]
        assert len(failed) == 1
        assert result.is_error and text_of(result).startswith(f"error: researcher failed (child loop {child})")
        assert failed[0].err.kind in text_of(result) and failed[0].err.message[:20] in text_of(result)
