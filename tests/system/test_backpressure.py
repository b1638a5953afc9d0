"""Slow consumers and back-pressure.

* Consumers that follow every live event and every history record but read slowly (blocking the
  whole process, so the server sees a slow TCP client) do not slow down or break the services:
  the same load takes comparable time with and without them.
* A model-step replica never holds more work items than it has free slots: with
  LW_MODEL_STEP_CONCURRENCY=2 and 2 replicas, the items delivered to the replicas and not yet
  answered (acked, nak'd or terminated), counted on the wire, stay ≤ 4 while many more loops wait in
  the queue. The server's num_ack_pending is not that count: an item nak'd with a delay (its loop is
  driven by the other replica) stays in it until redelivered, held by no replica.
"""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path
from typing import Any

import anyio
import pytest
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from shared.connect import connect
from shared.natsserver import NatsServer
from shared.settings import Settings
from tests import natsfixtures
from tests.system import reports
from tests.system.faultchecks import verify_loop
from tests.system.faultload import Load
from tests.system.faultscript import script, write_model
from tests.system.fleet import Fleet, fleet

pytestmark = [pytest.mark.anyio, pytest.mark.system, pytest.mark.timeout(600)]

LOOPS = 20


def varz(server: NatsServer) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.http_port}/varz", timeout=2) as r:
        doc: dict[str, Any] = json.loads(r.read())
    return doc


def connz(server: NatsServer) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.http_port}/connz?limit=1024", timeout=2) as r:
        doc: dict[str, Any] = json.loads(r.read())
    return list(doc.get("connections") or [])


class HeldItems:
    """Work items delivered to model-step replicas and not yet answered, seen on the wire.

    Every delivery carries its own ack subject as reply; the answer (an ack — empty or +ACK —, -NAK,
    +TERM) is published to exactly that subject, so a delivery is held from when it is seen until its answer is.
    """

    def __init__(self, ack_prefix: str) -> None:
        self.ack_prefix = ack_prefix
        self.open: set[str] = set()
        self.most = 0
        self.delivered = 0
        self.naks = 0

    @classmethod
    async def watch(cls, nc: NATS, settings: Settings) -> HeldItems:
        n = settings.names
        held = cls(f"$JS.ACK.{n.work_stream}.{n.work_consumer}.")
        # One subscription, so deliveries and answers are seen in the order the server routed them
        # (each subscription of nats-py runs its callbacks in a task of its own).
        await nc.subscribe(">", cb=held._on_msg)
        await nc.flush()
        return held

    async def _on_msg(self, m: Msg) -> None:
        if m.subject.startswith(self.ack_prefix):
            if m.data.startswith(b"+WPI"):  # "still working on it": held on
                return
            self.naks += m.data.startswith(b"-NAK")
            self.open.discard(m.subject)
        elif m.reply.startswith(self.ack_prefix):
            self.delivered += 1
            self.open.add(m.reply)
            self.most = max(self.most, len(self.open))


async def timed_load(f: Fleet, settings: Settings, model: str) -> float:
    nc = await connect(settings)
    try:
        load = Load(nc, settings, model, LOOPS)
        t0 = time.monotonic()
        await load.run(timeout=180)
        wall = time.monotonic() - t0
        assert load.completed == LOOPS
        for st in load.loops.values():
            c = await verify_loop(nc, settings, st)
            assert not c.violations, c.violations
    finally:
        await nc.close()
    return wall


async def test_slow_consumers_of_every_event_do_not_slow_the_services(nats_server: NatsServer, tmp_path: Path) -> None:
    settings = Settings.from_env({}, nats_urls=(nats_server.url,), prefix=natsfixtures.unique_prefix())
    model = write_model(tmp_path, script(), "script.json")
    counts = {"committer": 1, "model-step": 2, "tools-calc": 1, "tools-sleep": 1}
    with fleet(settings, counts=counts, log_dir=tmp_path / "logs") as f:
        without = await timed_load(f, settings, model)
        slow = [
            f.deployment.start(
                "slow-consumer",
                ["-m", "tests.system.slow_consumer"],
                {"LW_SLOW_SECONDS": "0.05", "LW_SLOW_STATUS": str(tmp_path / f"slow{i}.status")},
                timeout=60,
            )
            for i in range(2)
        ]
        with_slow = await timed_load(f, settings, model)
        handled = [int((tmp_path / f"slow{i}.status").read_text() or 0) for i in range(len(slow))]
        nc = await connect(settings)
        try:
            records = (await nc.jetstream().stream_info(settings.names.history_stream)).state.messages
        finally:
            await nc.close()
        backlog = [c.get("pending_bytes", 0) for c in connz(nats_server) if c.get("name") == "slow-consumer"]
        alive = [p.running for p in slow]
        for p in slow:
            p.stop(timeout=5)
        cut_off = varz(nats_server).get("slow_consumers", 0)
    figures = {
        "without_s": round(without, 1),
        "with_slow_consumers_s": round(with_slow, 1),
        "history_records": records,
        "messages_each_slow_consumer_had_read": handled,
        "server_pending_bytes_for_them": backlog,
        "server_slow_consumer_disconnects": cut_off,
    }
    reports.add_figure("slow consumers (20 loops × 10 steps)", figures)
    print(figures)
    assert all(alive), "the slow consumers were expected to keep running (they are slow, not broken)"
    # they were far behind (each history record alone reaches them twice) when the load had finished
    assert all(h < records for h in handled), figures
    # generous: the machine is shared; a service waiting for the slow readers would take far longer
    assert with_slow <= 2.0 * without + 10.0, figures


async def test_model_step_never_pulls_more_work_than_it_has_slots(nats_server: NatsServer, tmp_path: Path) -> None:
    slots, replicas, loops = 2, 2, 16
    settings = Settings.from_env({}, nats_urls=(nats_server.url,), prefix=natsfixtures.unique_prefix())
    step = [
        {"sleep": 0.3},
        {"kind": "tool_use", "index": 0, "id": "c_{k}", "name": "calculator"},
        {"kind": "tool_use", "index": 0, "text": '{"expression": "1+1"}'},
        {"kind": "finish", "finish_reason": "tool_use"},
    ]
    model = write_model(tmp_path, [step, step, [{"sleep": 0.3}, {"kind": "text", "text": "done"}]], "slow.json")
    counts = {"committer": 1, "model-step": replicas, "tools-calc": 1}
    env = {"LW_MODEL_STEP_CONCURRENCY": str(slots)}
    queued: list[int] = []
    with fleet(settings, counts=counts, env=env, log_dir=tmp_path / "logs"):
        nc = await connect(settings)
        try:
            js = nc.jetstream(timeout=5)
            held = await HeldItems.watch(nc, settings)
            load = Load(nc, settings, model, loops, policy={})

            async def sample(_: Load) -> None:
                n = settings.names
                while load.completed < loops:
                    info = await js.consumer_info(n.work_stream, n.work_consumer)
                    queued.append(int(info.num_pending or 0))
                    await anyio.sleep(0.05)

            await load.run(sample, timeout=180)
        finally:
            await nc.close()
    assert load.completed == loops
    figures = {
        "slots_x_replicas": slots * replicas,
        "max_items_held": held.most,
        "items_delivered": held.delivered,
        "naks": held.naks,
        "max_queued": max(queued),
        "samples": len(queued),
    }
    reports.add_figure("model-step pull bound", figures)
    print(figures)
    assert held.delivered >= loops, f"the wire watch saw too few deliveries: {figures}"
    assert held.most <= slots * replicas, figures
    assert max(queued) >= loops - slots * replicas - 2, f"the queue was never long: {figures}"
