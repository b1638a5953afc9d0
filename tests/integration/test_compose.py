"""compose.yaml, the Dockerfile and the NATS configuration, checked without Docker.

* every compose service runs a real ``loopwire serve ...`` command (parsed by the CLI's own parser)
  and sets only variables the code reads;
* the NATS config parses with the real nats-server (``nats-server -t -c``);
* the services, configured exactly as compose configures them (users, passwords, inbox prefixes),
  run a loop against a real nats-server that enforces deploy/nats/auth.conf, and the permissions
  refuse what they should (history writes by anyone but the committer, other tools' subjects).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import nats
import nats.errors
import pytest
import yaml

from services.cli.app import parse_args
from services.cli.handlers import ClientCommand, handle_serve
from services.deployment import Deployment
from services.tools.builtins import BUILTINS
from services.tools.service import resolve_tools
from shared.client import LoopClient
from shared.connect import connect
from shared.natsserver import NatsServer, server_binary
from shared.settings import ENV_VARS, Settings
from shared.turns import wait_for_turn

ROOT = Path(__file__).resolve().parents[2]
COMPOSE: dict[str, Any] = yaml.safe_load((ROOT / "compose.yaml").read_text())
SERVICES: dict[str, Any] = COMPOSE["services"]
NATS_NODES = ["nats-1", "nats-2", "nats-3"]
LOOPWIRE_SERVICES = [name for name, svc in SERVICES.items() if svc.get("image") == "loopwire:latest"]
# Where the image's console scripts (an MCP server a bridge starts) are found when testing from a venv.
VENV_PATH = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
_DEFAULT = re.compile(r"\$\{([A-Z0-9_]+):-([^}]*)\}")


def resolved(value: object) -> str:
    """A compose value with every ``${VAR:-default}`` replaced by its default."""
    text = str(value)
    assert "$" not in _DEFAULT.sub("", text), f"unresolvable variable in {text!r}"
    return _DEFAULT.sub(lambda m: m.group(2), text)


def service_env(name: str) -> dict[str, str]:
    return {k: resolved(v) for k, v in SERVICES[name]["environment"].items()}


def nats_env() -> dict[str, str]:
    return service_env("nats-1")


# --- static checks ------------------------------------------------------------------------------


def test_nats_cluster_nodes() -> None:
    volumes = COMPOSE["volumes"]
    for name in NATS_NODES:
        node = SERVICES[name]
        image, _, tag = resolved(node["image"]).partition(":")  # the registry's image by default
        assert image == "nats"
        major, minor = (int(x) for x in re.match(r"(\d+)\.(\d+)", tag).groups())  # type: ignore[union-attr]
        assert (major, minor) >= (2, 14), "atomic batch publish needs nats-server 2.12+; we pin 2.14+"
        assert node["healthcheck"]["test"][-1].endswith("/healthz")
        assert f"{name}:/data" in node["volumes"] and name in volumes
        assert node["command"] == ["--config", "/etc/nats/nats.conf"]
        assert node["environment"]["NATS_SERVER_NAME"] == name
    # nats-1 only (the optional "observe" profile publishes its UIs)
    published = [
        p for n, svc in SERVICES.items() if "observe" not in svc.get("profiles", []) for p in svc.get("ports", [])
    ]
    assert [resolved(p) for p in published] == ["4222:4222"]  # LW_NATS_PORT moves the host side


def test_services_replicas_and_scaling() -> None:
    assert SERVICES["committer"]["deploy"]["replicas"] == 2
    assert SERVICES["model-step"]["deploy"]["replicas"] == 2
    for tool in BUILTINS:
        svc = SERVICES[f"tool-{tool.replace('_', '-')}"]
        assert svc["command"] == ["serve", "tool", tool]
    for name, svc in SERVICES.items():
        assert "container_name" not in svc, f"{name} could not be scaled with --scale"
    for name in LOOPWIRE_SERVICES:
        svc = SERVICES[name]
        env = service_env(name)
        assert env["LW_REPLICAS"] == "3" and env["LW_NATS_URL"].count("nats://nats-") == 3
        assert set(svc["depends_on"]) == set(NATS_NODES)
        assert all(d["condition"] == "service_healthy" for d in svc["depends_on"].values())


def test_every_service_command_is_a_loopwire_serve_entry() -> None:
    for name in LOOPWIRE_SERVICES:
        svc = SERVICES[name]
        args = parse_args(svc["command"])  # exits (fails the test) on an unknown command
        if "profiles" in svc:  # the operator CLI, run on demand
            assert isinstance(args.handler, ClientCommand), name
            continue
        assert args.handler is handle_serve, name
        if args.service == "tool":
            assert [t.name for t in resolve_tools(args.tools)] == args.tools
        if args.service == "mcp":  # a bridge: its server's command is installed in the image
            assert args.command and shutil.which(args.command[0], path=VENV_PATH), args.command


def test_every_variable_set_is_one_the_code_reads() -> None:
    users = {m.group(1) for m in re.finditer(r'user: "([a-z_]+)"', (ROOT / "deploy/nats/auth.conf").read_text())}
    passwords = nats_env()
    for name in LOOPWIRE_SERVICES:
        env = service_env(name)
        unknown = set(env) - set(ENV_VARS)
        assert not unknown, f"{name} sets {unknown}, which no code reads"
        Settings.from_env(env)  # and the values parse
        user = env["LW_NATS_USER"]
        assert user in users
        assert env["LW_NATS_INBOX_PREFIX"] == f"_INBOX_{user}"
        assert env["LW_NATS_PASSWORD"] == passwords[f"NATS_PW_{user.upper()}"], f"{name}: password mismatch"


def test_dockerfile_is_one_image_running_loopwire() -> None:
    text = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^ARG BASE_IMAGE=python:3\.11", text, re.M)
    assert re.search(r"^FROM \$\{BASE_IMAGE\}$", text, re.M)
    assert 'ENTRYPOINT ["loopwire"]' in text
    for path in ("loopwire", "shared", "services", "pyproject.toml"):
        assert re.search(rf"^COPY .*\b{path}\b", text, re.M), path
    assert re.search(r"^USER (?!root)", text, re.M)


def _check_config(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [server_binary(), "-t", "-c", str(ROOT / "deploy/nats/nats.conf")],
        env={"PATH": os.environ.get("PATH", ""), **env},
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_nats_config_parses_with_the_real_server() -> None:
    ok = _check_config(nats_env())
    assert ok.returncode == 0, ok.stderr + ok.stdout
    assert "is valid" in ok.stderr + ok.stdout
    missing = {k: v for k, v in nats_env().items() if k != "NATS_PW_COMMITTER"}
    bad = _check_config(missing)
    assert bad.returncode != 0 and "NATS_PW_COMMITTER" in bad.stderr + bad.stdout


def test_auth_conf_has_one_user_per_tool() -> None:
    text = (ROOT / "deploy/nats/auth.conf").read_text()
    for tool in BUILTINS:
        assert f'user: "tool_{tool}"' in text
        assert f'"lw.tool.{tool} tool_{tool}"' in text  # its own subject, in its own queue group
        assert f'"$KV.lw_tools.{tool}.>"' in text


# --- the permissions, enforced by a real server -------------------------------------------------


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServer]:
    """A nats-server enforcing deploy/nats/auth.conf with compose's (default) passwords."""
    store = tmp_path_factory.mktemp("secured")
    shutil.copy(ROOT / "deploy/nats/auth.conf", store)  # nats-server resolves includes beside its config
    saved = {k: os.environ.get(k) for k in nats_env()}
    os.environ.update(nats_env())  # the server process reads the NATS_PW_* references
    server = NatsServer(store_dir=str(store), extra_config='include "auth.conf"')
    try:
        server.start()
        yield server
    finally:
        server.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _settings(server: NatsServer, service: str) -> Settings:
    env = {**service_env(service), "LW_NATS_URL": server.url, "LW_REPLICAS": "1"}
    return Settings.from_env(env)


