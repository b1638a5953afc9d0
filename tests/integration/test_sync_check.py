"""Every nats-server loopwire starts syncs each JetStream write (sync_interval: always) unless
LW_NATS_SYNC=default opts out, and a service warns, once per server, about a server that does not."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.deployment import Deployment, service_command
from services.embedded import EmbeddedStack
from services.synccheck import check_one, varz, warn_unless_synced
from shared.natsserver import NatsServer, NatsServerError, free_port, server_binary, sync_from_env
from shared.settings import Settings
from tests import natsfixtures

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def lazy_server() -> Iterator[NatsServer]:
    """A server with nats-server's own sync interval (the opt-out)."""
    server = NatsServer(name="lazy", sync="default").start()
    try:
        yield server
    finally:
        server.cleanup()


@pytest.fixture(scope="module")
def synced_server() -> Iterator[NatsServer]:
    server = NatsServer(name="synced").start()
    try:
        yield server
    finally:
        server.cleanup()


def test_servers_sync_always_by_default(synced_server: NatsServer, lazy_server: NatsServer) -> None:
    assert synced_server.sync == "always"
    assert "sync_interval: always" in synced_server.config()
    config = varz(synced_server.monitor_url)["jetstream"]["config"]
    assert config["sync_always"] is True
    lazy = varz(lazy_server.monitor_url)["jetstream"]["config"]
    assert not lazy.get("sync_always")
    assert lazy["sync_interval"] == 120 * 10**9  # nats-server's default: 2 minutes


def test_the_opt_out_and_a_bad_value(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LW_NATS_SYNC", "default")
    assert sync_from_env() == "default"
    assert "sync_interval" not in NatsServer(store_dir="/x").config()
    monkeypatch.setenv("LW_NATS_SYNC", "sometimes")
    with pytest.raises(NatsServerError, match="LW_NATS_SYNC must be one of always, default"):
        sync_from_env()


def test_deploy_config_syncs_always() -> None:
    conf = (ROOT / "deploy/nats/nats.conf").read_text()
    assert "sync_interval: always" in conf.split("jetstream {", 1)[1].split("}", 1)[0]
    # nats-server 2.15 accepts it (the config itself is parsed by tests/integration/test_compose.py)
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "js.conf"
        path.write_text(f'jetstream {{ store_dir: "{d}", sync_interval: always }}\n')
        done = subprocess.run([server_binary(), "-t", "-c", str(path)], capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stderr


async def test_one_warning_per_server_that_does_not_sync(
    synced_server: NatsServer, lazy_server: NatsServer, caplog: pytest.LogCaptureFixture
) -> None:
    unreachable = f"http://127.0.0.1:{free_port()}"
    settings = Settings.from_env(
        {}, nats_urls=(synced_server.url,), nats_monitor_urls=(synced_server.monitor_url, lazy_server.monitor_url)
    )
    caplog.set_level("WARNING", logger="loopwire.synccheck")
    warnings = await warn_unless_synced(settings)
    assert len(warnings) == 1
    assert "nats-server lazy" in warnings[0] and "sync_interval 120s" in warnings[0]
    assert [r.getMessage() for r in caplog.records] == warnings
    assert "cannot read /varz" in (check_one(unreachable) or "")


def test_a_service_logs_the_warning_at_start_up(
    synced_server: NatsServer, lazy_server: NatsServer, tmp_path: Path
) -> None:
    settings = Settings.from_env(
        {},
        nats_urls=(synced_server.url,),
        prefix=natsfixtures.unique_prefix(),
        nats_monitor_urls=(synced_server.monitor_url, lazy_server.monitor_url),
    )
    d = Deployment.for_settings(settings, tmp_path)
    with d.stopped_on_exit():
        p = d.start("committer", service_command("committer"))
        log = Path(p.log_path)
        for _ in range(100):
            if "does not sync" in log.read_text():
                break
            time.sleep(0.05)
    lines = [line for line in log.read_text().splitlines() if "does not sync" in line]
    assert len(lines) == 1 and "nats-server lazy" in lines[0] and "WARNING" in lines[0], lines


def test_the_embedded_stack_syncs_and_checks_its_server(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LW_NATS_MONITOR_URL", "http://elsewhere:8222")  # another deployment's: not inherited
    stack = EmbeddedStack(server=NatsServer(name="loopwire", store_dir="/x"))
    assert "sync_interval: always" in stack.server.config()  # type: ignore[union-attr]
    assert stack.env()["LW_NATS_MONITOR_URL"] == stack.server.monitor_url  # type: ignore[union-attr]


def test_a_bad_sync_setting_is_one_error_line(tmp_path: Path) -> None:
    env = {**os.environ, "LW_NATS_SYNC": "sometimes", "TMPDIR": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-m", "services.cli", "demo", "--plain"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    line = done.stderr.strip()  # one line; a failed start names the logs it kept
    assert "\n" not in line, done.stderr
    assert line.startswith("error: could not start: LW_NATS_SYNC must be one of always, default, not 'sometimes'")
    assert "Traceback" not in done.stdout + done.stderr
