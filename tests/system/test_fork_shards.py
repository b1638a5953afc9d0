"""A fork in another shard than its source's does not depend on the source's shard once written.

The fork's first record carries what its source had done after the fork point, so its later steps
(and the re-execution decisions they take) complete with the source's stream gone, or its leader
killed. Three shards; every service its own process; checked from the stored records, the ledger
and the JetStream API requests seen on the wire.
"""

from __future__ import annotations

import signal
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from services.model_step.gates import FORK_RUNNING_SUMMARY
from shared import events as ev
from shared import placement, shaping
from shared.client import LoopClient
from shared.content import ToolResultMessage, text_of
from shared.natsserver import NatsCluster, NatsServer
from shared.settings import Settings
from tests.syshelpers import history, wait_history
from tests.system.clusterops import restore_cluster
from tests.system.faultscript import write_model
from tests.system.test_fork import _call, finished, held_call, ledger_runs, ledger_stack

pytestmark = [pytest.mark.anyio, pytest.mark.system, pytest.mark.timeout(240)]


@pytest.fixture
async def env(nats_server: NatsServer, tmp_path: Path) -> AsyncIterator[tuple[NATS, Settings, LoopClient, Path]]:
    async with ledger_stack((nats_server.url,), tmp_path, {"LW_SHARDS": "3"}) as stack:
        yield stack


def _id_in(settings: Settings, shard: int) -> str:
    return next(i for i in (str(uuid.uuid4()) for _ in range(1000)) if settings.names.shard_of(i) == shard)


async def test_a_fork_takes_its_sources_results_with_the_sources_shard_gone(
    env: tuple[NATS, Settings, LoopClient, Path], tmp_path: Path
) -> None:
    nc, settings, api, ledger = env
    # Turn 1 answers; turn 2 calls the ledger (after the fork point below) and answers.
    model = write_model(tmp_path, {"responses": ["one done", _call("ledger", "x"), "two done"]}, "m.json")
    source = (await api.start(_id_in(settings, 1), model=model)).loop_id
    await api.input(source, "one")
    await wait_history(nc, settings, source, lambda h: finished(h) and h.turns == 1, timeout=60)
    at = max(s for s, e in await history(nc, settings, source) if isinstance(e, ev.TurnDone))
    await api.input(source, "two")
    await wait_history(nc, settings, source, lambda h: finished(h) and h.turns == 2, timeout=60)
    assert ledger_runs(ledger, "ledger") == 1
    # The fork rests at the end of turn 1, in shard 2: nothing of it runs before its next input.
    fork = (await api.fork(source, at=at, reexecution={"ledger": "reuse"}, loop_id=_id_in(settings, 2))).loop_id
    first = (await history(nc, settings, fork))[0][1]
    assert isinstance(first, ev.LoopForked) and first.source_calls is not None
    assert [c.name for c in first.source_calls.calls] == ["ledger"] and not first.source_calls.busy

    await nc.jetstream().delete_stream(settings.names.history_stream_of(1))  # the source's shard is gone

    await api.input(fork, "two")
    h = await wait_history(nc, settings, fork, lambda h: finished(h) and h.turns == 2, timeout=60)
    # The repeated call took the source's recorded result (reuse): nothing ran again.
    assert ledger_runs(ledger, "ledger") == 1
    assert [text_of(m) for m in h.messages if isinstance(m, ToolResultMessage)] == ["recorded x"]
    assert text_of(h.messages[-1]) == "two done"


# A fork's turn meeting a call its (busy) source may be running asks at once, and ends once the gate
# is answered: well under the source's shard's leader election (seconds) and the wait for the
# source a fork that reads it makes (up to 30 s). Typically 0.15 s; the bound leaves room for one
# work pull lost with a consumer leader on the killed node (re-asked after its 6 s patience).
TURN_BOUND_SECONDS = 10.0


async def _lead_only(nc: NATS, settings: Settings, shard: int, node: str, other: str) -> None:
    """``node`` leads ``shard``'s streams and nothing else (streams and consumers it led go to ``other``)."""
    own = {stream for _, _, stream in placement.shard_streams(settings.names, shard)}
    js = nc.jetstream(timeout=5)
    for info in await js.streams_info():
        name = info.config.name or ""
        leader = info.cluster.leader if info.cluster is not None else None
        if name in own and leader != node:
            await placement.step_down(nc, name, node)
        elif name not in own and leader == node:
            await placement.step_down(nc, name, other)
        for c in await js.consumers_info(name):
            # (an R1 consumer, e.g. a bucket watcher, has no other server: its owner re-creates it)
            cl = c.cluster
            if cl is not None and cl.replicas and cl.leader == node and name not in own:
                await placement.step_down(nc, name, other, consumer=c.name)


