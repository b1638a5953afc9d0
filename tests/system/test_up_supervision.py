"""``loopwire up`` watches every child alike: the nats-server or a tool worker that dies is started
again, said in one line that names it and its log; one that keeps dying stops the stack with one
``error:`` line naming it and its log, which is still there to read."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from services.embedded import RESTARTS_ALLOWED

LOOPWIRE = str(Path(sys.executable).with_name("loopwire"))


class UpProcess:
    """``loopwire up`` (a temporary data directory) as a process, its output read as it comes."""

    def __init__(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("LW_")} | {"PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(
            [LOOPWIRE, "up", "--port", "0", "--no-console", "--no-metrics", "--tools", "calculator"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self.out: list[str] = []
        self.err: list[str] = []
        for pipe, into in ((self.proc.stdout, self.out), (self.proc.stderr, self.err)):
            threading.Thread(target=self._read, args=(pipe, into), daemon=True).start()
        self.wait_line("Ctrl-C stops everything", timeout=90)
        self.url = next(m.group(1) for line in self.out if (m := re.match(r"NATS URL: (\S+)", line)))

    @staticmethod
    def _read(pipe: object, into: list[str]) -> None:
        for line in pipe:  # type: ignore[attr-defined]
            into.append(line.rstrip("\n"))

    def wait_line(self, text: str, *, timeout: float = 60.0, start: int = 0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = [line for line in self.out[start:] if text in line]
            if found:
                return found[0]
            if self.proc.poll() is not None:
                time.sleep(0.2)  # the readers finish
                break
            time.sleep(0.05)
        raise AssertionError(f"no line with {text!r}: {self.out} / {self.err}")

    def child(self, marker: str) -> int:
        """The pid of the child whose command line holds ``marker``."""
        for proc in Path("/proc").glob("[0-9]*"):
            try:
                ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
                if ppid == self.proc.pid and marker.encode() in (proc / "cmdline").read_bytes():
                    return int(proc.name)
            except (OSError, ValueError, IndexError):
                continue
        raise AssertionError(f"no child with {marker!r}")

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("LW_")} | {"LW_NATS_URL": self.url}
        return subprocess.run([LOOPWIRE, *args], env=env, capture_output=True, text=True, timeout=60)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            self.proc.wait(timeout=30)


def test_up_restarts_any_child_that_dies_then_stops_naming_the_one_that_keeps_dying() -> None:
    up = UpProcess()
    try:
        loop = up.cli("start", "--tools", "calculator")
        assert loop.returncode == 0, loop.stderr

        # The nats-server: started again on the same port and store; the loop is still there.
        mark = len(up.out)
        os.kill(up.child("nats-server"), signal.SIGKILL)
        line = up.wait_line("nats-server exited", start=mark, timeout=30)
        assert re.fullmatch(
            r"nats-server exited \(killed by SIGKILL\); restarted \(1 of 3 within 60 s\); log: (\S+nats-server\.log)",
            line,
        ), line
        history = up.cli("history", loop.stdout.strip(), "--json")
        assert history.returncode == 0 and '"LoopStarted"' in history.stdout, history.stderr

        # A tool worker: started again, the stack runs on.
        for n in range(1, RESTARTS_ALLOWED + 1):
            mark = len(up.out)
            os.kill(up.child("calculator"), signal.SIGKILL)
            line = up.wait_line("tool-calculator exited", start=mark, timeout=60)
            assert re.fullmatch(
                rf"tool-calculator exited \(killed by SIGKILL\); restarted \({n} of 3 within 60 s\); "
                r"log: \S+/calculator\.log",
                line,
            ), line
            assert up.proc.poll() is None
        tools = up.cli("tools", "--json")
        assert tools.returncode == 0 and "calculator" in tools.stdout, tools.stderr

        # Once more within the minute: everything stops, one line names it and its log, kept.
        os.kill(up.child("calculator"), signal.SIGKILL)
        assert up.proc.wait(timeout=60) == 1
        time.sleep(0.3)  # the readers finish
    finally:
        up.stop()
    errors = [line for line in up.err if line.strip()]
    assert len(errors) == 1 and "Traceback" not in "\n".join(up.err), up.err
    m = re.fullmatch(
        r"error: tool-calculator exited \(killed by SIGKILL\) 4 times within 60 s; everything stopped; "
        r"its log is kept: (\S+/calculator\.log)",
        errors[0],
    )
    assert m is not None, errors
    log = Path(m.group(1))
    assert log.is_file() and "tool:calculator" in log.read_text()  # the worker's own log, still there
    shutil.rmtree(log.parent.parent)  # the kept (temporary) data directory
