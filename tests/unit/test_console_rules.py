"""The console's derivations from committed events (state, gates, paging, cutting) and its request checks."""

from __future__ import annotations

import uuid

import pytest

from services.console import rules
from services.console.rules import LoopSummary
from services.console.service import check_binding
from shared.content import Usage, ai_text, user_text
from shared.events import (
    Cause,
    Event,
    Gate,
    GateOpened,
    GateResolved,
    InputSubmitted,
    LoopClosed,
    LoopIdle,
    LoopStarted,
    PermissionRequest,
    PermissionRequested,
    StepDone,
    TurnDone,
    TurnError,
    TurnFailed,
    TurnInterrupted,
    TurnStarted,
    UserInputRequested,
    make,
)


def uid() -> str:
    return str(uuid.uuid4())


class Loop:
    """Builds a loop's records with increasing sequences and folds them into a summary."""

    def __init__(self, seq: int = 0) -> None:
        self.loop_id = uid()
        self.seq = seq
        self.s = LoopSummary(loop_id=self.loop_id)
        self.turn = ""
        self.inputs: list[str] = []  # command ids of inputs no turn has taken yet
        self.add(make(LoopStarted, loop_id=self.loop_id, model="demo", cause=Cause(command_id=uid())))

    def add(self, e: Event, gap: int = 1) -> int:
        self.seq += gap
        self.s.apply(e, self.seq)
        return self.seq

    def send(self, text: str) -> None:
        self.inputs.append(uid())
        cause = Cause(command_id=self.inputs[-1])
        self.add(make(InputSubmitted, loop_id=self.loop_id, message=user_text(text), cause=cause))

    def start_turn(self, index: int = 1) -> None:
        # As the model-step does: the turn takes the first waiting input (its command id).
        self.turn = uid()
        cause = Cause(command_id=self.inputs.pop(0)) if self.inputs else None
        self.add(
            make(
                TurnStarted,
                loop_id=self.loop_id,
                turn_id=self.turn,
                turn_index=index,
                message=user_text("x"),
                cause=cause,
            )
        )

    def step(self, usage: Usage | None = None) -> None:
        self.add(
            make(StepDone, loop_id=self.loop_id, turn_id=self.turn, step_id=uid(), messages=[ai_text("ok", usage)])
        )

    def gate(self, *, question: bool = False, text_first: bool = False) -> str:
        gid, step, ex = uid(), uid(), uid()
        common = {"loop_id": self.loop_id, "turn_id": self.turn, "step_id": step, "tool_execution_id": ex}
        kind = "user_input" if question else "permission"
        opened = make(GateOpened, **common, gate=Gate(id=gid, kind=kind, controls=["approve"], tool_name="calculator"))
        if question:
            asked: Event = make(UserInputRequested, **common, gate_id=gid, question="which?", choices=["a", "b"])
        else:
            req = PermissionRequest(gate_id=gid, tool_name="calculator", summary="calculator 1+1")
            asked = make(PermissionRequested, **common, request=req)
        for e in (asked, opened) if text_first else (opened, asked):
            self.add(e)
        return gid

    def resolve(self, gate_id: str, action: str = "approve", resolver: str = "alice") -> None:
        self.add(
            make(
                GateResolved,
                loop_id=self.loop_id,
                turn_id=self.turn,
                step_id=uid(),
                gate_id=gate_id,
                action=action,
                resolver=resolver,
            )
        )


