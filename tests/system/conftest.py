"""System-suite options: ``--long`` (or ``LW_LONG=1``) runs the fault scenarios at full size.

``pytest tests/system --long`` works when tests/system is on the command line (pytest reads this
file's options only then); ``LW_LONG=1 pytest tests`` works from anywhere.
"""

from __future__ import annotations

import os

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--long",
        action="store_true",
        default=False,
        help="run the system fault suite at full size (100 concurrent loops × 10 steps per scenario)",
    )


def long_mode(config: pytest.Config) -> bool:
    flag = False
    try:
        flag = bool(config.getoption("--long"))
    except ValueError:  # option not registered (this conftest was not an initial one)
        flag = False
    return flag or os.environ.get("LW_LONG", "").strip() not in ("", "0")


@pytest.fixture(scope="session")
def long_run(request: pytest.FixtureRequest) -> bool:
    return long_mode(request.config)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    from tests.system import reports

    text = reports.summary()
    if text:
        terminalreporter.write_sep("=", "loopwire reliability")
        terminalreporter.write_line(text)
