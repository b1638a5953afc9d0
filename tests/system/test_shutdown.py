"""Every service kind stops within 5 s of SIGTERM whatever the broker's state: the NATS server
killed, or stopped (SIGSTOP: connections open, nothing answers), before the signal."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from shared.natsserver import NatsServer, free_port
from shared.procs import ServiceProcess
from tests import natsfixtures
from tests.mcpfixtures import time_command

pytestmark = pytest.mark.system

REPO = Path(__file__).resolve().parents[2]
LIMIT_SECONDS = 5.0


def _kinds() -> dict[str, list[str]]:
    return {
        "committer": ["-m", "services.committer"],
        "model-step": ["-m", "services.model_step"],
        "tool-worker": ["-m", "services.tools", "calculator"],
        "mcp-bridge": ["-m", "services.cli", "serve", "mcp", "time", "--", *time_command()],
        "console": ["-m", "services.cli", "console", "--port", str(free_port())],
    }


KINDS = ["committer", "model-step", "tool-worker", "mcp-bridge", "console"]
BROKER = ["killed", "stopped"]


@contextmanager
def _server() -> Iterator[NatsServer]:
    with natsfixtures.own_server() as server:
        try:
            yield server
        finally:  # a stopped server is let go on, so that its cleanup can end it
            if server.proc is not None and server.proc.poll() is None:
                os.kill(server.proc.pid, signal.SIGCONT)


@pytest.mark.parametrize("broker", BROKER)
@pytest.mark.parametrize("kind", KINDS)
def test_a_service_exits_soon_after_sigterm_whatever_the_broker(kind: str, broker: str) -> None:
    with _server() as server, tempfile.TemporaryDirectory(prefix="lw-stop-") as d:
        env = {
            "LW_NATS_URL": server.url,
            "LW_PREFIX": "stop",
            "LW_CONSOLE_TOKEN": "",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH", "")])),
        }
        svc = ServiceProcess(kind, _kinds()[kind], env, log_path=str(Path(d) / "log"))
        svc.start(timeout=60)
        try:
            assert server.proc is not None
            if broker == "killed":
                server.proc.kill()
                server.proc.wait(timeout=10)
            else:
                os.kill(server.proc.pid, signal.SIGSTOP)
            time.sleep(0.5)  # the service notices (or not) before it is told to stop
            started = time.monotonic()
            svc.signal(signal.SIGTERM)
            assert svc.proc is not None
            try:
                code = svc.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                code = None
            took = time.monotonic() - started
            print(f"{kind} with the broker {broker}: exited {code} {took:.1f}s after SIGTERM")
            assert code is not None and took <= LIMIT_SECONDS, f"{kind}: {took:.1f}s\n{svc.log_tail(40)}"
            assert code == 0, f"{kind} exited {code}\n{svc.log_tail(40)}"
            assert "Traceback" not in Path(svc.log_path).read_text(errors="replace"), svc.log_tail(60)
        finally:
            svc.kill()


@pytest.mark.parametrize("kind", KINDS)
def test_a_service_that_cannot_reach_nats_says_so_and_exits(kind: str, tmp_path: Path) -> None:
    url = f"nats://127.0.0.1:{free_port()}"  # nothing listens there
    env = {
        **os.environ,
        "LW_NATS_URL": url,
        "LW_PREFIX": "stop",
        "LW_CONSOLE_TOKEN": "",
        "LW_CONNECT_SECONDS": "2",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH", "")])),
    }
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, *_kinds()[kind]], env=env, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL
    )
    took = time.monotonic() - started
    assert done.returncode == 1, (kind, done.returncode, done.stderr[-2000:])
    assert "Traceback" not in done.stderr, done.stderr[-4000:]
    assert took < 20, f"{kind}: {took:.1f}s"
    assert url in done.stderr.splitlines()[-1], done.stderr[-2000:]  # the last line names where it looked
    assert len(done.stderr.splitlines()) <= 6, done.stderr  # quiet: no line per reconnect attempt
