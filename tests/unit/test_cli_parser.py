"""The ``loopwire`` command line without NATS: parsing, --help everywhere, local errors, rendering."""

from __future__ import annotations

import argparse
import io
import uuid

import pytest
from rich.console import Console

from services import embedded
from services.cli import build_parser, main, stack
from services.cli.errors import CliError
from services.cli.live import LoopView
from services.cli.policyopts import parse_policy, parse_retries
from services.cli.render import describe, event_json
from services.cli.toolcmds import safety_of
from services.toolwire.spec import ToolSpec
from shared.content import AIMessage, TextBlock, ToolUseBlock, tool_result, user_text
from shared.events import (
    EVENT_TYPES,
    Chunk,
    Event,
    Gate,
    GateOpened,
    GateResolved,
    InputSubmitted,
    LoopClosed,
    LoopStarted,
    PermissionRequest,
    PermissionRequested,
    RetryPolicy,
    StepDone,
    TokenDelta,
    ToolCallCompleted,
    ToolCallProgress,
    ToolCallStarted,
    TurnDone,
    TurnFoldedInto,
    TurnStarted,
    UserInputRequested,
)
from shared.turns import TurnTracker, answer_text


def _subcommands(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out.append((*prefix, name))
                out.extend(_subcommands(sub, (*prefix, name)))
    return out


COMMANDS = _subcommands(build_parser())


def test_every_issue_command_exists() -> None:
    names = {c[0] for c in COMMANDS}
    wanted = {"demo", "up", "serve", "start", "send", "history", "tail", "loops", "gates", "approve", "deny"}
    wanted |= {"reply", "interrupt", "tools", "schema"}
    assert wanted <= names
    assert {("serve", "committer"), ("serve", "model-step"), ("serve", "tool")} <= set(COMMANDS)


@pytest.mark.parametrize("command", [(), *COMMANDS], ids=lambda c: " ".join(c) or "loopwire")
def test_every_command_has_help(command: tuple[str, ...], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args([*command, "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: {' '.join(('loopwire', *command))}")


def test_connection_options_go_before_or_after_the_command() -> None:
    p = build_parser()
    a = p.parse_args(["--nats-url", "nats://a:1", "--prefix", "x", "loops"])
    b = p.parse_args(["loops", "--nats-url", "nats://a:1", "--prefix", "x"])
    assert (a.nats_url, a.prefix) == (b.nats_url, b.prefix) == ("nats://a:1", "x")


def test_start_options() -> None:
    a = build_parser().parse_args(
        ["start", "--model", "demo", "--policy", "calculator=ask", "--policy", "*=deny", "--tools", "a,b", "--json"]
    )
    assert a.model == "demo" and a.policy == ["calculator=ask", "*=deny"] and a.tools == "a,b" and a.json
    assert parse_policy(a.policy) == {"calculator": "ask", "*": "deny"}
    for bad in (["calculator"], ["calculator=maybe"], ["=allow"]):
        with pytest.raises(CliError, match="--policy wants"):
            parse_policy(bad)


def test_start_durability_options() -> None:
    a = build_parser().parse_args(
        ["start", "--on-unknown", "ask", "--retry", "http_get=5", "--retry", "kv_memory=2:0.1:1"]
    )
    assert a.on_unknown == "ask"
    assert parse_retries(a.retry) == {
        "http_get": RetryPolicy(max_attempts=5, initial_backoff_seconds=0.2, max_backoff_seconds=2.0),
        "kv_memory": RetryPolicy(max_attempts=2, initial_backoff_seconds=0.1, max_backoff_seconds=1.0),
    }
    for bad in (["x"], ["x=0"], ["x=2:3:1"], ["bad name=2"], ["x=two"], ["x=1:2:3:4"]):
        with pytest.raises(CliError, match="--retry wants"):
            parse_retries(bad)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["start", "--on-unknown", "maybe"])


def test_tools_safety_column() -> None:
    assert safety_of(ToolSpec(name="t")) == "-"
    assert safety_of(ToolSpec(name="t", read_only=True, open_world=True)) == "read-only, open-world"
    assert safety_of(ToolSpec(name="t", idempotent=True, destructive=True)) == "idempotent, destructive"


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["serve", "tool"], ["send", "only-loop"], ["nonsense"], ["history"]):
        with pytest.raises(SystemExit) as exc:
            build_parser().parse_args(argv)
        assert exc.value.code == 2
    capsys.readouterr()


LOOP_REF = "a loop id or the start of one (4+ of 0-9 a-f)"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["history", "not-a-uuid"], f"error: LOOP must be {LOOP_REF}, got 'not-a-uuid'"),
        (["send", "NOPE", "hi"], f"error: LOOP must be {LOOP_REF}, got 'NOPE'"),
        (["approve", "x"], "error: GATE must be a gate id or the start of one (4+ of 0-9 a-f), got 'x'"),
        (["start", "--policy", "clock"], "error: --policy wants TOOL=allow|deny|ask (TOOL may be *), got 'clock'"),
        (["schema", "--check"], "error: --check needs --out and/or --asyncapi"),
        (["verify"], "error: give LOOP or --all (not both)"),
        (["verify", "abcd", "--all"], "error: give LOOP or --all (not both)"),
        (["verify", "xyz"], f"error: LOOP must be {LOOP_REF}, got 'xyz'"),
    ],
)
def test_local_errors_are_one_line(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    # These fail before any connection is tried (the URL is unreachable on purpose).
    assert main(["--nats-url", "nats://127.0.0.1:1", *argv]) == 1
    err = capsys.readouterr().err
    assert err == message + "\n"


def test_bad_environment_is_a_one_line_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("LW_REPLICAS", "2")
    assert main(["loops"]) == 1
    assert capsys.readouterr().err == "error: LW_REPLICAS must be 1 or 3, got 2\n"


def test_builtin_tool_list_matches_the_registry() -> None:
    from services.tools.builtins import BUILTINS

    assert set(embedded.BUILTIN_TOOLS) == set(BUILTINS)
    assert build_parser().parse_args(["demo"]).prompt == "what is 17*23 and what time is it in Tokyo?"


def test_demo_tool_list_is_checked() -> None:
    with pytest.raises(CliError, match="unknown built-in tool"):
        stack._tool_list("calculator,nope")
    assert stack._tool_list("clock, calculator") == ["clock", "calculator"]


# --- rendering ----------------------------------------------------------------------------------

LOOP, TURN, STEP, EXE = (str(uuid.uuid4()) for _ in range(4))


def _samples() -> list[Event]:
    ai = AIMessage(
        blocks=[TextBlock(text="[demo] Let me use calculator."), ToolUseBlock(id="t1", name="calculator")],
    )
    return [
        LoopStarted(loop_id=LOOP, model="demo", policy={"calculator": "ask"}),
        InputSubmitted(loop_id=LOOP, message=user_text("what is 17*23?")),
        TurnStarted(loop_id=LOOP, turn_id=TURN, turn_index=1, message=user_text("what is 17*23?")),
        TokenDelta(loop_id=LOOP, turn_id=TURN, step_id=STEP, chunk=Chunk(kind="text", text="[demo] Let ")),
        TokenDelta(loop_id=LOOP, turn_id=TURN, step_id=STEP, chunk=Chunk(kind="text", text="me use calculator.")),
        TokenDelta(loop_id=LOOP, turn_id=TURN, step_id=STEP, chunk=Chunk(kind="tool_use", name="calculator")),
        PermissionRequested(
            loop_id=LOOP,
            turn_id=TURN,
            step_id=STEP,
            tool_execution_id=EXE,
            request=PermissionRequest(gate_id=EXE, tool_name="calculator", summary='calculator {"expression"}'),
        ),
        GateOpened(loop_id=LOOP, turn_id=TURN, step_id=STEP, gate=Gate(id=EXE, kind="permission")),
        GateResolved(loop_id=LOOP, turn_id=TURN, step_id=STEP, gate_id=EXE, action="approve", resolver="operator"),
        ToolCallStarted(
            loop_id=LOOP,
            turn_id=TURN,
            step_id=STEP,
            tool_execution_id=EXE,
            tool_name="calculator",
            summary="calc 17*23",
        ),
        ToolCallCompleted(
            loop_id=LOOP, turn_id=TURN, step_id=STEP, tool_execution_id=EXE, result_preview="391", duration_ms=3
        ),
        StepDone(loop_id=LOOP, turn_id=TURN, step_id=STEP, messages=[ai, tool_result("t1", "391")]),
        TurnDone(loop_id=LOOP, turn_id=TURN, turn_index=1, message=AIMessage(blocks=[TextBlock(text="It is 391.")])),
    ]


def test_describe_says_something_for_every_event_type() -> None:
    samples = {type(e).__name__: e for e in _samples()}
    samples["UserInputRequested"] = UserInputRequested(gate_id="g", question="colour?", choices=["red", "blue"])
    samples["ToolCallProgress"] = ToolCallProgress(loop_id=LOOP, message="running for 2s")
    for name, cls in EVENT_TYPES.items():
        event = samples.get(name, cls(loop_id=LOOP))
        text = describe(event)
        assert isinstance(text, str)
        if name not in ("LoopIdle", "LoopClosed"):
            assert text, name
        assert '"type":"' + name + '"' in event_json(event, 7)
    assert "colour? [red, blue]" in describe(samples["UserInputRequested"])
    multi = describe(samples["StepDone"], multiline=True).splitlines()
    assert multi == ["assistant: [demo] Let me use calculator.", "  → calculator {}", "  ← t1: 391"]
    assert answer_text(_samples()) == "It is 391."


def test_live_view_plain_lines_stream_text_and_tools() -> None:
    buf = io.StringIO()
    view = LoopView(Console(file=buf), plain=True)
    with view:
        for e in _samples():
            view.apply(e, 5 if isinstance(e, StepDone | TurnDone) else None)
    lines = buf.getvalue().splitlines()
    assert lines[0] == "model  | [demo] Let me use calculator."  # the tokens, joined on one line
    assert "tool   | calc 17*23 started" in lines
    assert "tool   | calculator ok in 3 ms: 391" in lines
    assert "commit | step 1 committed at seq 5 with 1 tool result(s)" in lines
    assert any(line.startswith("gate   | gate ") and "loopwire approve" in line for line in lines)
    assert lines[-1].startswith("turn   | turn done in ")


def test_live_view_rich_render_shows_tools_and_text() -> None:
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, width=100, color_system=None)
    view = LoopView(console)
    assert not view.plain
    with view:
        for e in _samples():
            view.apply(e, 5 if isinstance(e, StepDone | TurnDone) else None)
    out = buf.getvalue()
    assert "[demo] Let me use calculator." in out
    assert "calc 17*23" in out and "391" in out and "3 ms" in out
    assert "turn done in" in out