def test_states_follow_the_loop_through_its_life() -> None:
    lp = Loop()
    assert lp.s.state == "idle" and lp.s.model == "demo" and lp.s.turns == 0
    lp.send("what is 2+2?")
    assert lp.s.state == "running" and lp.s.title == "what is 2+2?"
    lp.start_turn()
    g = lp.gate()
    assert lp.s.state == "waiting"
    assert [v.gate_id for v in lp.s.open_gates] == [g]
    lp.resolve(g)
    assert lp.s.state == "running" and lp.s.open_gates == []
    lp.step(Usage(input_tokens=10, output_tokens=4))
    lp.step(Usage(input_tokens=3, output_tokens=2))
    lp.add(make(TurnDone, loop_id=lp.loop_id, turn_id=lp.turn, turn_index=1, usage=Usage(input_tokens=999)))
    lp.add(make(LoopIdle, loop_id=lp.loop_id))
    # Tokens come from the steps only (TurnDone's usage is their sum, never added again).
    assert (lp.s.state, lp.s.turns, lp.s.input_tokens, lp.s.output_tokens, lp.s.tokens) == ("idle", 1, 13, 6, 19)
    lp.send("again")
    lp.start_turn(2)
    failed = make(
        TurnFailed, loop_id=lp.loop_id, turn_id=lp.turn, turn_index=2, err=TurnError(kind="model_error", message="x")
    )
    lp.add(failed)
    assert lp.s.state == "failed" and lp.s.last_error == "model_error: x"
    assert lp.s.title == "what is 2+2?" and lp.s.last_input == "again"
    lp.add(make(LoopClosed, loop_id=lp.loop_id))
    assert lp.s.state == "closed"


def test_gate_of_an_ended_turn_is_not_open_and_texts_come_in_either_order() -> None:
    lp = Loop()
    lp.send("q")
    lp.start_turn()
    g1 = lp.gate(text_first=True)
    g2 = lp.gate(question=True)
    views = {v.gate_id: v for v in lp.s.open_gates}
    assert views[g1].text == "calculator 1+1" and views[g1].choices == []
    assert views[g2].text == "which?" and views[g2].choices == ["a", "b"] and views[g2].kind == "user_input"
    lp.add(make(TurnInterrupted, loop_id=lp.loop_id, turn_id=lp.turn, turn_index=1, reason="interrupted"))
    assert lp.s.open_gates == [] and lp.s.state == "idle"
    assert "no longer open" in rules.already_answered(lp.s.gates[g1])


def test_already_answered_names_who_and_when_and_the_first_answer_wins() -> None:
    lp = Loop()
    lp.send("q")
    lp.start_turn()
    g = lp.gate()
    lp.resolve(g, "approve", "alice")
    lp.resolve(g, "deny", "bob")  # never committed in practice; the fold keeps the first anyway
    gv = lp.s.gates[g]
    assert (gv.action, gv.resolver) == ("approve", "alice")
    text = rules.already_answered(gv)
    assert text.startswith(f"gate {g} was already answered: approve by alice at ")
    assert gv.resolved_at in text
    assert rules.gate_json(gv)["resolver"] == "alice" and rules.gate_json(gv)["note"] == text
    assert [g["gate_id"] for g in lp.s.to_json()["resolved_gates"]] == [g]
    assert rules.resolved_gates([lp.s]) == [gv]


def test_records_at_or_below_the_last_sequence_are_ignored() -> None:
    lp = Loop(seq=10)
    before = (lp.s.last_seq, list(lp.s.seqs))
    assert not lp.s.apply(make(LoopClosed, loop_id=lp.loop_id), 11)
    assert (lp.s.last_seq, lp.s.seqs, lp.s.closed) == (*before, False)


def test_timeline_pages_by_sequence() -> None:
    lp = Loop()
    lp.start_turn()
    for _ in range(20):
        lp.add(make(StepDone, loop_id=lp.loop_id, turn_id=lp.turn, step_id=uid(), messages=[ai_text("s")]), gap=3)
    seqs = lp.s.seqs
    assert len(seqs) == 22
    assert lp.s.seqs_before(0, 5) == seqs[-5:]
    assert lp.s.seqs_before(seqs[-5], 5) == seqs[-10:-5]
    assert lp.s.seqs_before(seqs[-5] - 1, 5) == seqs[-10:-5]  # a sequence of another loop works too
    assert lp.s.seqs_before(seqs[2], 5) == seqs[:2]
    assert lp.s.seqs_before(1, 5) == []


