"""The CLI pointed at no NATS server, or at one that holds no loopwire deployment: one ``error:``
line that says which and what to do, exit 1, never a traceback or a hang."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from shared.natsserver import NatsServer, free_port
from tests import natsfixtures

LOOPWIRE = str(Path(sys.executable).with_name("loopwire"))
LOOP = "00000000-0000-4000-8000-000000000000"
READERS = [["loops"], ["tail", LOOP], ["tail"], ["history", LOOP], ["gates"], ["tools"], ["lineage", LOOP]]


def run(url: str, *args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    env = {k: v for k, v in os.environ.items() if k != "LW_PREFIX"} | {"LW_NATS_URL": url, "LW_CONSOLE_TOKEN": ""}
    started = time.monotonic()
    done = subprocess.run([LOOPWIRE, *args], env=env, capture_output=True, text=True, timeout=60)
    return done, time.monotonic() - started


def one_error_line(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 1, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr and "Traceback" not in done.stdout
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    return lines[0]


@pytest.mark.parametrize("args", [*READERS, ["console", "--port", "0"]], ids=lambda a: " ".join(a))
def test_no_server_is_one_error_line_with_the_way_out(args: list[str]) -> None:
    url = f"nats://127.0.0.1:{free_port()}"  # nothing listens there
    done, took = run(url, *args)
    line = one_error_line(done)
    assert f"cannot connect to NATS at {url} (connection refused)" in line
    assert "`loopwire up`" in line and "LW_NATS_URL" in line
    assert took < 10, f"{args}: {took:.1f}s"


@pytest.fixture(scope="module")
def bare_server() -> Iterator[NatsServer]:
    with natsfixtures.own_server() as server:
        yield server


@pytest.mark.parametrize("args", READERS, ids=lambda a: " ".join(a))
def test_a_server_without_loopwire_is_said_to_be_one(bare_server: NatsServer, args: list[str]) -> None:
    done, _ = run(bare_server.url, *args)
    line = one_error_line(done)
    assert f"no loopwire deployment at {bare_server.url} (no stream LW_HISTORY; another LW_PREFIX?)" in line
    assert "no loops yet" not in done.stdout


@pytest.mark.parametrize(
    "argv",
    [
        ["loops"],
        ["serve", "committer"],
        ["serve", "tool", "calculator"],
        ["-m", "services.tools", "calculator"],
        ["-m", "services.committer"],
        ["-m", "services.model_step"],
    ],
    ids=" ".join,
)
def test_a_url_of_another_scheme_is_named_not_looked_up(argv: list[str]) -> None:
    """nats-py takes ``http://host`` for a host name: the refusal names the scheme instead of a DNS failure."""
    with natsfixtures.own_server() as server:
        url = server.url.replace("nats://", "http://")
        env = {**os.environ, "LW_NATS_URL": url}
        command = [sys.executable, *argv] if argv[0] == "-m" else [LOOPWIRE, *argv]
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    line = one_error_line(done)
    assert line.startswith(f"error: LW_NATS_URL: {url!r} is not a NATS URL (scheme http://; NATS URLs are nats://")


BAD_LINES = [
    ["start", "--max-cost-usd", "abc"],
    ["start", "--max-total-tokens", "12k"],
    ["budget", "abcd", "--max-steps-per-turn", "1.5"],
    ["start", "--context-window", "abc"],
    ["start", "--on-budget", "maybe"],
    ["start", "--reexecute", "calculator=reuse"],
]


@pytest.mark.parametrize("args", BAD_LINES, ids=" ".join)
def test_a_bad_command_line_is_one_error_line_with_a_server_or_none(bare_server: NatsServer, args: list[str]) -> None:
    for url in (bare_server.url, f"nats://127.0.0.1:{free_port()}"):
        done, _ = run(url, *args)
        assert done.returncode == 2 and done.stdout == "", (url, done)
        lines = done.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"error: loopwire {args[0]}: "), done.stderr
        assert "usage:" not in done.stderr and "Traceback" not in done.stderr
    if "--reexecute" in args:
        assert "--reexecute is an option of loopwire fork" in lines[0]
