"""A service that cannot serve the deployment it is pointed at says why in one line and exits 1:
no traceback, nothing created. Every kind (committer, model-step, tool worker, sub-agent, MCP
bridge, console), each its own process, against a real nats-server: settings that do not fit the
deployment (another shard count, other replicas), the README's ``LW_SHARDS=6 LW_REPLICAS=3`` on a
single server, and a server that holds no loopwire at all."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from shared.natsserver import NatsServer, free_port
from shared.settings import Settings
from tests import natsfixtures
from tests.mcpfixtures import time_command

LOOPWIRE = str(Path(sys.executable).with_name("loopwire"))
SHARDS = 2  # the deployment's shard count


def _commands() -> dict[str, list[str]]:
    return {
        "committer": ["serve", "committer"],
        "model-step": ["serve", "model-step"],
        "tool": ["serve", "tool", "calculator"],
        "agent": ["serve", "agent", "helper", "--model", "demo", "--tools", "calculator"],
        "mcp": ["serve", "mcp", "time", "--", *time_command()],
        "console": ["console", "--port", str(free_port())],
    }


KINDS = ["committer", "model-step", "tool", "agent", "mcp", "console"]
# The kinds that serve a deployment without creating one.
SERVING = ["tool", "agent", "mcp", "console"]


@pytest.fixture(scope="module")
def server() -> Iterator[NatsServer]:
    with natsfixtures.own_server() as s:
        yield s


@pytest.fixture(scope="module")
def deployment(server: NatsServer) -> Settings:
    """A deployment of :data:`SHARDS` shards, one replica each, as its committer creates it."""
    settings = Settings.from_env({}, nats_urls=(server.url,), prefix=natsfixtures.unique_prefix(), shards=SHARDS)
    anyio.run(natsfixtures.create_deployment, settings)
    return settings


def run(server: NatsServer, prefix: str, kind: str, **env: str) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("LW_")}
    full |= {"LW_NATS_URL": server.url, "LW_PREFIX": prefix, "LW_CONSOLE_TOKEN": "", "LW_CONNECT_SECONDS": "5"}
    full |= env
    return subprocess.run([LOOPWIRE, *_commands()[kind]], env=full, capture_output=True, text=True, timeout=90)


def one_line(done: subprocess.CompletedProcess[str]) -> str:
    """The refusal: exit 1, and stderr (and stdout) hold one line, no traceback."""
    assert done.returncode == 1, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr + done.stdout, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    assert "READY" not in done.stdout
    return lines[0]


def stream_names(server: NatsServer) -> set[str]:
    names: set[str] = set()
    for account in server.jsz().get("account_details", []) or []:
        names |= {s["name"] for s in account.get("stream_detail", []) or []}
    return names


@pytest.mark.parametrize("kind", KINDS)
def test_another_shard_count_is_refused_in_one_line(server: NatsServer, deployment: Settings, kind: str) -> None:
    line = one_line(run(server, deployment.prefix, kind, LW_SHARDS="3"))
    assert f"LW_SHARDS=3 but the deployment (LW_PREFIX={deployment.prefix}) has 2 shards" in line


@pytest.mark.parametrize("kind", KINDS)
def test_other_replicas_are_refused_in_one_line(server: NatsServer, deployment: Settings, kind: str) -> None:
    line = one_line(run(server, deployment.prefix, kind, LW_SHARDS=str(SHARDS), LW_REPLICAS="3"))
    assert f"{deployment.names.history_stream_of(0)} exists with an incompatible configuration" in line
    assert "want 3, have 1" in line


@pytest.mark.parametrize("kind", ["committer", "model-step"])
def test_the_readme_sharded_replicated_command_on_one_server_is_one_line(server: NatsServer, kind: str) -> None:
    prefix = natsfixtures.unique_prefix()
    line = one_line(run(server, prefix, kind, LW_SHARDS="6", LW_REPLICAS="3"))
    assert "error 10074: replicas > 1 not supported in non-clustered mode" in line
    assert "LW_REPLICAS=3 needs a JetStream cluster of at least 3 nodes" in line
    assert not {n for n in stream_names(server) if prefix.upper() in n}, "nothing half-made is left"


@pytest.mark.parametrize("kind", SERVING)
def test_a_server_without_loopwire_is_refused_and_nothing_is_created(server: NatsServer, kind: str) -> None:
    prefix = natsfixtures.unique_prefix()
    # How long it waits for a committer to create the deployment does not change the refusal.
    line = one_line(run(server, prefix, kind, LW_CONNECT_SECONDS="1"))
    assert f"no loopwire deployment at {server.url} (no stream {prefix.upper()}_HISTORY; another LW_PREFIX?)" in line
    assert not {n for n in stream_names(server) if prefix in n or prefix.upper() in n}, stream_names(server)


def test_a_model_step_serving_a_shard_the_deployment_lacks_is_one_line(
    server: NatsServer, deployment: Settings
) -> None:
    line = one_line(run(server, deployment.prefix, "model-step", LW_SHARDS=str(SHARDS), LW_SHARDS_SERVED="1,5"))
    assert line == "error: model-step cannot start: LW_SHARDS_SERVED names shards [5]; LW_SHARDS=2 has 0 to 1"
