"""Every service kind stops within 5 s of SIGTERM whatever the broker's state: the NATS server up,
killed, or stopped (SIGSTOP: connections open, nothing answers) before the signal. The stop is the
service's own (its connection to a silent server closed, the rest of its stop done), not the runner's
last resort, and with its server up nothing is cut short."""

from __future__ import annotations

import contextlib
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import anyio
import pytest

from services.deployment import Deployment, console_command, service_command, tool_command
from shared.natsserver import NatsServer, free_port
from shared.procs import ServiceProcess
from shared.settings import Settings
from tests import natsfixtures
from tests.mcpfixtures import time_command

pytestmark = pytest.mark.system

REPO = Path(__file__).resolve().parents[2]
LIMIT_SECONDS = 5.0
WAIT_SECONDS = 20.0  # how long a stop is watched: a slow one is measured, not just failed
# services.runner's last resort (a stop with no NATS server answering ends there whatever still runs).
LAST_RESORT = "NATS does not answer"
# services.lifecycle.let_go_of_silent closing a connection whose server does not answer.
CUT_SHORT = "closed without draining"


def _kinds() -> dict[str, list[str]]:
    return {
        "committer": service_command("committer"),
        "model-step": service_command("model-step"),
        "tool-worker": tool_command("calculator"),
        "mcp-bridge": service_command("mcp", "time", "--", *time_command()),
        "console": console_command(free_port()),
    }


KINDS = ["committer", "model-step", "tool-worker", "mcp-bridge", "console"]
BROKER = ["up", "killed", "stopped"]


def _env(url: str) -> dict[str, str]:
    return {
        "LW_NATS_URL": url,
        "LW_PREFIX": "stop",
        "LW_CONSOLE_TOKEN": "",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH", "")])),
    }


@dataclass(frozen=True)
class Stop:
    code: int | None  # None: still running after WAIT_SECONDS
    seconds: float
    log: str


@contextmanager
def _server() -> Iterator[NatsServer]:
    with natsfixtures.own_server() as server:
        try:
            yield server
        finally:  # a stopped server is let go on, so that its cleanup can end it
            if server.proc is not None and server.proc.poll() is None:
                os.kill(server.proc.pid, signal.SIGCONT)


def _discard(svc: ServiceProcess) -> None:
    svc.kill()
    if svc.proc is not None and svc.proc.stdout is not None:
        svc.proc.stdout.close()


def _stop_in_every_state(kind: str) -> dict[str, Stop]:
    """One service of ``kind`` per broker state, on a server of its own, all at once (the file stays
    quick); each is sent SIGTERM and timed to its exit."""
    with contextlib.ExitStack() as stack, tempfile.TemporaryDirectory(prefix="lw-stop-") as d:
        servers = {broker: stack.enter_context(_server()) for broker in BROKER}
        services: dict[str, ServiceProcess] = {}
        for broker, server in servers.items():
            # A tool worker, a bridge and the console serve a deployment only where there is one.
            anyio.run(natsfixtures.create_deployment, Settings.from_env({}, nats_urls=(server.url,), prefix="stop"))
            on_server = Deployment(_env(server.url), Path(d))
            svc = on_server.process(f"{kind}-{broker}", _kinds()[kind], log_name=f"{broker}.log")
            stack.callback(_discard, svc)
            services[broker] = svc.start(wait=False)
        for svc in services.values():
            svc.wait_ready(timeout=90)
        for broker, server in servers.items():
            assert server.proc is not None
            if broker == "killed":
                server.proc.kill()
                server.proc.wait(timeout=10)
            elif broker == "stopped":
                os.kill(server.proc.pid, signal.SIGSTOP)
        time.sleep(0.5)  # the services notice (or not) before they are told to stop
        signalled: dict[str, float] = {}
        for broker, svc in services.items():
            svc.signal(signal.SIGTERM)
            signalled[broker] = time.monotonic()
        exited: dict[str, float] = {}
        deadline = time.monotonic() + WAIT_SECONDS
        while len(exited) < len(services) and time.monotonic() < deadline:
            for broker, svc in services.items():
                if broker not in exited and not svc.running:
                    exited[broker] = time.monotonic()
            time.sleep(0.01)
        return {
            broker: Stop(
                code=svc.proc.poll() if svc.proc is not None else None,
                seconds=exited.get(broker, math.inf) - signalled[broker],
                log=Path(svc.log_path).read_text(errors="replace"),
            )
            for broker, svc in services.items()
        }


@pytest.fixture(scope="module")
def stops() -> dict[str, dict[str, Stop]]:
    return {}  # kind → broker state → its stop, measured once per kind


@pytest.mark.parametrize("broker", BROKER)
@pytest.mark.parametrize("kind", KINDS)
def test_a_service_exits_soon_after_sigterm_whatever_the_broker(
    kind: str, broker: str, stops: dict[str, dict[str, Stop]]
) -> None:
    if kind not in stops:
        stops[kind] = _stop_in_every_state(kind)
    stop = stops[kind][broker]
    tail = "\n".join(stop.log.splitlines()[-40:])
    print(f"{kind} with the broker {broker}: exited {stop.code} {stop.seconds:.1f}s after SIGTERM")
    assert stop.code is not None and stop.seconds <= LIMIT_SECONDS, f"{kind}: {stop.seconds:.1f}s\n{tail}"
    assert stop.code == 0, f"{kind} exited {stop.code}\n{tail}"
    assert "Traceback" not in stop.log, tail
    assert LAST_RESORT not in stop.log, f"{kind}: its stop did not end by itself\n{tail}"
    if broker == "up":
        assert CUT_SHORT not in stop.log, f"{kind}: a connection to a live server was closed undrained\n{tail}"


@pytest.mark.parametrize("kind", KINDS)
def test_a_service_that_cannot_reach_nats_says_so_and_exits(kind: str, tmp_path: Path) -> None:
    url = f"nats://127.0.0.1:{free_port()}"  # nothing listens there
    env = {**os.environ, **_env(url), "LW_CONNECT_SECONDS": "2"}
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
