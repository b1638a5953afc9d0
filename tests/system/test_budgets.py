"""Budgets enforced by a real model-step: committer, tool worker and model-step as separate OS processes."""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from nats.aio.client import Client as NATS
from prometheus_client.parser import text_string_to_metric_families as parse_text

from services.model_step.budget import budget_verdict
from shared import events as ev
from shared.client import LoopClient
from shared.history import fold
from shared.natsserver import free_port
from shared.protocol import InvalidRequestError
from shared.settings import Settings
from tests.syshelpers import check_history_invariants, history, system, wait_history, write_script
from tests.system.test_fork import acli
from tests.system.test_readme_examples import ROOT, Example, _python_block

BUDGET_EXAMPLE = _python_block("Budgets", "Budget(")

pytestmark = [pytest.mark.anyio, pytest.mark.system]


def _step(k: int, tokens: int, sleep: float = 0.0) -> list[dict[str, Any]]:
    """A calculator call that reports ``tokens`` input tokens (100 micro-USD per 100 at the test price)."""
    items: list[dict[str, Any]] = [{"sleep": sleep}] if sleep else []
    return [
        *items,
        {"kind": "tool_use", "index": 0, "id": f"call_{k}_{{k}}", "name": "calculator"},
        {"kind": "tool_use", "index": 0, "text": '{"expression": "1+1"}'},
        {"kind": "usage", "usage": {"input_tokens": tokens}},
        {"kind": "finish", "finish_reason": "tool_use"},
    ]


def _script(tmp: Path, name: str, tokens: int = 100, sleep: float = 0.0) -> str:
    return write_script(tmp, {"responses": [_step(0, tokens, sleep)], "repeat_last": True}, name)


def _failure(events: list[tuple[int, ev.Event]]) -> ev.TurnError:
    (failed,) = [e for _, e in events if isinstance(e, ev.TurnFailed)]
    return failed.err


def _steps(events: list[tuple[int, ev.Event]]) -> list[ev.StepDone]:
    return [e for _, e in events if isinstance(e, ev.StepDone)]


async def test_each_limit_ends_the_turn_and_the_budget_command_changes_it(
    settings: Settings, nc: NATS, tmp_path: Path
) -> None:
    model = _script(tmp_path, "steps.json")
    slow = _script(tmp_path, "slow.json", sleep=0.4)
    budgets = {
        "tokens": (model, ev.Budget(max_total_tokens=250)),
        "cost": (model, ev.Budget(max_cost_usd=0.00015)),
        "steps": (model, ev.Budget(max_steps_per_turn=2)),
        "seconds": (slow, ev.Budget(max_turn_seconds=1.0)),
    }
    with system(settings, tools=("calculator",)):
        lc = LoopClient(nc, settings.names)
        loops = {name: str(uuid.uuid4()) for name in budgets}
        for name, (spec, budget) in budgets.items():
            await lc.start(loops[name], model=spec, budget=budget)
            await lc.input(loops[name], "count")
        for loop_id in loops.values():
            await wait_history(nc, settings, loop_id, lambda h: h.idle, timeout=30)

        tokens = await history(nc, settings, loops["tokens"])
        check_history_invariants(tokens)
        assert len(_steps(tokens)) == 3  # 100, 200 (< 250), 300: the fourth step is not asked for
        assert _failure(tokens) == ev.TurnError(
            kind="budget", message="budget exhausted: max_total_tokens 300/250 tokens"
        )

        cost = await history(nc, settings, loops["cost"])
        assert [s.cost_micro_usd for s in _steps(cost)] == [100, 100]  # 100 input tokens at $1 per million
        assert _failure(cost).message == "budget exhausted: max_cost_usd $0.000200/$0.000150"
        assert fold(cost).cost_micro_usd == 200

        steps = await history(nc, settings, loops["steps"])
        assert len(_steps(steps)) == 2
        assert _failure(steps).message == "budget exhausted: max_steps_per_turn 2/2 steps"

        seconds = await history(nc, settings, loops["seconds"])
        assert 2 <= len(_steps(seconds)) <= 4  # ~0.4 s a step
        assert _failure(seconds).kind == "budget"
        assert _failure(seconds).message.startswith("budget exhausted: max_turn_seconds ")

        # The budget command: the steps loop gets unlimited steps but a token limit its next turn
        # already spent, so that turn ends before its first step.
        await lc.budget(loops["steps"], ev.Budget(max_total_tokens=150))
        await lc.input(loops["steps"], "again")
        h = await wait_history(nc, settings, loops["steps"], lambda h: h.turns == 2 and h.idle)
        assert h.budget == ev.Budget(max_total_tokens=150)
        again = await history(nc, settings, loops["steps"])
        assert len(_steps(again)) == 2
        assert [e.err.message for _, e in again if isinstance(e, ev.TurnFailed)][-1] == (
            "budget exhausted: max_total_tokens 200/150 tokens"
        )
        assert any(isinstance(e, ev.BudgetChanged) for _, e in again)

        # A cost limit needs a priced model.
        with pytest.raises(InvalidRequestError, match="no price"):
            await lc.start(str(uuid.uuid4()), model="openai:no-such-model", budget=ev.Budget(max_cost_usd=1))


