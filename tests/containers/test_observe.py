"""The "observe" profile's configuration, loaded by the programs themselves where Debian ships them
(Prometheus: promtool here, and a live scrape of the stack in test_stack.py); Grafana and Jaeger are
not in Debian, so their provisioning is checked for what Grafana would refuse or silently drop."""

from __future__ import annotations

import json
import re
import subprocess

import pytest
import yaml

from tests.containers.stack import ROOT
from tests.syshelpers import debian_program

pytestmark = pytest.mark.containers


def test_promtool_accepts_the_prometheus_config() -> None:
    promtool = debian_program("promtool", "prometheus")
    proc = subprocess.run(
        [promtool, "check", "config", str(ROOT / "deploy/prometheus/prometheus.yml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout + proc.stderr


def test_grafana_dashboards_use_only_provisioned_datasources() -> None:
    sources = yaml.safe_load((ROOT / "deploy/grafana/provisioning/datasources/loopwire.yaml").read_text())
    uids = {d["uid"] for d in sources["datasources"]}
    assert uids == {"prometheus", "jaeger"}
    provider = yaml.safe_load((ROOT / "deploy/grafana/provisioning/dashboards/loopwire.yaml").read_text())
    # compose mounts deploy/grafana/dashboards there
    assert provider["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards"
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())
    assert "./deploy/grafana/dashboards:/var/lib/grafana/dashboards:ro" in compose["services"]["grafana"]["volumes"]
    for path in (ROOT / "deploy/grafana/dashboards").glob("*.json"):
        board = json.loads(path.read_text())
        used = {p["datasource"]["uid"] for p in board["panels"] if isinstance(p.get("datasource"), dict)}
        assert used and used <= uids, f"{path.name}: {used - uids}"
        for panel in board["panels"]:
            for target in panel.get("targets", []):
                assert re.search(r"loopwire_\w+", target.get("expr", "loopwire_")), target
