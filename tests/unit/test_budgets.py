"""Budgets: the price table, the fold of costs and budgets, and the pure decision before each step."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from services.cli import main
from services.cli.budgets import budget_from_args
from services.cli.errors import CliError
from services.console.rules import LoopSummary
from services.model_step.budget import budget_verdict
from shared import events as ev
from shared import wiretypes
from shared.budget import Figures, exhausted, extended, seconds_between, total_tokens
from shared.content import AIMessage, Message, TextBlock, Usage, UserMessage
from shared.errors import InvalidEventError
from shared.history import LoopHistory, fold
from shared.pricing import PRICES, TEST_PRICE, price_of, step_cost_micro_usd, usd_to_micro
from shared.validate import validate_event
from shared.wiretypes import MAX_LIMIT_COUNT, MAX_LIMIT_VALUE

LOOP = "0f3c9a52-1b7e-4c1a-9e55-2d6b8f0a7c11"
TURN = "1f3c9a52-1b7e-4c1a-9e55-2d6b8f0a7c12"
T0 = "2026-01-15T09:30:00.000000Z"


# --- pricing -------------------------------------------------------------------------------------


def test_test_models_have_the_documented_price() -> None:
    assert price_of("demo") == TEST_PRICE
    assert price_of("scripted:/tmp/x/s.json") == TEST_PRICE
    assert price_of("scripted:s.json") == TEST_PRICE


def test_provider_models_are_priced_by_their_longest_listed_prefix() -> None:
    assert price_of("openai:gpt-4o") == PRICES["gpt-4o"]
    assert price_of("openai:gpt-4o-mini-2024-07-18") == PRICES["gpt-4o-mini"]
    assert price_of("anthropic:claude-sonnet-4-5-20250929") == PRICES["claude-sonnet-4-5"]
    assert price_of("anthropic:claude-opus-4-1-20250805") == PRICES["claude-opus-4-1"]
    assert price_of("anthropic:claude-3-5-haiku-latest") == PRICES["claude-3-5-haiku"]
    assert price_of("openai:my-local-llama") is None
    assert price_of("openai:gpt-4oxyz") is None  # a prefix only counts up to a dash


def test_step_cost_is_micro_usd_rounded_up() -> None:
    usage = Usage(input_tokens=1000, output_tokens=500, cache_read_tokens=100, cache_creation_tokens=8)
    # 1000×1 + 500×2 + 100×0.1 + 8×1.25 micro-USD
    assert step_cost_micro_usd(TEST_PRICE, usage) == 2020
    assert step_cost_micro_usd(TEST_PRICE, Usage(cache_read_tokens=1)) == 1  # 0.1 rounds up
    assert step_cost_micro_usd(None, usage) == 0
    assert step_cost_micro_usd(TEST_PRICE, None) == 0
    assert step_cost_micro_usd(PRICES["gpt-4o"], Usage(input_tokens=1_000_000)) == 2_500_000
    assert usd_to_micro(0.0025) == 2500


# --- figures and extension -----------------------------------------------------------------------


def test_total_tokens_counts_cached_input_and_output() -> None:
    assert total_tokens(Usage(input_tokens=1, output_tokens=2, cache_read_tokens=4, cache_creation_tokens=8)) == 15


def test_seconds_between() -> None:
    assert seconds_between(T0, "2026-01-15T09:30:12.500000Z") == 12.5
    assert seconds_between("", T0) == 0.0
    assert seconds_between(T0, "2026-01-15T09:29:00.000000Z") == 0.0


def test_exhausted_limits_in_order() -> None:
    b = ev.Budget(max_total_tokens=100, max_cost_usd=0.001, max_steps_per_turn=3, max_turn_seconds=10)
    assert exhausted(b, Figures(tokens=99, cost_micro_usd=999, steps=2, turn_seconds=9.9)) == []
    spent = Figures(tokens=100, cost_micro_usd=1000, steps=3, turn_seconds=10)
    assert exhausted(b, spent) == ["max_total_tokens", "max_cost_usd", "max_steps_per_turn", "max_turn_seconds"]
    assert exhausted(ev.Budget(), spent) == []  # 0 = unlimited


def test_extension_grants_the_amount_as_set_again_from_what_is_spent() -> None:
    base = ev.Budget(max_total_tokens=100, max_turn_seconds=10, max_steps_per_turn=5)
    f = Figures(tokens=130, steps=1, turn_seconds=60)
    b = extended(base, base, f)
    assert b.max_total_tokens == 230  # spent past the limit: from what is spent
    assert b.max_turn_seconds == 70  # an hour at the gate still leaves the turn its seconds
    assert b.max_steps_per_turn == 5  # not spent: unchanged
    assert extended(b, base, Figures(tokens=230, steps=1)).max_total_tokens == 330


# --- the fold ------------------------------------------------------------------------------------


def _started(budget: ev.Budget, model: str = "demo") -> ev.LoopStarted:
    return ev.make(ev.LoopStarted, loop_id=LOOP, model=model, budget=budget)


def _turn(turn_id: str = TURN, index: int = 1, at: str = T0) -> ev.TurnStarted:
    return ev.TurnStarted(
        loop_id=LOOP,
        turn_id=turn_id,
        turn_index=index,
        event_id=ev.new_id(),
        created_at=at,
        message=UserMessage(blocks=[TextBlock(text="hi")]),
    )


def _step(k: int, usage: Usage, cost: int, turn_id: str = TURN, answer: bool = False) -> ev.StepDone:
    msg = AIMessage(blocks=[TextBlock(text="x")], usage=usage)
    msgs: list[Message] = [msg] if answer else [msg, UserMessage(blocks=[TextBlock(text="r")])]
    return ev.make(
        ev.StepDone,
        loop_id=LOOP,
        turn_id=turn_id,
        step_id=ev.step_id_for(turn_id, k),
        messages=msgs,
        cost_micro_usd=cost,
    )


def _fold(*events: ev.Event) -> LoopHistory:
    return fold((i + 1, e) for i, e in enumerate(events))


def test_fold_sums_costs_per_loop_and_turn() -> None:
    turn2 = "2f3c9a52-1b7e-4c1a-9e55-2d6b8f0a7c13"
    h = _fold(
        _started(ev.Budget()),
        _turn(),
        _step(0, Usage(input_tokens=10, output_tokens=5), 20),
        _step(1, Usage(input_tokens=20, output_tokens=5), 30, answer=True),
        ev.make(ev.TurnDone, loop_id=LOOP, turn_id=TURN, turn_index=1),
        _turn(turn2, 2),
        _step(0, Usage(input_tokens=1, output_tokens=1), 3, turn_id=turn2),
    )
    assert h.cost_micro_usd == 53
    assert h.turn_costs == {1: 50, 2: 3}
    assert h.open_turn is not None and h.open_turn.cost_micro_usd == 3
    f = h.figures()
    assert (f.tokens, f.steps) == (42, 1)
    assert h.copy().turn_costs == {1: 50, 2: 3}


def test_budget_changed_replaces_the_budget() -> None:
    h = _fold(_started(ev.Budget(max_total_tokens=10)), ev.make(ev.BudgetChanged, loop_id=LOOP, budget=ev.Budget()))
    assert h.budget == ev.Budget() and h.budget_base == ev.Budget()


# --- the decision --------------------------------------------------------------------------------


def _gate(gate_id: str, k: int) -> ev.GateOpened:
    return ev.make(
        ev.GateOpened,
        loop_id=LOOP,
        turn_id=TURN,
        step_id=ev.step_id_for(TURN, k),
        gate=ev.Gate(id=gate_id, kind="budget", controls=["approve", "deny"], tool_name="max_total_tokens"),
    )


def _answer(gate_id: str, k: int, action: wiretypes.GateAction) -> ev.GateResolved:
    return ev.make(
        ev.GateResolved, loop_id=LOOP, turn_id=TURN, step_id=ev.step_id_for(TURN, k), gate_id=gate_id, action=action
    )


def test_within_budget_goes_on() -> None:
    h = _fold(_started(ev.Budget(max_total_tokens=100)), _turn(), _step(0, Usage(input_tokens=50), 50))
    assert budget_verdict(h, T0).action == "go"


def test_token_budget_fails_with_the_figures() -> None:
    h = _fold(_started(ev.Budget(max_total_tokens=100)), _turn(), _step(0, Usage(input_tokens=90, output_tokens=20), 0))
    v = budget_verdict(h, T0)
    assert v.action == "fail" and v.limits == ("max_total_tokens",)
    assert v.message == "budget exhausted: max_total_tokens 110/100 tokens"


def test_cost_steps_and_time() -> None:
    h = _fold(_started(ev.Budget(max_cost_usd=0.0001)), _turn(), _step(0, Usage(input_tokens=1), 100))
    assert budget_verdict(h, T0).message == "budget exhausted: max_cost_usd $0.000100/$0.000100"
    h = _fold(_started(ev.Budget(max_steps_per_turn=2)), _turn(), _step(0, Usage(), 0), _step(1, Usage(), 0))
    assert budget_verdict(h, T0).limits == ("max_steps_per_turn",)
    h = _fold(_started(ev.Budget(max_turn_seconds=5)), _turn())
    assert budget_verdict(h, "2026-01-15T09:30:04.900000Z").action == "go"
    v = budget_verdict(h, "2026-01-15T09:30:05.000000Z")
    assert v.action == "fail" and v.message == "budget exhausted: max_turn_seconds 5.0/5 s"


def test_ask_opens_a_gate_approve_extends_deny_fails() -> None:
    gate = "3f3c9a52-1b7e-4c1a-9e55-2d6b8f0a7c14"
    events: list[ev.Event] = [
        _started(ev.Budget(max_total_tokens=100, on_budget="ask")),
        _turn(),
        _step(0, Usage(input_tokens=100), 0),
    ]
    assert budget_verdict(_fold(*events), T0).action == "ask"
    events.append(_gate(gate, 1))
    assert budget_verdict(_fold(*events), T0).action == "ask"  # (the driver does not run: the gate is open)
    approved = _fold(*events, _answer(gate, 1, "approve"))
    assert approved.budget.max_total_tokens == 200
    assert budget_verdict(approved, T0).action == "go"
    denied = _fold(*events, _answer(gate, 1, "deny"))
    v = budget_verdict(denied, T0)
    assert v.action == "fail" and v.message.endswith("(budget gate deny)")


def test_the_decision_is_the_same_for_every_reader() -> None:
    """A replica that folds the stored records (after a takeover) decides what the first one did."""
    events: list[ev.Event] = [
        _started(ev.Budget(max_total_tokens=60, max_cost_usd=0.00005)),
        _turn(),
        _step(0, Usage(input_tokens=30), 30),
        _step(1, Usage(input_tokens=30), 30),
    ]
    live = LoopHistory(loop_id=LOOP)
    for i, e in enumerate(events):
        live.apply(e, i + 1)
    again = _fold(*events)
    assert budget_verdict(live, T0) == budget_verdict(again, T0)
    assert budget_verdict(again, T0).limits == ("max_total_tokens", "max_cost_usd")


# --- the CLI options -----------------------------------------------------------------------------


def _args(**kw: object) -> argparse.Namespace:
    base = dict.fromkeys(("max_total_tokens", "max_cost_usd", "max_steps_per_turn", "max_turn_seconds", "on_budget"))
    return argparse.Namespace(**{**base, **kw})


def test_budget_options_change_only_what_they_name() -> None:
    assert budget_from_args(_args(), None) is None
    start = budget_from_args(_args(max_cost_usd=0.5), None)
    assert start == ev.Budget(max_cost_usd=0.5)
    assert budget_from_args(_args(on_budget="ask"), start) == ev.Budget(max_cost_usd=0.5, on_budget="ask")
    with pytest.raises(CliError):
        budget_from_args(_args(max_turn_seconds=float("nan")), None)
    with pytest.raises(CliError):
        budget_from_args(_args(max_total_tokens=-1), None)


def test_whole_number_limits_stop_at_the_documented_maximum() -> None:
    assert MAX_LIMIT_COUNT == 2**53 - 1  # docs/budgets.md and docs/protocol.md state it
    top = budget_from_args(_args(max_total_tokens=MAX_LIMIT_COUNT, max_steps_per_turn=MAX_LIMIT_COUNT), None)
    assert top == ev.Budget(max_total_tokens=MAX_LIMIT_COUNT, max_steps_per_turn=MAX_LIMIT_COUNT)
    for name in ("max_total_tokens", "max_steps_per_turn"):
        with pytest.raises(CliError, match=f"from 0 to {MAX_LIMIT_COUNT}"):
            budget_from_args(_args(**{name: MAX_LIMIT_COUNT + 1}), None)
    # An approved budget gate grants the amount again, but never past the maximum.
    assert top is not None and extended(top, top, Figures(tokens=MAX_LIMIT_COUNT)) == top


@pytest.mark.parametrize(
    ("cls", "fields"),
    [
        (ev.LoopStarted, {"budget": ev.Budget(max_total_tokens=MAX_LIMIT_COUNT + 1)}),
        (ev.LoopStarted, {"limits": ev.Limits(max_tokens=10**23)}),
        (ev.LoopStarted, {"context": ev.ContextPolicy(strategy="compact", window=MAX_LIMIT_COUNT + 1)}),
        (ev.BudgetChanged, {"budget": ev.Budget(max_steps_per_turn=2**64)}),
    ],
    ids=["budget", "limits", "context", "budget-changed"],
)
def test_an_event_built_with_a_limit_past_the_maximum_is_refused(
    cls: type[ev.Event], fields: dict[str, object]
) -> None:
    with pytest.raises(InvalidEventError) as info:
        validate_event(ev.make(cls, loop_id=LOOP, **fields))
    assert info.value.field == next(iter(fields))


@pytest.mark.parametrize(
    "argv",
    [
        ["start", "--model", "demo", "--max-total-tokens", "99999999999999999999999"],
        ["start", "--model", "demo", "--max-steps-per-turn", str(MAX_LIMIT_COUNT + 1)],
        ["start", "--model", "demo", "--max-tokens", str(2**64)],
        ["start", "--model", "demo", "--context", "compact", "--context-window", str(MAX_LIMIT_COUNT + 1)],
        ["budget", LOOP, "--max-total-tokens", "99999999999999999999999"],
        ["start", "--model", "demo", "--max-iterations", "1000001"],
    ],
    ids=["start-tokens", "start-steps", "start-max-tokens", "start-context", "budget", "start-iterations"],
)
def test_a_limit_option_past_the_maximum_is_one_error_line(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    # Refused before any connection is tried (the URL is unreachable on purpose).
    assert main(["--nats-url", "nats://127.0.0.1:1", *argv]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: --"), err
    high = MAX_LIMIT_VALUE if "--max-iterations" in argv else MAX_LIMIT_COUNT
    assert f"to {high}, got {argv[-1]}" in err


def test_the_documented_price_table_is_the_code() -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "budgets.md").read_text()
    rows: dict[str, tuple[float, ...]] = {}
    for line in doc.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 5 and cells[0].startswith("`") and cells[1][:1].isdigit():
            figures = tuple(float(c) if c != "—" else 0.0 for c in cells[1:])
            for name in re.findall(r"`([^`]+)`", cells[0]):
                rows[name] = figures
    prices = {k: (p.input, p.output, p.cache_read, p.cache_write) for k, p in PRICES.items()}
    test = (TEST_PRICE.input, TEST_PRICE.output, TEST_PRICE.cache_read, TEST_PRICE.cache_write)
    assert rows.pop("demo") == test
    assert rows.pop("scripted:") == test
    assert rows == prices


def test_the_console_shows_cost_and_budget() -> None:
    s = LoopSummary(loop_id=LOOP)
    s.apply(_started(ev.Budget(max_cost_usd=0.5)), 1)
    s.apply(_turn(), 2)
    s.apply(_step(0, Usage(input_tokens=10), 1234), 3)
    s.apply(ev.make(ev.BudgetChanged, loop_id=LOOP, budget=ev.Budget(max_steps_per_turn=4, on_budget="ask")), 4)
    doc = s.to_json()
    assert doc["cost_usd"] == 0.001234
    assert doc["budget"] == {"max_steps_per_turn": 4, "on_budget": "ask"}
