"""Shared fixtures: real nats-server processes on free loopback ports (see tests/natsfixtures.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from nats.aio.client import Client as NATS

from shared.connect import connect
from shared.natsserver import NatsCluster, NatsServer
from shared.settings import Settings
from tests import natsfixtures


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """The container tests import the ``docker`` extra's packages: they are not even collected by a
    run that deselects them (the default ``-m 'not containers'``); ``-m containers`` selects them."""
    if collection_path.name == "containers" and "not containers" in (config.getoption("markexpr") or ""):
        return True
    return None


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    # nats-py is asyncio-only.
    return "asyncio"


@pytest.fixture(scope="session")
def nats_url() -> Iterator[str]:
    """One server for the whole session; isolate with the ``settings`` fixture's unique prefix."""
    with natsfixtures.shared_server_url() as url:
        yield url


@pytest.fixture
def settings(nats_url: str) -> Settings:
    """Settings pointing at the shared server with a prefix (subjects, streams, buckets) of its own."""
    return Settings.from_env({}, nats_urls=(nats_url,), prefix=natsfixtures.unique_prefix())


@pytest.fixture
async def nc(settings: Settings) -> AsyncIterator[NATS]:
    conn = await connect(settings, name="test")
    try:
        yield conn
    finally:
        await conn.close()


@pytest.fixture
def nats_server() -> Iterator[NatsServer]:
    """A server of this test's own, free to kill and restart."""
    with natsfixtures.own_server() as server:
        yield server


@pytest.fixture(scope="module")
def nats_cluster() -> Iterator[NatsCluster]:
    """A 3-node JetStream cluster shared by a test module. Tests that kill nodes restart them."""
    with natsfixtures.own_cluster() as cluster:
        yield cluster