async def test_a_fork_of_a_busy_source_asks_at_once_with_the_sources_leader_killed(
    nats_cluster: NatsCluster, tmp_path: Path
) -> None:
    """A busy shard-1 source (a call that may not run twice in flight) forked into shard 2: with shard
    1's leader node killed, the fork's equal call opens its fork_rerun gate at once, its turn ends
    once the gate is denied, and no request for the source's stream is made meanwhile."""
    meta = await anyio.to_thread.run_sync(nats_cluster.wait_meta_leader)
    a, other = (next(n for n in nats_cluster.nodes if n.name != meta), nats_cluster.node(meta))
    # Every process connects to the other two nodes: killing ``a`` stops only what it leads.
    urls = tuple(n.url for n in nats_cluster.nodes if n is not a)
    environ = {"LW_SHARDS": "3", "LW_REPLICAS": "3"}
    try:
        async with ledger_stack(urls, tmp_path, environ) as (nc, settings, api, ledger):
            # Before any loop: a pull waiting on a consumer's old leader is lost with the move.
            await _lead_only(nc, settings, 1, a.name, other.name)
            model = write_model(tmp_path, {"responses": ["one done", held_call("ledger", 50.0), "two done"]}, "m.json")
            source = (await api.start(_id_in(settings, 1), model=model)).loop_id
            await api.input(source, "one")
            await wait_history(nc, settings, source, lambda h: finished(h) and h.turns == 1, timeout=60)
            at = max(s for s, e in await history(nc, settings, source) if isinstance(e, ev.TurnDone))
            await api.input(source, "two")
            with anyio.fail_after(30):  # the source's call has started on its worker and holds for 50 s
                while ledger_runs(ledger, "ledger") < 1:
                    await anyio.sleep(0.05)
            fork = (await api.fork(source, at=at, loop_id=_id_in(settings, 2))).loop_id
            first = (await history(nc, settings, fork))[0][1]
            assert isinstance(first, ev.LoopForked) and first.source_calls is not None
            assert first.source_calls.busy and first.source_calls.calls == []
            await wait_history(nc, settings, fork, finished, timeout=30)  # shard 2 is served

            source_stream = settings.names.history_stream_of(1)
            requests: list[str] = []

            async def seen(msg: Msg) -> None:
                if source_stream in msg.subject:
                    requests.append(f"{time.monotonic() - t0:.2f} {msg.subject} {msg.reply} {msg.data[:200]!r}")

            t0 = time.monotonic()
            # Every JetStream API request (a read of the source's stream names it) as it crosses the server.
            sub = await nc.subscribe("$JS.API.>", cb=seen)
            # Killed, not stopped: a stopped node keeps its routes, and the reads any replica serves
            # (direct gets) of every stream it follows would stall with it.
            a.signal(signal.SIGKILL)  # the source's shard loses its leader
            await api.input(fork, "two")
            h = await wait_history(nc, settings, fork, lambda h: bool(h.open_gates), timeout=90)
            to_gate = time.monotonic() - t0
            gate = h.open_gates[0].gate
            assert gate.reason == "fork_rerun" and gate.tool_name == "ledger"
            asked = [e for _, e in await history(nc, settings, fork) if isinstance(e, ev.PermissionRequested)]
            assert [e.request.summary.startswith(FORK_RUNNING_SUMMARY) for e in asked] == [True]  # may be running
            # Denied: the fork has no result of the source's to take (the call was in flight when it
            # was copied), and says so without asking the source.
            await api.answer(fork, gate.id, "deny")
            h = await wait_history(nc, settings, fork, lambda h: finished(h) and h.turns == 2, timeout=90)
            took = time.monotonic() - t0
            await sub.unsubscribe()
            print(
                f"fork gate after {to_gate:.2f}s, turn done after {took:.2f}s (bound {TURN_BOUND_SECONDS}s); "
                f"{len(requests)} requests on the source's stream"
            )
            assert took < TURN_BOUND_SECONDS
            assert requests == [], requests[:5]  # the fork never read its source
            assert ledger_runs(ledger, "ledger") == 1  # nothing ran in the fork
            assert [text_of(m) for m in h.messages if isinstance(m, ToolResultMessage)] == [
                shaping.fork_no_source_result("ledger")
            ]
            assert text_of(h.messages[-1]) == "two done"
    finally:
        await anyio.to_thread.run_sync(restore_cluster, nats_cluster)
