"""Sub-agents at their limits; every service its own OS process, everything checked from stored records.

* More parents wait on an agent call at once than the model-step has drive slots: a waiting parent
  gives its slot back, so the children are driven and every parent's turn ends.
* Agents calling each other (ping → pong → ping) get an error result naming the cycle instead of
  nesting without end; a chain deeper than ``LW_AGENT_MAX_DEPTH`` is refused the same way. The
  callers' turns complete.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from pathlib import Path

import anyio
import httpx
import pytest
from nats.aio.client import Client as NATS

from services.tools.agent import child_loop_id
from shared import events as ev
from shared.client import LoopClient
from shared.content import ToolResultMessage, text_of
from shared.natsserver import free_port
from shared.settings import Settings
from tests.syshelpers import (
    System,
    check_history_invariants,
    history,
    system,
    wait_for,
    wait_history,
    write_script,
)

pytestmark = [pytest.mark.anyio, pytest.mark.system, pytest.mark.timeout(240)]

PARENT_INPUT = "delegate it"


def _call(name: str, **args: object) -> list[dict[str, object]]:
    """A scripted model step: one call of tool ``name`` with ``args``."""
    return [
        {"kind": "tool_use", "index": 0, "id": "call_0", "name": name},
        {"kind": "tool_use", "index": 0, "text": json.dumps(args)},
        {"kind": "finish", "finish_reason": "tool_use"},
    ]


def _agent(s: System, name: str, model: str, tools: str, env: dict[str, str] | None = None) -> None:
    args = ["-m", "services.cli", "serve", "agent", name, "--model", model, "--tools", tools]
    s.start(f"agent-{name}", args, env=env)


async def _start_parent(lc: LoopClient, model: str, tools: list[str]) -> str:
    parent = str(uuid.uuid4())
    await lc.start(parent, model=model, tools=tools)
    await lc.input(parent, PARENT_INPUT)
    return parent


async def _tool_result(nc: NATS, settings: Settings, loop_id: str) -> tuple[str, ToolResultMessage]:
    """The loop's committed tool step: its call's execution id and result."""
    for _, e in await history(nc, settings, loop_id):
        if isinstance(e, ev.StepDone) and len(e.messages) > 1:
            result = e.messages[1]
            assert isinstance(result, ToolResultMessage)
            return ev.execution_id_for(e.step_id, result.tool_use_id), result
    raise AssertionError(f"loop {loop_id} has no tool step")


async def _done_answer(nc: NATS, settings: Settings, loop_id: str) -> str:
    """The answer of the loop's only turn, which must have ended done; its records are checked."""
    records = await history(nc, settings, loop_id)
    check_history_invariants(records)
    done = [e for _, e in records if isinstance(e, ev.TurnDone)]
    assert len(done) == 1 and done[0].message is not None, [type(e).__name__ for _, e in records]
    return text_of(done[0].message)


def _slot_gauges(text: str) -> tuple[float, float]:
    """(loopwire_loops_driven, loopwire_loops_waiting) of a /metrics page."""
    found = dict.fromkeys(("loopwire_loops_driven", "loopwire_loops_waiting"), -1.0)
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in found:
            found[name] = float(value)
    return found["loopwire_loops_driven"], found["loopwire_loops_waiting"]


async def test_more_waiting_parents_than_drive_slots_all_finish(settings: Settings, nc: NATS, tmp_path: Path) -> None:
    slots, parents = 2, 6
    model = write_script(
        tmp_path,
        {
            "responses": [],
            "by_first_user_text": {
                PARENT_INPUT: [_call("researcher", task="research it"), "Parent is done."],
                # The child sleeps: its parent waits on the call meanwhile, all parents at once.
                "research it": [_call("sleep", seconds=3), "The child says: 42."],
            },
        },
    )
    env = {"LW_MODEL_STEP_CONCURRENCY": str(slots)}
    port = free_port()
    with system(settings, tools=("sleep",), env=env, model_steps=0) as s:
        s.model_step(LW_METRICS_PORT=str(port))
        _agent(s, "researcher", model, "sleep")
        lc = LoopClient(nc, settings.names)
        ids = [await _start_parent(lc, model, ["researcher"]) for _ in range(parents)]
        gauges: list[tuple[float, float]] = []  # (driven, waiting), sampled while the parents run
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=5) as web:

            async def sample() -> None:
                while True:
                    with contextlib.suppress(httpx.HTTPError):
                        gauges.append(_slot_gauges((await web.get("/metrics")).text))
                    await anyio.sleep(0.2)

            async with anyio.create_task_group() as tg:
                tg.start_soon(sample)
                with anyio.fail_after(90):
                    for parent in ids:
                        await wait_history(nc, settings, parent, lambda h: h.idle and h.turns == 1, timeout=90)
                tg.cancel_scope.cancel()

            async def settled() -> bool:
                return _slot_gauges((await web.get("/metrics")).text) == (0.0, 0.0)

            await wait_for(settled, timeout=10, interval=0.2)  # every drive ended, every slot back
        # The gauges saw more loops driven than slots, the extra ones waiting with their slot given back.
        assert any(driven > slots and driven - waiting <= slots for driven, waiting in gauges), gauges
        children: list[str] = []
        for parent in ids:
            execution_id, result = await _tool_result(nc, settings, parent)
            child = child_loop_id(execution_id)
            children.append(child)
            answer = await _done_answer(nc, settings, child)
            assert not result.is_error and text_of(result) == answer == "The child says: 42."
            assert await _done_answer(nc, settings, parent) == "Parent is done."
        # More children ran at once than the replica has slots, each with its parent waiting on it
        # (one history stream: its sequences order the loops' records).
        marks: list[tuple[int, int]] = []
        for child in children:
            for seq, e in await history(nc, settings, child):
                if isinstance(e, ev.TurnStarted | ev.TurnDone):
                    marks.append((seq, 1 if isinstance(e, ev.TurnStarted) else -1))
        running = [sum(step for _, step in sorted(marks)[: k + 1]) for k in range(len(marks))]
        assert len(marks) == 2 * parents and max(running) > slots, sorted(marks)


