"""Commands that would do nothing say so: an unknown loop for ``tail`` and ``gates``, an ``interrupt``
with no turn running, a second ``close``: one ``error:`` line, exit 1, nothing written. And the short
ids every table shows name gates as they name loops; ``send LOOP -`` reads the text from stdin.

Against ``loopwire up`` (every service its own process), the commands as subprocesses.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid

import pytest

from services.cli.errors import CliError
from services.cli.gatecmds import _pick_gate
from tests.integration import test_cli
from tests.integration.test_cli import Up

up = test_cli.up  # the same stack fixture, started for this module


def one_line(done: subprocess.CompletedProcess[str], code: int = 1) -> str:
    assert done.returncode == code, (done.returncode, done.stdout, done.stderr)
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in done.stderr, done.stderr
    return lines[0]


def records(up: Up, loop: str) -> list[str]:
    done = up.run("history", loop, "--json")
    assert done.returncode == 0, done.stderr
    return [json.loads(line)["event"]["type"] for line in done.stdout.splitlines()]


def test_tail_and_gates_of_an_unknown_loop_say_so(up: Up) -> None:
    unknown = str(uuid.uuid4())
    for args in (["tail", unknown], ["tail", unknown, "--new"], ["gates", unknown]):
        started = time.monotonic()
        line = one_line(up.run(*args, timeout=30))  # not a silent follow for ever
        assert line == f"error: LOOP: no loop {unknown} (never started; loopwire loops lists them)", args
        assert time.monotonic() - started < 15
    known = up.run("start").stdout.strip()
    assert up.run("gates", known).stdout.strip() == "no open gates"


def test_interrupt_with_no_turn_and_a_second_close_are_refused(up: Up) -> None:
    loop = up.run("start").stdout.strip()
    assert up.run("send", loop, "what is 2+2?", "--wait").returncode == 0
    before = records(up, loop)
    line = one_line(up.run("interrupt", loop))
    assert line.startswith("error: conflict: no turn is running (the loop is idle): nothing to interrupt"), line
    assert records(up, loop) == before  # nothing written
    closed = up.run("close", loop)
    assert closed.returncode == 0 and "(seq " in closed.stdout
    after = records(up, loop)
    assert after == [*before, "LoopClosed"]
    line = one_line(up.run("close", loop))
    assert line.startswith("error: closed: the loop is closed already (at seq "), line
    line = one_line(up.run("interrupt", loop, "--json"))
    assert line.startswith("error: closed: the loop is closed (at seq "), line
    assert records(up, loop) == after


def _open_gate(up: Up, loop: str) -> str:
    deadline = time.monotonic() + 30
    while True:
        done = up.run("gates", loop, "--json")
        assert done.returncode == 0, done.stderr
        if done.stdout.strip():
            gate_id: str = json.loads(done.stdout.splitlines()[0])["gate_id"]
            return gate_id
        assert time.monotonic() < deadline, "no gate opened"
        time.sleep(0.2)


def test_a_gate_is_named_by_a_unique_prefix_in_any_case(up: Up) -> None:
    loop = up.run("start", "--policy", "calculator=ask").stdout.strip()
    assert up.run("send", loop, "what is 2+3?").returncode == 0
    gate = _open_gate(up, loop)
    done = up.run("approve", gate[:8].upper())  # as tables show it, found by scanning the loops
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().startswith(f"gate {gate} of loop {loop}: approve")
    assert up.run("send", loop, "what is 4+5?").returncode == 0
    second = _open_gate(up, loop)
    done = up.run("deny", second[:5], "--loop", loop[:8], "--reason", "no")  # within the given loop
    assert done.returncode == 0 and f"gate {second} of loop {loop}: deny" in done.stdout, done.stderr
    # A closed gate's prefix reaches the committer, which says it is closed; a prefix of none is named.
    assert one_line(up.run("approve", gate[:8])).startswith(f"error: closed: gate {gate} is no longer open")
    nothing = "0000" if not gate.startswith("0000") else "ffff"
    assert one_line(up.run("approve", nothing, "--loop", loop)) == (
        f"error: GATE: no gate id starts with {nothing!r} (loopwire gates lists them)"
    )
    assert one_line(up.run("approve", "xyz!")).startswith("error: GATE must be a gate id or the start of one")


def test_an_ambiguous_gate_prefix_is_said_to_be_one() -> None:
    a, b = "8a3a84a0-0000-4000-8000-000000000001", "8a3a84a0-0000-4000-8000-000000000002"
    with pytest.raises(CliError, match=r"^GATE: 2 gate ids start with '8a3a' \(8a3a84a0, 8a3a84a0\): give more of it$"):
        _pick_gate("8a3a", {a: "l1", b: "l2"}, {})
    # An open gate is chosen over closed ones that share the prefix; none open: a closed one.
    assert _pick_gate("8a3a", {a: "l1"}, {b: "l2"}) == ("l1", a)
    assert _pick_gate("8a3a84a0-0000-4000-8000-000000000002", {a: "l1"}, {b: "l2"}) == ("l2", b)


def test_send_dash_reads_the_text_from_standard_input(up: Up) -> None:
    loop = up.run("start").stdout.strip()
    env = {**os.environ, "LW_NATS_URL": up.url}
    text = "what is 6*7?\n"
    done = subprocess.run(
        [test_cli.LOOPWIRE, "send", loop, "-", "--wait"],
        input=text,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0 and done.stdout.strip().endswith("6*7 = 42"), done.stderr
    history = up.run("history", loop, "--json").stdout.splitlines()
    submitted = next(json.loads(x)["event"] for x in history if '"InputSubmitted"' in x)
    assert submitted["message"]["blocks"][0]["text"] == "what is 6*7?"
    empty = subprocess.run(
        [test_cli.LOOPWIRE, "send", loop, "-"], input=" \n", env=env, capture_output=True, text=True, timeout=60
    )
    assert one_line(empty) == "error: TEXT must not be empty (standard input held none)"
