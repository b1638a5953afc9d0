"""``loopwire demo`` as a user runs it: to the end, and interrupted with Ctrl-C at any moment.

Every process the demo starts inherits ``LW_TEST_MARKER`` (and ``TMPDIR``), so after it exits we can
prove that nothing is left: no process carrying the marker, no listening NATS port, no temp dir.
"""

from __future__ import annotations

import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

pytestmark = pytest.mark.system

LOOPWIRE = shutil.which("loopwire", path=str(Path(sys.executable).parent)) or "loopwire"


def marked_pids(marker: str) -> list[int]:
    needle = f"LW_TEST_MARKER={marker}".encode()
    found = []
    for d in Path("/proc").glob("[0-9]*"):
        try:
            if needle in (d / "environ").read_bytes():
                found.append(int(d.name))
        except OSError:
            continue
    return found


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


class Demo:
    """``loopwire demo`` in its own session, its output read line by line as it comes."""

    def __init__(self, tmp: Path, *args: str) -> None:
        self.marker = uuid.uuid4().hex
        self.tmp = tmp
        env = {**os.environ, "LW_TEST_MARKER": self.marker, "TMPDIR": str(tmp), "COLUMNS": "120"}
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            [LOOPWIRE, "demo", *args],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.lines: list[str] = []
        self._q: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._q.put(line)
        self._q.put(None)

    def wait_line(self, pattern: str, timeout: float = 30) -> str:
        deadline = time.monotonic() + timeout
        while True:
            line = self._q.get(timeout=max(0.01, deadline - time.monotonic()))
            assert line is not None, f"demo ended before {pattern!r}:\n{self.output}"
            self.lines.append(line)
            if re.search(pattern, line):
                return line

    def finish(self, timeout: float = 30) -> int:
        code = self.proc.wait(timeout=timeout)
        while (line := self._q.get(timeout=5)) is not None:
            self.lines.append(line)
        return code

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def nats_port(self) -> int | None:
        m = re.search(r"NATS at nats://127\.0\.0\.1:(\d+)", self.output)
        return int(m.group(1)) if m else None

    def assert_nothing_left(self) -> None:
        deadline = time.monotonic() + 5
        while (left := marked_pids(self.marker)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not left, f"processes left behind: {left}\n{self.output}"
        port = self.nats_port()
        if port is not None:
            assert not port_open(port), f"NATS port {port} still listening"
        assert not [p.name for p in self.tmp.iterdir() if p.name.startswith("loopwire-")], "temp dir left behind"


def test_demo_runs_a_loop_live_and_replays_history(tmp_path: Path) -> None:
    demo = Demo(tmp_path)
    code = demo.finish(timeout=60)
    took = time.monotonic() - demo.started
    out = demo.output
    assert code == 0, out
    assert took < 15, f"the demo took {took:.1f} s"
    lines = out.splitlines()
    # Live: the model's text, then both tools starting and completing with their durations.
    model = lines.index("model  | [demo model — not an LLM] Let me use calculator and clock.")
    started = [i for i, line in enumerate(lines) if re.match(r"tool   \| (calculator|clock) \{.*\} started$", line)]
    done = [i for i, line in enumerate(lines) if re.match(r"tool   \| (calculator|clock) ok in \d+ ms: ", line)]
    assert len(started) == 2 and len(done) == 2 and model < min(started) and max(started) < min(done)
    assert any(re.match(r"tool   \| calculator ok in \d+ ms: 391$", line) for line in lines)
    assert any(line.startswith("commit | step 1 committed at seq ") for line in lines)
    # The final answer, then the history replayed from JetStream as a table.
    answer = next(i for i, line in enumerate(lines) if line.startswith("answer | "))
    assert "17*23 = 391" in out[out.index("answer | ") :] and "Asia/Tokyo" in lines[answer + 2]
    table = out[out.index("replayed from JetStream") :]
    for event in ("LoopStarted", "InputSubmitted", "TurnStarted", "StepDone", "TurnDone", "LoopIdle"):
        assert f"│ {event}" in table, event
    assert "← toolu_demo_1: 391" in table
    demo.assert_nothing_left()


# Where Ctrl-C lands: a delay after launch (imports, NATS start, services starting), or right after a
# line of output (services ready, loop started, model streaming, answer printed).
MOMENTS = [
    ("0.3s", None),
    ("1.5s", None),
    ("ready", r"^demo   \| ready in "),
    ("streaming", r"^model  \| "),
    ("answer", r"^answer \| "),
]


@pytest.mark.parametrize(("moment", "pattern"), MOMENTS, ids=[m for m, _ in MOMENTS])
def test_ctrl_c_at_any_moment_leaves_nothing(tmp_path: Path, moment: str, pattern: str | None) -> None:
    demo = Demo(tmp_path)
    if pattern is None:
        time.sleep(float(moment[:-1]))  # the moment itself is the point here, not a synchronisation
    else:
        demo.wait_line(pattern)
    demo.proc.send_signal(signal.SIGINT)
    code = demo.finish(timeout=30)
    assert code in (130, 0), demo.output  # 0 only if the demo had already finished its work
    if pattern is not None and moment != "answer":
        assert code == 130 and "interrupted: everything stopped" in demo.output
    demo.assert_nothing_left()


def test_terminal_ctrl_c_reaches_every_process_and_still_leaves_nothing(tmp_path: Path) -> None:
    # A terminal's Ctrl-C signals the whole foreground process group: the demo and its services.
    demo = Demo(tmp_path)
    demo.wait_line(r"^tool   \| ")
    os.killpg(demo.proc.pid, signal.SIGINT)
    assert demo.finish(timeout=30) in (130, 0)
    demo.assert_nothing_left()


def test_a_failed_turn_is_one_error_line_with_the_whole_cause_and_the_logs_are_kept(tmp_path: Path) -> None:
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))  # bound, never listening: every connection is refused
    port = closed.getsockname()[1]
    env = {
        **os.environ,
        "LW_OPENAI_BASE_URL": f"http://127.0.0.1:{port}/v1",
        "OPENAI_API_KEY": "unused",
        "TMPDIR": str(tmp_path),
    }
    try:
        done = subprocess.run(
            [LOOPWIRE, "demo", "--plain", "--model", "openai:gpt-4o", "hi"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        closed.close()
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    [line] = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert line.startswith("error: the turn ended failed: turn 1 failed: model_error: openai:gpt-4o: could not reach ")
    assert "(ConnectError: " in line  # the model's error whole, not cut at its first words
    logs = Path(re.search(r"\(logs kept in (\S+)\)$", line)[1])  # type: ignore[index]
    assert logs.is_dir() and any(logs.glob("*.log")), "the logs that explain the failure are kept"
    assert f"could not reach http://127.0.0.1:{port}/v1/chat/completions" in done.stdout  # the live turn line
