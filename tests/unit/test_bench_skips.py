"""The benchmark skips, with the reason, what this environment cannot run (bench/peers, bench/plot)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.peers import REQUIRES, missing
from bench.plot import plot


def test_a_peer_without_its_module_or_program_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(REQUIRES, "dbos", (("json", "no_such_module_xyz.sub"), ()))
    assert missing("dbos") == "Python module no_such_module_xyz.sub not installed (pip install -e '.[bench]')"
    monkeypatch.setitem(REQUIRES, "dbos", (("json",), ("no-such-program-xyz",)))
    assert missing("dbos") == "no-such-program-xyz not installed"
    monkeypatch.setitem(REQUIRES, "dbos", (("json",), ("python3",)))
    assert missing("dbos") is None


def test_loopwire_needs_nothing_more_and_unknown_systems_are_named() -> None:
    assert missing("loopwire") is None
    assert missing("loopwire-r3") is None
    reason = missing("temporal")
    assert reason is not None and reason.startswith("unknown system")


def test_the_plot_says_why_it_was_not_drawn(tmp_path: Path) -> None:
    assert plot({}, tmp_path / "p.png").startswith("skipped: neither the peers nor the floor")
    assert not (tmp_path / "p.png").exists()
