"""Tests that need a Debian program skip with the reason where it is missing, and fail under CI."""

from __future__ import annotations

import pytest

from tests.syshelpers import debian_program


def test_a_missing_program_skips_with_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "")
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="chromium is not installed: apt-get install chromium"):
        debian_program("chromium", "chromium")


def test_under_ci_a_missing_program_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="prometheus is not installed"):
        debian_program("prometheus", "prometheus")


def test_a_present_program_is_found(monkeypatch: pytest.MonkeyPatch) -> None:
    assert debian_program("sh", "dash").endswith("/sh")