async def test_ask_opens_a_budget_gate_approve_extends_and_deny_fails(
    settings: Settings, nc: NATS, tmp_path: Path
) -> None:
    model = write_script(tmp_path, {"responses": [_step(0, 10), _step(1, 10), "done"]})
    with system(settings, tools=("calculator",)):
        lc = LoopClient(nc, settings.names)
        loop_id, denied = str(uuid.uuid4()), str(uuid.uuid4())
        for lid in (loop_id, denied):
            await lc.start(lid, model=model, budget=ev.Budget(max_steps_per_turn=1, on_budget="ask"))
            await lc.input(lid, "go")

        h = await wait_history(nc, settings, loop_id, lambda h: bool(h.open_gates))
        (gate,) = h.open_gates
        assert gate.gate.kind == "budget" and gate.gate.controls == ["approve", "deny"]
        (listed,) = [json.loads(line) for line in (await acli(settings, "gates", loop_id, "--json")).splitlines()]
        assert (listed["kind"], listed["tool"]) == ("budget", "max_steps_per_turn")
        assert listed["text"].startswith("budget exhausted: max_steps_per_turn 1/1 steps; approve grants")
        await lc.answer(loop_id, gate.gate.id, "approve")
        # Approved: one more step (the limit as set, again); the second tool step spends it, so a
        # second gate opens before the answer.
        h = await wait_history(nc, settings, loop_id, lambda h: bool(h.open_gates) or h.idle)
        assert h.budget.max_steps_per_turn == 2
        (gate2,) = h.open_gates
        await lc.answer(loop_id, gate2.gate.id, "approve")
        h = await wait_history(nc, settings, loop_id, lambda h: h.idle)
        events = await history(nc, settings, loop_id)
        check_history_invariants(events)
        assert any(isinstance(e, ev.TurnDone) for _, e in events)
        assert len(_steps(events)) == 3
        assert h.budget.max_steps_per_turn == 3

        h = await wait_history(nc, settings, denied, lambda h: bool(h.open_gates))
        await lc.answer(denied, h.open_gates[0].gate.id, "deny")
        await wait_history(nc, settings, denied, lambda h: h.idle)
        err = _failure(await history(nc, settings, denied))
        assert err == ev.TurnError(
            kind="budget", message="budget exhausted: max_steps_per_turn 1/1 steps (budget gate deny)"
        )


async def test_a_takeover_after_sigkill_sees_the_same_figures(settings: Settings, nc: NATS, tmp_path: Path) -> None:
    model = _script(tmp_path, "slow.json", sleep=0.5)
    with system(settings, tools=("calculator",)) as sysm:
        lc = LoopClient(nc, settings.names)
        loop_id = str(uuid.uuid4())
        await lc.start(loop_id, model=model, budget=ev.Budget(max_total_tokens=350, max_cost_usd=0.001))
        await lc.input(loop_id, "count")
        await wait_history(nc, settings, loop_id, lambda h: len(h.step_ids) >= 2)
        (ms,) = sysm.sup.by_name("model-step")
        ms.kill()  # SIGKILL mid-turn (the third step is streaming)
        sysm.replace(ms)
        h = await wait_history(nc, settings, loop_id, lambda h: h.idle, timeout=40)

    events = await history(nc, settings, loop_id)
    check_history_invariants(events)
    steps = _steps(events)
    assert len(steps) == 4  # each step stored once: 100, 200, 300 (< 350), 400
    assert [s.cost_micro_usd for s in steps] == [100] * 4
    assert (h.figures().tokens, h.cost_micro_usd) == (400, 400)
    err = _failure(events)
    assert err.message == "budget exhausted: max_total_tokens 400/350 tokens"
    # The decision is the fold's: the records before the TurnFailed decide exactly what was committed.
    before = [(s, e) for s, e in events if not isinstance(e, ev.TurnFailed | ev.LoopIdle)]
    verdict = budget_verdict(fold(before), "")
    assert (verdict.action, verdict.message) == ("fail", err.message)


