"""Real MCP servers for the bridge tests: the probe fixture server, ``mcp-server-time`` (PyPI, a dev
dependency) and ``@modelcontextprotocol/server-everything`` (npm, installed into a cache directory)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.syshelpers import debian_program

REPO = Path(__file__).resolve().parents[1]
PROBE = REPO / "tests" / "fixtures" / "mcp" / "probe_server.py"
EVERYTHING_PACKAGE = "@modelcontextprotocol/server-everything@2026.8.31"
NPM_CACHE = Path(os.environ.get("LW_NPM_CACHE", Path.home() / ".cache" / "loopwire-npm"))


def probe_command(*flags: str) -> list[str]:
    return [sys.executable, str(PROBE), *flags]


def time_command() -> list[str]:
    exe = Path(sys.executable).with_name("mcp-server-time")
    if not exe.exists():
        pytest.fail("mcp-server-time is a dev dependency: pip install -e '.[dev]'")
    return [str(exe), "--local-timezone=UTC"]


def everything_command() -> list[str]:
    """``node <server-everything>`` from the npm cache, installing it there once; skipped without npm
    (failed under CI, see :func:`tests.syshelpers.debian_program`)."""
    entry = NPM_CACHE / "node_modules" / "@modelcontextprotocol" / "server-everything" / "dist" / "index.js"
    if not entry.exists():
        debian_program("node", "nodejs")
        npm = debian_program("npm", "npm")
        NPM_CACHE.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [npm, "install", "--no-audit", "--no-fund", "--prefix", str(NPM_CACHE), EVERYTHING_PACKAGE],
            check=True,
            capture_output=True,
            timeout=300,
        )
    return [debian_program("node", "nodejs"), str(entry), "stdio"]


def start_everything_http(port: int) -> subprocess.Popen[str]:
    """server-everything over streamable HTTP on ``port``; returns once it listens."""
    command = everything_command()
    proc = subprocess.Popen(
        [*command[:2], "streamableHttp"],
        env={**os.environ, "PORT": str(port)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        if "listening on port" in line:
            return proc
    proc.kill()
    raise RuntimeError("server-everything (streamableHttp) did not start")