def test_turn_tracker_follows_the_turn_that_consumed_the_input() -> None:
    from shared.events import Cause, TurnInterrupted

    cmd, other = str(uuid.uuid4()), str(uuid.uuid4())
    t = TurnTracker(LOOP, cmd)
    assert t.feed(TurnStarted(loop_id=LOOP, turn_id=TURN, cause=Cause(command_id=other)), 3) is None
    other_turn = str(uuid.uuid4())
    assert t.feed(TurnFoldedInto(loop_id=LOOP, turn_id=TURN, cause=Cause(command_id=cmd)), 4) is None
    assert t.turn_id == TURN
    assert t.feed(TurnDone(loop_id=LOOP, turn_id=other_turn), 5) is None  # another turn ends: not ours
    done = t.feed(TurnInterrupted(loop_id=LOOP, turn_id=TURN, reason="interrupted"), 6)
    assert done is not None and done.outcome == "interrupted" and done.seq == 6
    closed = TurnTracker(LOOP, cmd).feed(LoopClosed(loop_id=LOOP), 9)
    assert closed is not None and closed.outcome == "closed"


@pytest.mark.parametrize("at", ["x", "-1", "0", "1.5", "²", "99999999999999999999"])
def test_a_bad_fork_point_is_one_clear_line(at: str, capsys: pytest.CaptureFixture[str]) -> None:
    # Checked before anything connects: no server is needed for the answer.
    code = main(["--nats-url", "nats://127.0.0.1:9", "fork", str(uuid.uuid4()), "--at", at])
    err = capsys.readouterr().err
    assert code == 1
    assert (
        err
        == f"error: --at wants a stream sequence of LOOP (a whole number from 1; see loopwire history), got {at!r}\n"
    )