def test_select_filters_sorts_and_pages() -> None:
    loops = []
    for k in range(7):
        lp = Loop(seq=k * 100)
        lp.send(f"question number {k}")
        if k % 2:
            lp.start_turn()
            lp.step()
            lp.add(make(TurnDone, loop_id=lp.loop_id, turn_id=lp.turn, turn_index=1))
        lp.s.last_activity = f"2026-01-01T00:00:0{k}Z"
        loops.append(lp.s)
    page = rules.select(loops, size=3)
    assert (page.total, page.pages, page.page) == (7, 3, 1)
    assert [s.loop_id for s in page.items] == [loops[6].loop_id, loops[5].loop_id, loops[4].loop_id]
    assert [s.loop_id for s in rules.select(loops, size=3, page=99).items] == [loops[0].loop_id]  # clamped
    assert {s.loop_id for s in rules.select(loops, state="idle").items} == {loops[k].loop_id for k in (1, 3, 5)}
    assert [s.loop_id for s in rules.select(loops, text="NUMBER 4").items] == [loops[4].loop_id]
    assert [s.loop_id for s in rules.select(loops, text=loops[2].loop_id[:8]).items] == [loops[2].loop_id]
    assert rules.select(loops, state="closed").total == 0
    assert rules.count_states(loops) == {"running": 4, "waiting": 0, "idle": 3, "failed": 0, "closed": 0, "forming": 0}


def test_open_gates_across_loops_newest_first() -> None:
    a, b = Loop(), Loop(seq=50)
    for lp in (a, b):
        lp.send("q")
        lp.start_turn()
    g1 = a.gate()
    g2 = b.gate()
    g3 = a.gate()
    assert [g.gate_id for g in rules.open_gates([a.s, b.s])] == [g2, g3, g1]


def test_cut_strings_shortens_long_strings_anywhere() -> None:
    short = {"a": "x" * 20, "b": [1, None, {"c": "y"}], "t": True}
    assert rules.cut_strings(short, 20) == (short, False)
    doc = {"a": "x" * 10, "b": [{"c": "y" * 30}], "n": 5}
    out, cut = rules.cut_strings(doc, 20)
    assert cut
    assert out == {"a": "x" * 10, "b": [{"c": "y" * 20 + "… [10 more characters]"}], "n": 5}
    assert doc["b"] == [{"c": "y" * 30}]  # the input is left alone


@pytest.mark.parametrize(
    ("origin", "host", "site", "ok"),
    [
        (None, "127.0.0.1:8080", None, True),  # curl, scripts
        ("http://127.0.0.1:8080", "127.0.0.1:8080", "same-origin", True),
        ("http://127.0.0.1:8080", "127.0.0.1:8080", None, True),
        ("http://evil.example", "127.0.0.1:8080", None, False),
        ("http://127.0.0.1:9999", "127.0.0.1:8080", None, False),
        ("null", "127.0.0.1:8080", None, False),
        (None, "127.0.0.1:8080", "cross-site", False),
        (None, "127.0.0.1:8080", "same-site", False),
        ("http://127.0.0.1:8080", None, None, False),
    ],
)
def test_same_origin(origin: str | None, host: str | None, site: str | None, ok: bool) -> None:
    assert rules.same_origin(origin, host, site) is ok


def test_token_and_binding_checks() -> None:
    assert rules.token_ok("", None) and rules.token_ok("", "anything")
    assert rules.token_ok("s3cret", "s3cret")
    assert not rules.token_ok("s3cret", None) and not rules.token_ok("s3cret", "s3cre") and not rules.token_ok("s", "")
    assert check_binding("127.0.0.1", "") is None and check_binding("localhost", "") is None
    assert check_binding("::1", "") is None
    assert "needs a token" in (check_binding("0.0.0.0", "") or "")
    assert check_binding("0.0.0.0", "t") is None


@pytest.mark.parametrize(
    ("host", "token", "ok"),
    [
        ("127.0.0.1:8080", "", True),
        ("localhost:8080", "", True),
        ("[::1]:8080", "", True),
        ("127.0.0.1", "", True),
        ("evil.example:8080", "", False),  # a rebound name
        (None, "", False),
        ("evil.example:8080", "t", True),  # with a token, the token decides
    ],
)
def test_without_a_token_only_loopback_hosts_are_served(host: str | None, token: str, ok: bool) -> None:
    assert rules.host_allowed(host, token) is ok
