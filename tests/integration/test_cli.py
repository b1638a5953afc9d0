"""``loopwire up`` in one process, the client commands from others: the documented workflow, end to end.

The stack is started exactly as a developer would (``loopwire up``, every service its own process);
commands run as subprocesses of the console script where the process boundary matters (exit codes,
stdout/stderr, Ctrl-C) and in-process through ``main()`` elsewhere, to keep the suite fast.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from services.cli import main
from tests.syshelpers import TOOL_TURN_HISTORY


def marked_pids(marker: str) -> list[int]:
    """Processes (of this user) whose environment carries ``LW_TEST_MARKER=<marker>``."""
    needle = f"LW_TEST_MARKER={marker}".encode()
    found = []
    for d in Path("/proc").glob("[0-9]*"):
        try:
            if needle in (d / "environ").read_bytes():
                found.append(int(d.name))
        except OSError:
            continue
    return found


def wait_gone(marker: str, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while (left := marked_pids(marker)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not left, f"processes left behind: {left}"


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


LOOPWIRE = shutil.which("loopwire", path=str(Path(sys.executable).parent)) or "loopwire"
PROMPT = "what is 17*23 and what time is it in Tokyo?"


class Up:
    def __init__(self, proc: subprocess.Popen[str], url: str, marker: str, output: list[str]) -> None:
        self.proc = proc
        self.url = url
        self.marker = marker
        self.output = output

    def run(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """The console script in its own process, pointed at this stack through the environment."""
        env = {**os.environ, "LW_NATS_URL": self.url, "COLUMNS": "200"}
        return subprocess.run([LOOPWIRE, *args], env=env, capture_output=True, text=True, timeout=timeout)

    def popen(self, *args: str) -> subprocess.Popen[str]:
        env = {**os.environ, "LW_NATS_URL": self.url, "PYTHONUNBUFFERED": "1"}
        return subprocess.Popen(
            [LOOPWIRE, *args],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )

    def main(self, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
        """``loopwire ARGS`` in this process."""
        capsys.readouterr()
        code = main(["--nats-url", self.url, *args])
        out = capsys.readouterr()
        return code, out.out, out.err

    def records(self, capsys: pytest.CaptureFixture[str], loop: str) -> list[dict[str, Any]]:
        code, out, err = self.main(capsys, "history", loop, "--json")
        assert code == 0, err
        return [json.loads(line) for line in out.splitlines()]

    def wait_for(
        self, capsys: pytest.CaptureFixture[str], loop: str, done: Callable[[list[dict[str, Any]]], bool]
    ) -> list[dict[str, Any]]:
        deadline = time.monotonic() + 20
        while True:
            recs = self.records(capsys, loop)
            if done(recs):
                return recs
            assert time.monotonic() < deadline, [r["event"]["type"] for r in recs]
            time.sleep(0.1)


def types(recs: list[dict[str, Any]]) -> list[str]:
    return [r["event"]["type"] for r in recs]


def turns_done(n: int) -> Callable[[list[dict[str, Any]]], bool]:
    return lambda recs: types(recs).count("TurnDone") >= n


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    data = tmp_path_factory.mktemp("up")
    marker = uuid.uuid4().hex
    env = {**os.environ, "LW_TEST_MARKER": marker, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [LOOPWIRE, "up", "--port", "0", "--console-port", "0", "--data-dir", str(data)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    output: list[str] = []
    ready = threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            output.append(line)
            if line.startswith("Ctrl-C stops everything"):
                ready.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert ready.wait(60), "".join(output)
        url = next(m.group(1) for line in output if (m := re.match(r"NATS URL: (\S+)", line)))
        yield Up(proc, url, marker, output)
    finally:
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=30)
        reader.join(5)
    # Ctrl-C stops everything: exit 0, no process left, the port closed.
    assert code == 0, "".join(output)
    assert output[-1].strip() == "stopped"
    wait_gone(marker)
    assert not port_open(int(url.rsplit(":", 1)[1]))


def test_up_prints_what_to_do(up: Up) -> None:
    text = "".join(up.output)
    assert f"export LW_NATS_URL={up.url}" in text
    assert "loopwire send $LOOP" in text and "loopwire approve GATE" in text
    # up, nats-server, committer, model-step, 8 tools, console
    assert len(marked_pids(up.marker)) == 1 + 1 + 1 + 1 + 8 + 1
    console = re.search(r"^console:  (http://127\.0\.0\.1:\d+/)$", text, re.M)
    assert console, text
    assert httpx.get(console.group(1) + "api/loops").json()["ok"] is True
    # Every service serves /metrics, and up prints where.
    metrics = dict(re.findall(r"([a-z-]+): (http://127\.0\.0\.1:\d+/metrics)$", text, re.M))
    assert {"committer", "model-step", "tool-calculator", "console"} <= set(metrics), text
    for url in metrics.values():
        assert "loopwire_steps_committed_total" in httpx.get(url).text


def test_start_send_wait_history(up: Up, capsys: pytest.CaptureFixture[str]) -> None:
    started = up.run("start")
    assert started.returncode == 0, started.stderr
    loop = started.stdout.strip()
    assert re.fullmatch(r"[0-9a-f-]{36}", loop)

    sent = up.run("send", loop, PROMPT, "--wait")
    assert sent.returncode == 0, sent.stderr
    assert "17*23 = 391" in sent.stdout and "Asia/Tokyo" in sent.stdout

    recs = up.records(capsys, loop)
    kinds = types(recs)
    assert kinds == TOOL_TURN_HISTORY
    seqs = [r["seq"] for r in recs]
    assert seqs == sorted(seqs)

    code, out, _ = up.main(capsys, "history", loop, "--json", "--from", str(seqs[3]))
    assert code == 0 and types([json.loads(x) for x in out.splitlines()]) == kinds[3:]

    table = up.run("history", loop)
    assert table.returncode == 0
    for word in ("LoopStarted", "StepDone", "→ calculator", "← toolu_demo_1: 391", "TurnDone"):
        assert word in table.stdout

    code, out, _ = up.main(capsys, "loops", "--json")
    rows = {r["loop_id"]: r for r in map(json.loads, out.splitlines())}
    assert rows[loop]["state"] == "idle" and rows[loop]["turns"] == 1 and rows[loop]["model"] == "demo"

    code, out, _ = up.main(capsys, "tools", "--json")
    tools = {t["name"]: t for t in map(json.loads, out.splitlines())}
    assert tools["calculator"]["replicas"] == 1
    assert tools["calculator"]["input_schema"]["properties"]["expression"]["type"] == "string"
    assert tools["ask_user"]["kind"] == "user_input"
    assert len(tools) == 8


def _open_gate(up: Up, capsys: pytest.CaptureFixture[str], loop: str) -> dict[str, Any]:
    deadline = time.monotonic() + 20
    while True:
        code, out, err = up.main(capsys, "gates", loop, "--json")
        assert code == 0, err
        gates = [json.loads(line) for line in out.splitlines()]
        if gates:
            assert len(gates) == 1
            return gates[0]
        assert time.monotonic() < deadline
        time.sleep(0.1)


def test_permission_gates_approve_deny_always(up: Up, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = up.main(capsys, "start", "--policy", "calculator=ask", "--json")
    loop = json.loads(out)["loop_id"]

    up.main(capsys, "send", loop, "what is 2+3?")
    gate = _open_gate(up, capsys, loop)
    assert (gate["kind"], gate["tool"], gate["loop_id"]) == ("permission", "calculator", loop)
    assert "2+3" in gate["text"]
    code, out, _ = up.main(capsys, "gates")  # the table, over every loop
    assert gate["gate_id"] in out

    code, out, err = up.main(capsys, "approve", gate["gate_id"])  # no --loop: found by scanning loops
    assert code == 0, err
    assert f"gate {gate['gate_id']} of loop {loop}: approve" in out
    recs = up.wait_for(capsys, loop, turns_done(1))
    results = [m for r in recs if r["event"]["type"] == "StepDone" for m in r["event"]["messages"][1:]]
    assert results[0]["blocks"][0]["text"] == "5"

    code, _, err = up.main(capsys, "approve", gate["gate_id"])  # answered already
    assert code == 1 and err.startswith("error: closed: ") and err.count("\n") == 1

    up.main(capsys, "send", loop, "what is 6*7?")
    gate2 = _open_gate(up, capsys, loop)
    code, _, err = up.main(capsys, "deny", gate2["gate_id"], "--reason", "not now", "--loop", loop)
    assert code == 0, err
    recs = up.wait_for(capsys, loop, turns_done(2))
    resolved = [r["event"] for r in recs if r["event"]["type"] == "GateResolved"]
    assert (resolved[-1]["action"], resolved[-1]["reason"]) == ("deny", "not now")
    denied = [m for r in recs if r["event"]["type"] == "StepDone" for m in r["event"]["messages"][1:]][-1]
    assert denied["is_error"] and "not now" in denied["blocks"][0]["text"]  # the model sees why

    up.main(capsys, "send", loop, "what is 1+1?")
    gate3 = _open_gate(up, capsys, loop)
    assert up.main(capsys, "approve", gate3["gate_id"], "--always")[0] == 0
    up.wait_for(capsys, loop, turns_done(3))
    up.main(capsys, "send", loop, "what is 2+2?")  # always allowed now: no gate
    recs = up.wait_for(capsys, loop, turns_done(4))
    assert [r["event"]["action"] for r in recs if r["event"]["type"] == "GateResolved"][-1] == "approve_always"
    assert types(recs).count("GateOpened") == 3


def test_reply_answers_an_ask_user_gate(up: Up, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    script = tmp_path / "ask.json"
    args = json.dumps({"question": "Favourite colour?", "choices": ["red", "blue"]})
    script.write_text(
        json.dumps(
            {
                "responses": [
                    [
                        {"kind": "tool_use", "index": 0, "id": "call_{k}", "name": "ask_user"},
                        {"kind": "tool_use", "index": 0, "text": args},
                        {"kind": "finish", "finish_reason": "tool_use"},
                    ],
                    "Noted.",
                ]
            }
        )
    )
    code, out, _ = up.main(capsys, "start", "--model", f"scripted:{script}")
    loop = out.strip()
    up.main(capsys, "send", loop, "ask me something")
    gate = _open_gate(up, capsys, loop)
    assert gate["kind"] == "user_input" and gate["text"] == "Favourite colour?" and gate["choices"] == ["red", "blue"]
    code, out, err = up.main(capsys, "reply", gate["gate_id"], "blue")
    assert code == 0, err
    recs = up.wait_for(capsys, loop, turns_done(1))
    step = next(r["event"] for r in recs if r["event"]["type"] == "StepDone")
    assert step["messages"][1]["blocks"][0]["text"] == "blue"
    # (TurnDone may still be the last record when the read came: LoopIdle follows it in a commit of its own)
    done = next(r["event"] for r in reversed(recs) if r["event"]["type"] == "TurnDone")
    assert done["message"]["blocks"][0]["text"] == "Noted."


def test_interrupt_ends_a_waiting_send(up: Up, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    script = tmp_path / "hang.json"
    script.write_text(json.dumps({"responses": [[{"hang": True}]]}))
    code, out, _ = up.main(capsys, "start", "--model", f"scripted:{script}")
    loop = out.strip()
    waiting = up.popen("send", loop, "never answered", "--wait")
    try:
        up.wait_for(capsys, loop, lambda recs: "TurnStarted" in types(recs))
        code, out, err = up.main(capsys, "interrupt", loop)
        assert code == 0, err
        _, err = waiting.communicate(timeout=20)
    finally:
        if waiting.poll() is None:
            waiting.kill()
    assert waiting.returncode == 1
    assert err.startswith("error: turn interrupted: turn 1 interrupted") and err.count("\n") == 1
    assert "TurnInterrupted" in types(up.records(capsys, loop))
    code, out, _ = up.main(capsys, "close", loop)
    assert code == 0 and "LoopClosed" in types(up.records(capsys, loop))


def _lines(proc: subprocess.Popen[str], until: str, timeout: float = 20) -> list[str]:
    """Read ``proc``'s stdout in a thread until a line contains ``until``."""
    lines: list[str] = []
    found = threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if until in line:
                found.set()
                return

    threading.Thread(target=read, daemon=True).start()
    assert found.wait(timeout), "".join(lines)
    return lines


