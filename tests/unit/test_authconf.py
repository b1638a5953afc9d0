"""deploy/nats/auth.conf is the generator's output (``loopwire auth-config --shards N``) for its N."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from services.authconf import auth_config
from services.cli.app import main

SHIPPED = Path(__file__).resolve().parents[2] / "deploy" / "nats" / "auth.conf"


def _shipped_shards() -> int:
    found = re.search(r"LW_PREFIX=lw, (\d+) shards?\)", SHIPPED.read_text())
    assert found, "auth.conf's first line names its shard count"
    return int(found.group(1))


def test_the_shipped_auth_conf_is_the_generator_s_output(capsys: pytest.CaptureFixture[str]) -> None:
    n = _shipped_shards()
    assert SHIPPED.read_text() == auth_config(n)
    assert main(["auth-config", "--shards", str(n)]) == 0
    assert capsys.readouterr().out == SHIPPED.read_text()


def test_every_shard_is_granted_to_every_identity_that_uses_one() -> None:
    text = auth_config(4)
    for k in (1, 2, 3):
        assert f'"lw.hist_{k}.>"' in text  # the committer's writes, everyone else's deny
        assert f'"$KV.lw_leases_{k}.>"' in text
        assert f'"$KV.lw_results_{k}.tool.calculator.>"' in text
        assert f'"$JS.API.DIRECT.GET.LW_HISTORY_{k}.>"' in text
    assert '"lw.hist_4.>"' not in text
    assert text.count('"lw.services"') == 2 + 8 + 1 + 1  # each service answers, the operator asks


def test_a_shard_count_out_of_range_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["auth-config", "--shards", "0"]) == 1
    assert capsys.readouterr().err == "error: --shards must be 1-64, got 0\n"
