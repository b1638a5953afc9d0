"""``python -m services.committer`` as an OS process: --help, READY, serving, graceful SIGTERM."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from services.deployment import Deployment
from shared.client import CommitClient, LoopClient
from shared.connect import connect
from shared.protocol import UnavailableError
from shared.settings import Settings
from tests.integration.committer_fixtures import new_id, step


def test_help() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "services.committer", "--help"], capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 0
    assert "--nats-url" in out.stdout and "--replicas" in out.stdout and "LW_" in out.stdout


@pytest.mark.anyio
async def test_process_serves_then_stops_gracefully(settings: Settings, tmp_path: Path) -> None:
    committer = Deployment.for_settings(settings, tmp_path, env={"LW_MODEL": "scripted:x"})
    proc = committer.start("committer", ["-m", "services.committer"], timeout=30)  # the entry under test
    nc = await connect(settings, name="process-test")
    try:
        api = LoopClient(nc, settings.names, 5)
        loop = await api.start()
        await CommitClient(nc, settings.names, 5).commit(loop.loop_id, loop.seq, [step(loop.loop_id, new_id())])
        assert proc.stop() == 0, proc.log_tail()
        assert "draining" in proc.log_tail(200)
        with pytest.raises(UnavailableError):
            await api.input(loop.loop_id, "anyone there?")
    finally:
        proc.stop()
        await nc.close()
