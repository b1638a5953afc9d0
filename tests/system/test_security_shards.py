"""A 3-shard deployment under the generated permissions (deploy/nats/auth.conf, ``loopwire auth-config``):
every service kind runs under its own identity on a 3-node cluster enforcing them, and loops of every
shard run end to end driven by the CLI as the operator, with no permission violation logged."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import anyio
import pytest

from services.deployment import Deployment, service_env
from shared.client import LoopClient
from shared.connect import connect
from shared.settings import Settings
from tests.syshelpers import System, write_script
from tests.system.natssec import identity_env, secured_cluster

pytestmark = [pytest.mark.anyio, pytest.mark.system, pytest.mark.cluster, pytest.mark.timeout(600)]

ROLE_USERS = {"committer": "committer", "model-step": "model_step", "tools-calculator": "tool_calculator"}


def _calc_step() -> list[dict[str, object]]:
    return [
        {"kind": "tool_use", "index": 0, "id": "call_0_{k}", "name": "calculator"},
        {"kind": "tool_use", "index": 0, "text": '{"expression": "6*7"}'},
        {"kind": "finish", "finish_reason": "tool_use"},
    ]


async def test_every_service_kind_runs_a_three_shard_deployment_under_the_generated_permissions(
    tmp_path: Path,
) -> None:
    with secured_cluster(tmp_path / "nats") as sc:
        base = service_env(sc.urls, "lw", 3)  # no LW_SHARDS: every process but the creator reads it
        roles = {role: identity_env(sc, user) for role, user in ROLE_USERS.items()}
        roles["committer"]["LW_SHARDS"] = "3"  # the first service creates the deployment with 3 shards
        operator_env = {**os.environ, **base, **identity_env(sc, "operator"), "COLUMNS": "200"}
        operator = Settings.from_env(operator_env)
        model = write_script(tmp_path, {"responses": [_calc_step(), "42 it is"]}, "calc.json")
        sizes = [len(n.log_tail(1_000_000)) for n in sc.cluster.nodes]
        with tempfile.TemporaryDirectory(prefix="lw-sec-") as d:
            s = System(operator, Deployment(base, Path(d), roles))
            with s.deployment.stopped_on_exit():
                s.committer()
                s.tools("calculator")
                s.model_step()
                nc = await connect(operator, name="test-operator")
                try:
                    names = Settings.from_env({**base, "LW_SHARDS": "3"}).names
                    ids: dict[int, str] = {}
                    while len(ids) < 3:
                        loop_id = str(uuid.uuid4())
                        ids.setdefault(names.shard_of(loop_id), loop_id)
                    for loop_id in ids.values():
                        await LoopClient(nc, names, timeout=30).start(loop_id, model=model)
                finally:
                    await nc.close()

                def cli(*argv: str) -> subprocess.CompletedProcess[str]:
                    cmd = [sys.executable, "-m", "services.cli", *argv]
                    return subprocess.run(cmd, env=operator_env, capture_output=True, text=True, timeout=90)

                for loop_id in ids.values():
                    done = await anyio.to_thread.run_sync(lambda x=loop_id: cli("send", x, "compute", "--wait"))
                    assert done.returncode == 0 and "42 it is" in done.stdout, done.stdout + done.stderr + s.logs()
                done = await anyio.to_thread.run_sync(lambda: cli("loops", "--json"))
                assert done.returncode == 0, done.stderr
                assert sorted(json.loads(x)["loop_id"] for x in done.stdout.splitlines()) == sorted(ids.values())
                done = await anyio.to_thread.run_sync(lambda: cli("streams", "--json"))
                assert done.returncode == 0, done.stderr
                assert {json.loads(x)["shard"] for x in done.stdout.splitlines()} == {0, 1, 2}
                done = await anyio.to_thread.run_sync(lambda: cli("shards", "--json"))
                assert done.returncode == 0 and json.loads(done.stdout)["services"] == 3, done.stdout + done.stderr
        logs = [n.log_tail(1_000_000)[size:] for n, size in zip(sc.cluster.nodes, sizes, strict=True)]
        denied = [line for text in logs for line in text.splitlines() if "iolation" in line]
        assert not denied, denied[:10]