def test_tail_follows_live_and_committed_events(up: Up, capsys: pytest.CaptureFixture[str]) -> None:
    every = up.popen("tail")
    assert every.stderr is not None and "following every loop" in every.stderr.readline()
    loop = up.main(capsys, "start")[1].strip()
    one = up.popen("tail", loop, "--json", "--no-tokens")
    try:
        assert one.stderr is not None and f"following loop {loop}" in one.stderr.readline()
        assert up.main(capsys, "send", loop, "what is 6*7?", "--wait")[1].strip().endswith("6*7 = 42")
        seen_all = _lines(every, "TurnDone")
        seen_one = [json.loads(x) for x in _lines(one, '"TurnDone"')]
    finally:
        for p in (every, one):
            p.send_signal(signal.SIGINT)
    for p in (every, one):
        # Read what it still prints while it stops: nobody reads its pipes after the lines above,
        # and a full pipe would block its exit.
        _, err = p.communicate(timeout=10)
        assert p.returncode == 0, err  # Ctrl-C is how tail ends
    mine = [line for line in seen_all if loop[:8] in line]
    assert any(" ~ " in line and "TokenDelta" in line for line in mine)  # live (no sequence)
    assert any("ToolCallStarted" in line and "calculator" in line for line in mine)
    assert any(re.match(r"\s*\d+ .*StepDone", line) for line in mine)  # committed, with its sequence
    kinds = [r["event"]["type"] for r in seen_one]
    assert kinds[0] == "LoopStarted" and "TokenDelta" not in kinds and "ToolCallCompleted" in kinds
    assert all(r["seq"] is None for r in seen_one if r["event"]["type"] == "ToolCallCompleted")


