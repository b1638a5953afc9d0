"""A tool that has run is never run again: the model-step driving a call dies, another one continues.

Every service is its own process on one nats-server. A loop's step calls the ledger tool (it appends
every execution it starts to a file) for a few seconds; the model-step driving the loop is SIGKILLed
mid-call, sometimes with the ledger worker too. Checked from the ledger and the stored records:

* worker alive: the next model-step waits for the running call's recorded result — one execution,
  the real result committed, the call marked replayed on the live subjects;
* worker dead too, tool neither read-only nor idempotent: not run again — one execution, the
  committed result says the outcome is unknown; with ``on_unknown=ask`` an operator gate asks, and
  approving runs it a second time;
* worker dead too, idempotent tool: run again — two executions, the real result committed.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections import Counter
from pathlib import Path
from typing import Any

import anyio
import pytest
from nats.aio.client import Client as NATS

from services.model_step.steps import execution_id_for
from shared import events as ev
from shared.client import LoopClient
from shared.codec import decode_live_frame
from shared.connect import connect
from shared.content import ToolResultMessage, text_of
from shared.natsserver import NatsCluster, NatsServer
from shared.settings import Settings
from tests import natsfixtures
from tests.syshelpers import check_history_invariants, history, wait_history
from tests.system import reports
from tests.system.faultscript import write_model
from tests.system.fleet import Fleet, fleet
from tests.system.test_fencing import process_of, wait_holder

pytestmark = [pytest.mark.anyio, pytest.mark.system, pytest.mark.timeout(300)]

HOLD = 3.0  # seconds each ledger call takes: the window the kills land in


def ledger_script(tool: str, *, quick_first: bool = False) -> dict[str, Any]:
    """Step 0 calls ``tool`` (taking HOLD seconds) — after a quick call of the idempotent ledger if
    ``quick_first`` (it finishes, and is recorded, before the kill); step 1 answers."""
    call = [
        {"kind": "tool_use", "index": 1, "id": "l_{k}", "name": tool},
        {"kind": "tool_use", "index": 1, "text": json.dumps({"note": "once", "hold": HOLD})},
    ]
    if quick_first:
        call = [
            {"kind": "tool_use", "index": 0, "id": "q_{k}", "name": "ledger_idem"},
            {"kind": "tool_use", "index": 0, "text": json.dumps({"note": "quick", "hold": 0.05})},
            *call,
        ]
    return {"responses": [[*call, {"kind": "finish", "finish_reason": "tool_use"}], "done"], "repeat_last": True}


def read_ledger(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


async def tool_events(nc: NATS, settings: Settings, loop_id: str) -> list[ev.Event]:
    seen: list[ev.Event] = []

    async def on(msg: Any) -> None:
        seen.extend(e for e in decode_live_frame(msg.data) if isinstance(e, ev.ToolCallStarted | ev.ToolCallCompleted))

    await nc.subscribe(settings.names.live(loop_id), cb=on)
    return seen


async def committed_results(nc: NATS, settings: Settings, loop_id: str) -> list[str]:
    events = await history(nc, settings, loop_id)
    check_history_invariants(events)
    out = []
    for _, e in events:
        if isinstance(e, ev.StepDone):
            out += [text_of(m) for m in e.messages if isinstance(m, ToolResultMessage)]
    return out


async def kill_mid_call(
    nc: NATS, f: Fleet, settings: Settings, loop_id: str, seen: list[ev.Event], *, worker_too: bool
) -> None:
    with anyio.fail_after(30):
        while not any(isinstance(e, ev.ToolCallStarted) for e in seen):
            await anyio.sleep(0.02)
    await anyio.sleep(0.5)  # the call is running on the worker
    holder = await wait_holder(nc, settings, loop_id)
    process_of(f, holder).kill()
    if worker_too:
        for w in f.live("tools-ledger"):
            w.kill()
            await f.replace(w)


CASES = {
    # case: (tool, kill the worker too, on_unknown, executions, committed result starts with)
    "worker alive": ("ledger", False, "error", 1, "recorded once"),
    "worker dead, not idempotent": ("ledger", True, "error", 1, "error: outcome unknown: ledger"),
    "worker dead, idempotent": ("ledger_idem", True, "error", 2, "recorded once"),
    "worker dead, operator asked": ("ledger", True, "ask", 2, "recorded once"),
}


@pytest.mark.parametrize("case", list(CASES))
async def test_a_call_whose_step_runs_again_is_not_run_twice(
    case: str, nats_server: NatsServer, tmp_path: Path
) -> None:
    tool, worker_too, on_unknown, executions, result = CASES[case]
    settings = Settings.from_env({}, nats_urls=(nats_server.url,), prefix=natsfixtures.unique_prefix())
    ledger_file = tmp_path / "ledger.jsonl"
    ledger_file.touch()
    parked = on_unknown == "ask"
    model = write_model(tmp_path, ledger_script(tool, quick_first=parked), "ledger.json")
    counts = {"committer": 1, "tools-ledger": 1, "model-step": 2}
    with fleet(settings, counts=counts, env={"LW_LEDGER": str(ledger_file)}, log_dir=tmp_path / "logs") as f:
        nc = await connect(settings)
        try:
            api = LoopClient(nc, settings.names, timeout=15)
            loop_id = (await api.start(model=model, on_unknown=on_unknown)).loop_id
            seen = await tool_events(nc, settings, loop_id)
            await api.input(loop_id, "go")
            await kill_mid_call(nc, f, settings, loop_id, seen, worker_too=worker_too)
            if on_unknown == "ask":
                h = await wait_history(nc, settings, loop_id, lambda h: bool(h.open_gates), timeout=60)
                gate = h.open_gates[0].gate
                assert gate.reason == "outcome_unknown" and gate.tool_name == tool, gate
                await anyio.sleep(2.0)  # parked at the gate a while: the quick call's result must stay
                await api.answer(loop_id, gate.id, "approve")
            await wait_history(nc, settings, loop_id, lambda h: h.open_turn is None and h.turns == 1, timeout=90)
            results = await committed_results(nc, settings, loop_id)
        finally:
            await nc.close()
    ledger = read_ledger(ledger_file)
    runs = Counter(entry["execution_id"] for entry in ledger if entry["tool"] == tool)
    assert len(runs) == 1 and sum(runs.values()) == executions, ledger
    assert results[-1].startswith(result), results
    if parked:
        # The call that finished before the kill kept its recorded result through the gate: not run again.
        quick = [entry for entry in ledger if entry["tool"] == "ledger_idem"]
        assert len(quick) == 1 and results == ["recorded quick", results[-1]], (ledger, results)
    else:
        assert len(results) == 1, results
    if case == "worker alive":
        # The second model-step used the recorded result: its events say so.
        assert any(isinstance(e, ev.ToolCallCompleted) and e.replayed for e in seen), seen
    reports.add_figure(f"durable results: {case}", {"executions": sum(runs.values()), "result": results[-1][:60]})


# --- a storm of kills over many loops (3-node cluster, R3) ------------------------------------------

STORM_LOOPS = 50
STORM_STEPS = 10  # 9 tool steps, then the answer


def storm_script() -> dict[str, Any]:
    """9 tool steps — the unannotated ledger on even steps, the idempotent one on odd steps — then an answer."""
    responses: list[Any] = []
    for k in range(STORM_STEPS - 1):
        tool = "ledger" if k % 2 == 0 else "ledger_idem"
        responses.append(
            [
                {"kind": "tool_use", "index": 0, "id": f"l{k}_{{k}}", "name": tool},
                {"kind": "tool_use", "index": 0, "text": json.dumps({"note": f"step {k}", "hold": 0.3})},
                {"kind": "finish", "finish_reason": "tool_use"},
            ]
        )
    responses.append("done")
    return {"responses": responses, "repeat_last": True}


async def test_kill_storm_never_runs_a_call_of_a_tool_that_may_not_run_twice_twice(
    nats_cluster: NatsCluster, tmp_path: Path
) -> None:
    settings = Settings.from_env(
        {}, nats_urls=tuple(nats_cluster.urls), prefix=natsfixtures.unique_prefix(), replicas=3
    )
    ledger_file = tmp_path / "ledger.jsonl"
    ledger_file.touch()
    model = write_model(tmp_path, storm_script(), "storm.json")
    counts = {"committer": 2, "model-step": 3, "tools-ledger": 2}
    rng = random.Random(int(os.environ.get("LW_CHAOS_SEED", "1")))
    kills: Counter[str] = Counter()
    t0 = time.monotonic()
    with fleet(
        settings, nats_cluster, counts=counts, env={"LW_LEDGER": str(ledger_file)}, log_dir=tmp_path / "logs"
    ) as f:
        nc = await connect(settings)
        try:
            api = LoopClient(nc, settings.names, timeout=15)
            loop_ids = [(await api.start(model=model)).loop_id for _ in range(STORM_LOOPS)]
            for loop_id in loop_ids:
                await api.input(loop_id, "go")
            finished: set[str] = set()

            async def wait_all() -> None:
                for loop_id in loop_ids:
                    await wait_history(
                        nc, settings, loop_id, lambda h: h.turns == 1 and h.open_turn is None, timeout=240
                    )
                    finished.add(loop_id)

            async with anyio.create_task_group() as tg:
                tg.start_soon(kill_until_done, f, rng, kills, finished)
                await wait_all()
            results, steps = await storm_results(nc, settings, loop_ids)
        finally:
            await nc.close()
    runs: Counter[tuple[str, str]] = Counter((x["tool"], x["execution_id"]) for x in read_ledger(ledger_file))
    again = {t: sum(n - 1 for (tool, _), n in runs.items() if tool == t and n > 1) for t in ("ledger", "ledger_idem")}
    unknown = sum(1 for text in results.values() if text.startswith("error: outcome unknown"))
    figures = {
        "loops": STORM_LOOPS,
        "steps_committed": steps,
        "seconds": round(time.monotonic() - t0, 1),
        "kills": dict(kills),
        "executions": sum(runs.values()),
        "re_executions": again,
        "unknown_outcomes": unknown,
        "crashed_results": sum(1 for text in results.values() if text.startswith("error: tool crashed")),
    }
    reports.add_figure("durable results under a kill storm", figures)
    print(figures)
    assert steps == STORM_LOOPS * STORM_STEPS, figures
    assert again["ledger"] == 0, figures  # a tool that may not run twice never did
    for (tool, eid), n in runs.items():
        # every committed real result of a call was produced by exactly one execution of it (or, for
        # the idempotent tool, by a re-run after an unknown first outcome)
        if results.get(eid, "").startswith("recorded") and tool == "ledger":
            assert n == 1, (tool, eid, n)
    assert kills, figures


async def kill_until_done(f: Fleet, rng: random.Random, kills: Counter[str], finished: set[str]) -> None:
    """Every 0.2-1 s, SIGKILL a model-step, a ledger worker or both, and replace them, until all loops finished."""
    while len(finished) < STORM_LOOPS:
        await anyio.sleep(rng.uniform(0.2, 1.0))
        roles = rng.choice([["model-step"], ["tools-ledger"], ["model-step", "tools-ledger"]])
        victims = [f.pick(role) for role in roles]
        for v in victims:
            v.kill()
            kills[v.name] += 1
        for v in victims:
            await f.replace(v)


async def storm_results(nc: NATS, settings: Settings, loop_ids: list[str]) -> tuple[dict[str, str], int]:
    """Check each loop's history; (execution id → committed result text, number of steps committed)."""
    results: dict[str, str] = {}
    steps = 0
    for loop_id in loop_ids:
        events = await history(nc, settings, loop_id)
        check_history_invariants(events)
        for _, e in events:
            if isinstance(e, ev.StepDone):
                steps += 1
                for m in e.messages:
                    if isinstance(m, ToolResultMessage):
                        results[execution_id_for(e.step_id, m.tool_use_id)] = text_of(m)
    return results, steps