async def test_the_readme_budget_example_runs(settings: Settings, nc: NATS, tmp_path: Path) -> None:
    assert (ROOT / "examples" / "budget_loop.py").read_text() == BUDGET_EXAMPLE
    with system(settings, tools=("calculator",)):
        example = Example(tmp_path, "budget_loop", BUDGET_EXAMPLE, settings, "what is 17*23")
        code, out = await example.finish(60)
    assert code == 0, out
    lines = out.splitlines()
    assert lines[0] == "failed budget: budget exhausted: max_steps_per_turn 1/1 steps", out
    assert lines[1].startswith("done ") and "17*23 = 391" in out, out
    assert re.fullmatch(r"cost \$0\.000\d{3}, budget 4 steps a turn", lines[-1]), out


async def test_the_cli_starts_shows_and_changes_a_budget(settings: Settings, nc: NATS, tmp_path: Path) -> None:
    model = _script(tmp_path, "steps.json")
    with system(settings, tools=("calculator",)):
        started = await acli(
            settings, "start", "--model", model, "--max-steps-per-turn", "2", "--max-cost-usd", "0.5", "--json"
        )
        loop_id = json.loads(started)["loop_id"]
        await LoopClient(nc, settings.names).input(loop_id, "count")
        await wait_history(nc, settings, loop_id, lambda h: h.idle)
        shown = json.loads(await acli(settings, "budget", loop_id, "--json"))
        assert shown["budget"] == {"max_cost_usd": 0.5, "max_steps_per_turn": 2}
        assert (shown["tokens"], shown["cost_usd"], shown["turn_cost_usd"]) == (200, 0.0002, {"1": 0.0002})
        changed = json.loads(await acli(settings, "budget", loop_id, "--max-total-tokens", "900", "--json"))
        assert changed["budget"] == {"max_total_tokens": 900, "max_cost_usd": 0.5, "max_steps_per_turn": 2}
        text = await acli(settings, "budget", loop_id)
        assert "tokens      200 / 900" in text and "on budget   fail" in text
        rows = [json.loads(line) for line in (await acli(settings, "loops", "--json")).splitlines()]
        (row,) = [r for r in rows if r["loop_id"] == loop_id]
        assert (row["cost_usd"], row["budget"]["max_total_tokens"]) == (0.0002, 900)


async def test_metrics_count_cost_per_model_and_budget_stops(settings: Settings, nc: NATS, tmp_path: Path) -> None:
    model = _script(tmp_path, "metered.json")
    port = free_port()
    with system(settings, tools=("calculator",), model_steps=0) as sysm:
        sysm.model_step(LW_METRICS_PORT=str(port))
        lc = LoopClient(nc, settings.names)
        loop_id = str(uuid.uuid4())
        await lc.start(loop_id, model=model, budget=ev.Budget(max_total_tokens=250))
        await lc.input(loop_id, "count")
        await wait_history(nc, settings, loop_id, lambda h: h.idle)
        async with httpx.AsyncClient() as client:
            text = (await client.get(f"http://127.0.0.1:{port}/metrics", timeout=5)).text
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in parse_text(text) for s in f.samples}
    cost = samples[("loopwire_model_cost_usd_total", (("model", "scripted:metered.json"),))]
    assert cost == pytest.approx(0.0003)  # three steps of 100 input tokens at $1 per million
    stops = samples[("loopwire_budget_stops_total", (("limit", "max_total_tokens"), ("outcome", "fail")))]
    assert stops == 1