async def test_agents_calling_each_other_get_a_cycle_error(settings: Settings, nc: NATS, tmp_path: Path) -> None:
    model = write_script(
        tmp_path,
        {
            "responses": [],
            "by_first_user_text": {
                PARENT_INPUT: [_call("ping", task="ping task"), "Parent is done."],
                "ping task": [_call("pong", task="pong task"), "Ping is done."],
                "pong task": [_call("ping", task="ping again"), "Pong is done."],
                "ping again": ["never reached"],
            },
        },
    )
    with system(settings, tools=()) as s:
        _agent(s, "ping", model, "pong")
        _agent(s, "pong", model, "ping")
        lc = LoopClient(nc, settings.names)
        parent = await _start_parent(lc, model, ["ping"])
        await wait_history(nc, settings, parent, lambda h: h.idle and h.turns == 1, timeout=60)
        assert await _done_answer(nc, settings, parent) == "Parent is done."
        ping_eid, ping_result = await _tool_result(nc, settings, parent)
        ping_child = child_loop_id(ping_eid)
        assert not ping_result.is_error and text_of(ping_result) == "Ping is done."
        pong_eid, pong_result = await _tool_result(nc, settings, ping_child)
        pong_child = child_loop_id(pong_eid)
        assert not pong_result.is_error and text_of(pong_result) == "Pong is done."
        # pong's child called ping again: refused, with the chain named, and no third child.
        again_eid, again = await _tool_result(nc, settings, pong_child)
        assert again.is_error
        assert text_of(again) == (
            "error: tool call refused: sub-agent cycle: ping already runs in this loop's calling chain "
            "(ping → pong → ping)"
        )
        assert await history(nc, settings, child_loop_id(again_eid)) == []
        assert await _done_answer(nc, settings, pong_child) == "Pong is done."


async def test_a_chain_deeper_than_the_maximum_is_refused(settings: Settings, nc: NATS, tmp_path: Path) -> None:
    model = write_script(
        tmp_path,
        {
            "responses": [],
            "by_first_user_text": {
                PARENT_INPUT: [_call("a1", task="task 1"), "Parent is done."],
                "task 1": [_call("a2", task="task 2"), "a1 is done."],
                "task 2": [_call("a3", task="task 3"), "a2 is done."],
                "task 3": ["never reached"],
            },
        },
    )
    env = {"LW_AGENT_MAX_DEPTH": "2"}
    with system(settings, tools=()) as s:
        for k, tools in ((1, "a2"), (2, "a3"), (3, "calculator")):
            _agent(s, f"a{k}", model, tools, env)
        lc = LoopClient(nc, settings.names)
        parent = await _start_parent(lc, model, ["a1"])
        await wait_history(nc, settings, parent, lambda h: h.idle and h.turns == 1, timeout=60)
        assert await _done_answer(nc, settings, parent) == "Parent is done."
        a1_eid, _ = await _tool_result(nc, settings, parent)
        a2_eid, a2_result = await _tool_result(nc, settings, child_loop_id(a1_eid))
        assert not a2_result.is_error and text_of(a2_result) == "a2 is done."
        # a2's child is two levels deep: its call of a3 would be the third.
        a3_eid, a3_result = await _tool_result(nc, settings, child_loop_id(a2_eid))
        assert a3_result.is_error
        assert text_of(a3_result) == (
            "error: tool call refused: sub-agent depth: a3 would run 3 levels deep (a1 → a2 → a3); "
            "at most 2 nested sub-agents (LW_AGENT_MAX_DEPTH)"
        )
        assert await history(nc, settings, child_loop_id(a3_eid)) == []
