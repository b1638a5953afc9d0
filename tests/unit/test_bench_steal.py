"""The benchmark states how much CPU time the hypervisor took during a run (bench/common.py)."""

from __future__ import annotations

import sys

import pytest

from bench.common import cpu_stat, steal_share


def test_the_share_of_steal_between_two_readings() -> None:
    before = [100, 0, 50, 800, 10, 0, 5, 35, 0, 0]
    after = [400, 0, 150, 1100, 10, 0, 5, 335, 0, 0]  # 300 user, 100 system, 300 idle, 300 steal
    assert steal_share(before, after) == pytest.approx(0.3)
    assert steal_share(before, before) is None  # no time passed
    assert steal_share(None, after) is None
    assert steal_share([1, 2, 3], [4, 5, 6]) is None  # a kernel without the steal column


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/stat is Linux's")
def test_this_machine_is_read() -> None:
    before = cpu_stat()
    assert before is not None and len(before) >= 8
    share = steal_share(before, [x + 1 for x in before])
    assert share == pytest.approx(1 / 8)