def test_remote_errors_are_one_line(up: Up, capsys: pytest.CaptureFixture[str]) -> None:
    unknown = str(uuid.uuid4())
    code, _, err = up.main(capsys, "history", unknown)
    assert code == 1 and err == f"error: loop {unknown} has no history (unknown loop?)\n"
    code, _, err = up.main(capsys, "send", unknown, "hello")
    assert code == 1 and err.startswith("error: not_found: ") and err.count("\n") == 1
    code, _, err = up.main(capsys, "deny", str(uuid.uuid4()))
    assert code == 1 and err.startswith("error: no loop has a gate ")


def test_loops_lists_the_most_recently_active_first_within_80_columns(up: Up, tmp_path: Path) -> None:
    script = tmp_path / ("a-long-directory-name-" * 4) / "answers.json"
    script.parent.mkdir(parents=True)
    script.write_text(json.dumps({"responses": ["ok"], "repeat_last": True}))
    older = up.run("start", "--model", f"scripted:{script}").stdout.strip()
    newer = up.run("start").stdout.strip()
    assert up.run("send", older, "hello", "--wait").returncode == 0  # the older loop is now the active one
    env = {**os.environ, "LW_NATS_URL": up.url, "COLUMNS": "80"}
    table = subprocess.run([LOOPWIRE, "loops"], env=env, capture_output=True, text=True, timeout=60)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines), table.stdout
    rows = [line for line in lines if older[:8] in line or newer[:8] in line]
    assert older[:8] in rows[0] and newer[:8] in rows[1], table.stdout
    assert "scripted:answers.json" in table.stdout and "a-long-directory" not in table.stdout


