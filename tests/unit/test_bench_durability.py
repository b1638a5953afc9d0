"""The durability benchmark's server config (bench/natsconf.py): the fsync policy asked for, and only it."""

from __future__ import annotations

import pytest

from bench.durability import Round, report
from bench.natsconf import SYNC_ALWAYS, SYNC_DEFAULT, SyncedNatsServer
from shared.natsserver import NatsServer


def _jetstream_line(server: SyncedNatsServer) -> str:
    (line,) = [x for x in server.config().splitlines() if x.startswith("jetstream {")]
    return line


def test_the_policy_asked_for_is_the_only_one_in_the_jetstream_block() -> None:
    always = SyncedNatsServer(store_dir="/tmp/x", sync_interval=SYNC_ALWAYS)
    assert _jetstream_line(always).endswith(", sync_interval: always }")
    assert "store_dir" in _jetstream_line(always)
    assert "sync_interval" not in SyncedNatsServer(store_dir="/tmp/x", sync_interval=SYNC_DEFAULT).config()


def test_a_policy_already_in_the_shared_config_is_replaced(monkeypatch: pytest.MonkeyPatch) -> None:
    plain = NatsServer(store_dir="/tmp/x").config()
    with_policy = plain.replace("max_file_store: 4GB", "max_file_store: 4GB, sync_interval: 10s")
    assert with_policy != plain
    monkeypatch.setattr(NatsServer, "config", lambda self: with_policy)
    line = _jetstream_line(SyncedNatsServer(store_dir="/tmp/x", sync_interval=SYNC_ALWAYS))
    assert line.count("sync_interval") == 1 and line.endswith(", sync_interval: always }")
    assert "sync_interval" not in SyncedNatsServer(store_dir="/tmp/x").config()


def test_the_report_gives_the_ratio_of_the_medians() -> None:
    rounds = [Round(SYNC_DEFAULT, 200, 50, 20, 40, 2000), Round(SYNC_ALWAYS, 100, 60, 80, 200, 500)]
    text = report(rounds, 64, 30)
    assert "steps/s ×0.50" in text and "commit p50 ms ×4.00" in text