def test_services_run_a_loop_under_compose_permissions(secured: NatsServer, tmp_path: Path) -> None:
    # mcp-time: a bridge becomes ready (registers its MCP server's tools) under its permissions too.
    names = ["committer", "model-step", "tool-calculator", "tool-clock", "tool-kv-memory", "mcp-time"]
    here = {"LW_NATS_URL": secured.url, "LW_REPLICAS": "1", "PATH": VENV_PATH}
    services = Deployment({}, tmp_path)  # compose's own commands and environments are what is under test
    with services.sup:
        procs = [
            services.process(
                name,
                ["-m", "services.cli", *SERVICES[name]["command"]],
                service_env(name) | here,
                log_name=f"{name}.log",
            )
            for name in names
        ]
        services.start_all(procs, timeout=60)
        follower = subprocess.Popen(
            [sys.executable, str(ROOT / "examples/follow_steps.py")],
            env={**os.environ, **service_env("cli"), "LW_NATS_URL": secured.url, "PYTHONPATH": str(ROOT)}
            | {"LW_NATS_USER": "reader", "LW_NATS_PASSWORD": nats_env()["NATS_PW_READER"]}
            | {"LW_NATS_INBOX_PREFIX": "_INBOX_reader"},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            _wait_for_history_consumer(secured)
            log_start = len(secured.log_tail(1_000_000))
            answer, loop_id = anyio.run(_run_loop_as_operator, secured)
            out = _read_until(follower, loop_id)
        finally:
            follower.kill()
            follower.wait(10)
    assert "17*23 = 391" in answer and "Asia/Tokyo" in answer and "remembered 'colour'" in answer
    assert "calls=['calculator', 'clock', 'kv_memory']" in out  # examples/follow_steps.py, as the reader user
    new_log = secured.log_tail(1_000_000)[log_start:]
    assert "Violation" not in new_log, "a service needed a permission it lacks"


async def _run_loop_as_operator(server: NatsServer) -> tuple[str, str]:
    settings = _settings(server, "cli")
    nc = await connect(settings)
    try:
        client = LoopClient(nc, settings.names)
        loop_id = str(uuid.uuid4())
        await client.start(loop_id)
        res = await client.input(loop_id, "what is 17*23 and what time is it in Tokyo? remember that my colour is blue")
        with anyio.fail_after(30):
            done = await wait_for_turn(nc, settings.names, loop_id, res.command_id, res.seq)
        assert done.outcome == "done"
        return done.answer, loop_id
    finally:
        await nc.close()


def _wait_for_history_consumer(server: NatsServer) -> None:
    """Until examples/follow_steps.py's consumer exists on the history stream (it only sees what follows)."""
    import time

    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        for account in server.jsz().get("account_details") or []:
            for stream in account.get("stream_detail") or []:
                if stream.get("name") == "LW_HISTORY" and (stream.get("state") or {}).get("consumer_count"):
                    return
        time.sleep(0.05)
    raise AssertionError("examples/follow_steps.py never created its consumer")


def _read_until(proc: subprocess.Popen[str], needle: str) -> str:
    import threading

    lines: list[str] = []
    found = threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if needle in line and "calls=[" in line and "'calculator'" in line:
                found.set()
                return

    threading.Thread(target=read, daemon=True).start()
    assert found.wait(20), "".join(lines)
    return "".join(lines)


async def _violations(
    server: NatsServer, service: str, publish: tuple[str, ...] = (), subscribe: tuple[tuple[str, str], ...] = ()
) -> list[str]:
    """The errors the server reports to a connection of ``service``'s identity for these attempts."""
    env = service_env(service)
    seen: list[str] = []
    got = anyio.Event()

    async def on_error(e: Exception) -> None:
        seen.append(str(e))
        if len(seen) >= len(publish) + len(subscribe):
            got.set()

    nc = await nats.connect(
        server.url,
        user=env["LW_NATS_USER"],
        password=env["LW_NATS_PASSWORD"],
        inbox_prefix=env["LW_NATS_INBOX_PREFIX"],
        error_cb=on_error,
        allow_reconnect=False,
    )
    try:
        for subject in publish:
            await nc.publish(subject, b"{}")
        for subject, queue in subscribe:
            await nc.subscribe(subject, queue=queue)
        with anyio.fail_after(5):
            await got.wait()  # nats-py reports each violation through error_cb
    finally:
        await nc.close()
    return seen


@pytest.mark.anyio
async def test_permissions_refuse_what_they_should(secured: NatsServer) -> None:
    loop = "lw.hist." + str(uuid.uuid4())
    # Nobody but the committer writes history.
    for service in ("model-step", "tool-calculator", "cli"):
        seen = await _violations(secured, service, publish=(loop,))
        assert seen == [f'nats: permissions violation for publish to "{loop}"'], service
    # A tool worker serves its own subject in its own queue group, and reads no one else's inbox.
    seen = await _violations(
        secured,
        "tool-calculator",
        subscribe=(("lw.tool.clock", "tool_clock"), ("lw.tool.calculator", ""), ("_INBOX_model_step.>", "")),
    )
    assert len(seen) == 3 and all("permissions violation for subscription" in s for s in seen), seen
    # Nor may it commit or drive loops.
    seen = await _violations(secured, "tool-calculator", publish=("lw.commit.x", "lw.api.x.start"))
    assert len(seen) == 2 and all("permissions violation for publish" in s for s in seen), seen
    # Call records: a worker writes its own tool's only, model-step only step plans.
    seen = await _violations(
        secured, "tool-calculator", publish=("$KV.lw_results.tool.clock.x", "$KV.lw_results.step.x")
    )
    assert len(seen) == 2 and all("permissions violation for publish" in s for s in seen), seen
    seen = await _violations(secured, "model-step", publish=("$KV.lw_results.tool.calculator.x",))
    assert len(seen) == 1 and "permissions violation for publish" in seen[0], seen
    # The server logs violations (so the log check in the loop test above means something).
    assert "Violation" in secured.log_tail(1_000_000)
    # And the history stream refuses deletes and purges, whoever asks.
    assert await _history_guards(secured) == (True, True)


async def _history_guards(server: NatsServer) -> tuple[bool, bool]:
    settings = _settings(server, "committer")
    nc = await connect(settings)
    try:
        info = await nc.jetstream().stream_info(settings.names.history_stream)
        return bool(info.config.deny_delete), bool(info.config.deny_purge)
    finally:
        await nc.close()
