"""compose.yaml's default topology in Docker: 3 NATS nodes, 2 committers, 2 model-steps, the tool
workers, 2 MCP bridges; the CLI as the operator. Loops end to end, scaled, through kills and stops;
every history checked from the stored records."""

from __future__ import annotations

import json
import time

import anyio
import docker
import pytest

from tests.containers.stack import BASE_IMAGE, PROJECT_IMAGE, ROOT, Stack, check_histories, finish_turns, start_turns
from tests.syshelpers import TOOL_TURN_HISTORY, debian_program

# The first test also builds the images (minutes on a fresh machine).
pytestmark = [pytest.mark.containers, pytest.mark.timeout(1800)]

LOOPWIRE_KINDS = ["committer", "model-step", "tool-calculator", "mcp-time"]
METRICS = "import urllib.request as u; print(u.urlopen('http://127.0.0.1:9464/metrics').read().decode())"
GRACE_S = 40  # compose.yaml's stop_grace_period


def test_a_loop_runs_end_to_end_through_compose_run_cli(stack: Stack) -> None:
    loop_id = stack.cli("start").strip().splitlines()[-1]
    answer = stack.cli("send", loop_id, "what is 17*23?", "--wait")
    assert "17*23 = 391" in answer
    kinds = anyio.run(check_histories, stack, [loop_id])
    assert kinds[loop_id] == TOOL_TURN_HISTORY
    assert '"type":"TurnDone"' in stack.cli("history", loop_id, "--json")
    assert "Violation" not in stack.nats_logs(), "a service needed a permission it lacks"


def test_the_image_runs_as_a_user_and_every_service_is_healthy(stack: Stack) -> None:
    user = docker.from_env().images.get(PROJECT_IMAGE).attrs["Config"]["User"]
    assert user == "loopwire"
    for kind in [*LOOPWIRE_KINDS, "tool-clock", "tool-kv-memory"]:
        for c in stack.containers(kind):
            c.reload()
            assert c.attrs["State"]["Health"]["Status"] == "healthy", c.name
            code, out = c.exec_run(["python3", "-c", METRICS])
            assert code == 0 and b"loopwire_ready 1.0" in out, c.name  # started and serving
    assert len(stack.containers("committer")) == 2 and len(stack.containers("model-step")) == 2


def test_prometheus_finds_and_scrapes_every_service(stack: Stack) -> None:
    """The observe profile's Prometheus config, run by Debian's prometheus on the stack's network:
    its DNS discovery finds every replica and each /metrics answers."""
    prometheus = debian_program("prometheus", "prometheus")
    client = docker.from_env()
    c = client.containers.run(
        BASE_IMAGE,  # bookworm, like the host's Debian prometheus binary
        [
            "/usr/bin/prometheus",
            "--config.file=/etc/prometheus/prometheus.yml",
            "--storage.tsdb.path=/tmp/tsdb",
            "--web.listen-address=127.0.0.1:9090",
        ],
        volumes={
            prometheus: {"bind": "/usr/bin/prometheus", "mode": "ro"},
            str(ROOT / "deploy/prometheus"): {"bind": "/etc/prometheus", "mode": "ro"},
        },
        network=f"{stack.project}_default",
        detach=True,
    )
    probe = "import urllib.request as u; print(u.urlopen('http://127.0.0.1:9090/api/v1/targets').read().decode())"
    try:
        deadline = time.monotonic() + 90
        while True:
            code, out = c.exec_run(["python3", "-c", probe])
            targets = json.loads(out)["data"]["activeTargets"] if code == 0 else []
            up = {t["labels"]["service"] for t in targets if t["health"] == "up"}
            if len(up) == 11 or time.monotonic() > deadline:
                break
            time.sleep(2)
    finally:
        logs = c.logs().decode()[-3000:]
        c.remove(force=True)
    assert len(up) == 11, (sorted(up), logs)
    assert len([t for t in targets if t["labels"]["service"] == "committer"]) == 2  # each replica


def test_loops_finish_on_a_scaled_stack(stack: Stack) -> None:
    stack.up("--scale", "model-step=3", "--scale", "tool-calculator=3")
    assert len(stack.containers("model-step")) == 3 and len(stack.containers("tool-calculator")) == 3
    turns = anyio.run(start_turns, stack, 24)
    outcomes = anyio.run(finish_turns, stack, turns, 120)
    assert [o.outcome for o in outcomes] == ["done"] * 24
    assert all("391" in o.answer for o in outcomes)
    kinds = anyio.run(check_histories, stack, [t[0] for t in turns])
    odd = {i: k for i, k in kinds.items() if k != TOOL_TURN_HISTORY}
    assert odd == {}, odd


def test_killing_a_nats_node_and_a_model_step_mid_traffic_loses_nothing(stack: Stack) -> None:
    nats_2 = stack.containers("nats-2")[0]
    model_step = stack.containers("model-step")[0]

    async def traffic() -> list[tuple[str, str, int]]:
        turns = await start_turns(stack, 15)
        nats_2.kill()  # SIGKILL: no drain, no goodbye
        model_step.kill()
        return turns + await start_turns(stack, 15)

    try:
        turns = anyio.run(traffic)
        outcomes = anyio.run(finish_turns, stack, turns, 180)
        assert [o.outcome for o in outcomes] == ["done"] * len(turns)
        kinds = anyio.run(check_histories, stack, [t[0] for t in turns])
        odd = {i: k for i, k in kinds.items() if k != TOOL_TURN_HISTORY}
        assert odd == {}, odd
    finally:
        # The killed ones back, whatever happened: a killed container stays exited (137), restart
        # policy or not, and the next test would stop that one instead of a running one.
        stack.up("--scale", "model-step=3", "--scale", "tool-calculator=3")


def test_docker_stop_of_each_kind_exits_within_the_grace_period(stack: Stack) -> None:
    turns = anyio.run(start_turns, stack, 10)  # some work in flight while they stop
    took: dict[str, float] = {}
    for kind in LOOPWIRE_KINDS:
        c = stack.containers(kind)[0]
        assert c.status == "running", f"{c.name} is {c.status} before the stop"
        t = time.monotonic()
        c.stop(timeout=GRACE_S)
        took[kind] = time.monotonic() - t
        c.reload()
        assert c.attrs["State"]["ExitCode"] == 0, f"{kind}: exit {c.attrs['State']['ExitCode']} (not a drain)"
        assert not c.attrs["State"]["OOMKilled"]
    print("docker stop (s):", {k: round(v, 2) for k, v in took.items()})
    assert all(s < GRACE_S - 5 for s in took.values()), took
    outcomes = anyio.run(finish_turns, stack, turns, 180)  # the other replicas finish the work
    assert [o.outcome for o in outcomes] == ["done"] * len(turns)
    anyio.run(check_histories, stack, [t[0] for t in turns])
