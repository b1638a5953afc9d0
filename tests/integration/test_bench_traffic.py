"""bench/traffic.py: nats-server's own message counters (/varz), read from a real server."""

from __future__ import annotations

import anyio
import nats
import pytest

from bench.traffic import Traffic, snapshot
from tests import natsfixtures

pytestmark = pytest.mark.anyio


async def test_counts_what_the_server_routed() -> None:
    with natsfixtures.own_server() as server:
        nc = await nats.connect(server.url)
        got: list[bytes] = []

        async def on_msg(msg: nats.aio.msg.Msg) -> None:
            got.append(msg.data)

        try:
            await nc.subscribe("t.one", cb=on_msg)
            await nc.subscribe("t.two", cb=on_msg)
            await nc.subscribe("t.two", cb=on_msg)  # a second subscriber: two deliveries per message
            await nc.flush()
            before = snapshot([server.http_port])
            for _ in range(30):
                await nc.publish("t.one", b"x" * 100)
            for _ in range(20):
                await nc.publish("t.two", b"y" * 10)
            await nc.publish("t.nobody", b"z")  # received, delivered to no one
            await nc.flush()
            with anyio.fail_after(10):
                while len(got) < 70:
                    await anyio.sleep(0.01)
            after = snapshot([server.http_port])
        finally:
            await nc.close()
    delta = after - before
    assert delta == Traffic(in_msgs=51, out_msgs=70, in_bytes=30 * 100 + 20 * 10 + 1, out_bytes=30 * 100 + 40 * 10)
    per = delta.per_step(10, 1)
    assert per == {"in_msgs": 5.1, "out_msgs": 7.0, "in_bytes": 320.1, "out_bytes": 340.0, "nodes": 1}


async def test_snapshot_sums_over_servers() -> None:
    with natsfixtures.own_server() as a, natsfixtures.own_server() as b:
        ports = [a.http_port, b.http_port]
        before = snapshot(ports)
        for server, n in ((a, 3), (b, 4)):
            nc = await nats.connect(server.url)
            try:
                for _ in range(n):
                    await nc.publish("t.nobody", b"abcd")
                await nc.flush()
            finally:
                await nc.close()
        delta = snapshot(ports) - before
    assert (delta.in_msgs, delta.in_bytes, delta.out_msgs) == (7, 28, 0)