def test_loops_are_named_by_a_unique_prefix_in_any_case(up: Up) -> None:
    tag = uuid.uuid4().hex[:4]
    first, second = (f"{tag}{k}000-0000-4000-8000-000000000000" for k in ("a", "b"))
    for loop_id in (first, second):
        assert up.run("start", "--loop-id", loop_id).returncode == 0
    assert up.run("send", first[:6].upper(), "hello", "--wait").returncode == 0  # the short id, upper case
    history = up.run("history", first.upper(), "--json")
    assert history.returncode == 0 and '"InputSubmitted"' in history.stdout
    ambiguous = up.run("history", tag)
    assert ambiguous.returncode == 1
    assert (
        ambiguous.stderr == f"error: LOOP: 2 loop ids start with {tag!r} ({first[:8]}, {second[:8]}): give more of it\n"
    )
    unknown = up.run("interrupt", "ffff" + tag)
    assert unknown.returncode == 1 and "no loop id starts with" in unknown.stderr


def test_the_readme_fork_example_runs_on_any_stack(up: Up) -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme[readme.index("## Fork a loop") :]
    block = section[section.index("```bash\n") + 8 :]
    lines = block[: block.index("```")].splitlines()[:3]  # history, the point, the edited retry
    loop = up.run("start").stdout.strip()
    assert up.run("send", loop, "what is 2+2?", "--wait").returncode == 0
    script = "set -euo pipefail\n" + "\n".join(lines) + '\necho "$NEW"\n'
    env = {**os.environ, "LW_NATS_URL": up.url, "LOOP": loop, "PATH": f"{Path(LOOPWIRE).parent}:{os.environ['PATH']}"}
    done = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    new = done.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"[0-9a-f-]{36}", new) and new != loop
    assert "shorter, please" in up.run("history", new).stdout


def test_start_refuses_an_unknown_model_or_tool_in_one_plain_line(up: Up) -> None:
    cases = [
        (["--model", "gpt-4o"], "error: --model: unknown model 'gpt-4o': expected one of demo, scripted:<path>, "),
        (
            ["--tools", "calculator,calculater"],
            "error: --tools: no live tool named calculater (did you mean calculator?) (live: ",
        ),
        (["--tools", "two words"], "error: --tools: 'two words' is not a tool name (1 to 64 of A-Z a-z 0-9 _ -)"),
    ]
    for args, expected in cases:
        done = up.run("start", *args)
        assert done.returncode == 1 and done.stderr.startswith(expected), (args, done.stderr)
        assert done.stderr.count("\n") == 1 and "^[" not in done.stderr  # one line, no raw pattern
    assert up.run("start", "--tools", "calculator,clock", "--model", "demo").returncode == 0


def test_an_explicit_port_that_is_busy_is_an_error_not_another_port() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        for args in (
            ["up", "--port", str(port)],
            ["up", "--console-port", str(port)],
            ["console", "--port", str(port)],
        ):
            env = {**os.environ, "LW_NATS_URL": "nats://127.0.0.1:9"}
            done = subprocess.run([LOOPWIRE, *args], env=env, capture_output=True, text=True, timeout=60)
            assert done.returncode == 1, (args, done.stdout, done.stderr)
            assert done.stderr.endswith(f"{port} is in use; choose another, or 0 for a free one\n"), (args, done.stderr)
