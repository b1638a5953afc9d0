"""Work signals: a purge removes only the signals up to the sequence it names, a drive's last look
(what backs work that came in during the drive) runs to its end, and an item the work consumer lost
is signalled again."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest
from nats.aio.client import Client as NATS
from nats.js.api import DeliverPolicy

from services import reconcile
from services.model_step.service import ModelStepService
from services.model_step.work import WorkPuller, consumer_config
from services.reconcile import LostItems
from shared.client import CommitClient, LoopClient
from shared.connect import connect
from shared.content import AIMessage, text_of, user_text
from shared.events import LoopIdle, TurnDone, TurnStarted, make, new_id
from shared.natsserver import NatsServer
from shared.replay import load
from shared.settings import Settings
from shared.streamreads import get_msg
from shared.streams import ensure_all
from shared.worksignals import purge_work, signal_work
from tests import natsfixtures
from tests.integration.committer_fixtures import running_committer
from tests.natsfixtures import Freeze
from tests.syshelpers import wait_history, write_script

pytestmark = pytest.mark.anyio

# Well past a waiting pull's expiry (1 s): a pull without heartbeats waits until the server runs again.
STALL_SECONDS = 4.0


async def _pending(nc: NATS, settings: Settings, loop_id: str) -> int:
    """The stream sequence of the loop's pending signal (0: none)."""
    m = await get_msg(nc, settings.names.work_stream, last_by_subj=settings.names.work(loop_id))
    return m.seq if m is not None else 0


async def test_a_purge_keeps_a_signal_published_after_the_sequence_it_names(settings: Settings, nc: NATS) -> None:
    await ensure_all(nc.jetstream(timeout=10), settings)
    a, b = new_id(), new_id()
    await signal_work(nc, settings.names, a, within=2)
    await signal_work(nc, settings.names, b, within=2)
    first = await _pending(nc, settings, a)
    assert first > 0

    # A later signal for the same loop replaces the first one; a purge that names the first one's
    # sequence (what a replica saw during its drive) must leave the later one in place.
    await signal_work(nc, settings.names, a, within=2)
    later = await _pending(nc, settings, a)
    assert later > first
    assert await purge_work(nc, settings.names, a, through_seq=first) == 0
    assert await _pending(nc, settings, a) == later

    assert await purge_work(nc, settings.names, a, through_seq=later) == 1
    assert await _pending(nc, settings, a) == 0
    assert await _pending(nc, settings, b) > 0  # another loop's signal is untouched


@asynccontextmanager
async def _started_loop(settings: Settings, nc: NATS, model: str) -> AsyncIterator[tuple[LoopClient, str]]:
    """A committer and a model-step serving in this process, and a loop of ``model`` started."""
    async with running_committer(settings), anyio.create_task_group() as tg:
        await tg.start(ModelStepService(settings).run)
        lc = LoopClient(nc, settings.names)
        loop_id = new_id()
        await lc.start(loop_id, model=model)
        yield lc, loop_id
        tg.cancel_scope.cancel()


async def test_a_drive_s_last_look_runs_to_its_end_when_the_lease_is_lost_meanwhile(
    settings: Settings, nc: NATS, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Once the drive acked its item, its last look is all that backs work that came in during the
    # drive. A JetStream outage can lapse the lease just then (the look's signal is still being
    # retried); that must not cancel the look, or such work would be left with no work item.
    looks = {"started": 0, "finished": 0}
    last_look = ModelStepService._look_again

    async def look_after_losing_the_lease(self: ModelStepService, loop_id: str) -> None:
        looks["started"] += 1
        if looks["started"] == 1:
            assert self._leases is not None
            self._leases.give_up_all("lost while the drive looks again (test)")
            await anyio.sleep(0.2)  # a checkpoint where a cancellation would land
        await last_look(self, loop_id)
        looks["finished"] += 1

    monkeypatch.setattr(ModelStepService, "_look_again", look_after_losing_the_lease)
    # The first answer takes a second: the second input comes in during the drive, and its signal
    # reaches the replica driving the loop (noted), which then looks again once the drive is done.
    model = write_script(tmp_path, [[{"sleep": 1.0}, {"kind": "text", "text": "one"}], "two", "three"])
    async with _started_loop(settings, nc, model) as (lc, loop_id):
        await lc.input(loop_id, "first")
        await wait_history(nc, settings, loop_id, lambda h: h.open_turn is not None, timeout=15)
        await lc.input(loop_id, "second")
        await wait_history(nc, settings, loop_id, lambda h: h.idle and h.turns == 2, timeout=15)
        with anyio.fail_after(10):
            while looks["finished"] == 0:
                await anyio.sleep(0.05)
        await lc.input(loop_id, "third")  # and the loop goes on as before
        h = await wait_history(nc, settings, loop_id, lambda h: h.idle and h.turns == 3, timeout=15)
        assert [text_of(m) for m in h.messages if isinstance(m, AIMessage)] == ["one", "two", "three"]


async def test_a_drive_that_ends_at_rest_with_no_signal_noted_does_not_look_again(
    settings: Settings, nc: NATS, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every record such a drive's fold can lack came with a work signal of its own, still pending:
    # the loop's next input is driven without a last look in between.
    looks = {"n": 0}
    last_look = ModelStepService._look_again

    async def counted(self: ModelStepService, loop_id: str) -> None:
        looks["n"] += 1
        await last_look(self, loop_id)

    monkeypatch.setattr(ModelStepService, "_look_again", counted)
    model = write_script(tmp_path, ["one", "two"])
    async with _started_loop(settings, nc, model) as (lc, loop_id):
        await lc.input(loop_id, "first")
        await wait_history(nc, settings, loop_id, lambda h: h.idle and h.turns == 1, timeout=15)
        await lc.input(loop_id, "second")
        h = await wait_history(nc, settings, loop_id, lambda h: h.idle and h.turns == 2, timeout=15)
        assert [text_of(m) for m in h.messages if isinstance(m, AIMessage)] == ["one", "two"]
        assert looks["n"] == 0


async def test_lost_items_are_the_delivered_ones_the_consumer_no_longer_counts(settings: Settings, nc: NATS) -> None:
    # The state a consumer leader change has left before: the consumer's next sequence is past an
    # item that is not waiting for an ack either. A work-queue consumer must deliver all, so the state
    # is made on a limits stream of the same names: an item published before a DeliverPolicy.NEW
    # consumer exists is behind it.
    names = settings.names
    js = nc.jetstream()
    await js.add_stream(name=names.work_stream, subjects=[names.work_all])
    a, b = new_id(), new_id()
    await js.publish(names.work(a), b"")
    await js.add_consumer(
        names.work_stream,
        dataclasses.replace(consumer_config(names, 0, 1.0), deliver_policy=DeliverPolicy.NEW),
    )
    await js.publish(names.work(b), b"")  # waits for its first delivery: not lost
    lost = LostItems(nc, names, 0)
    assert await lost.check() == []  # one observation is not enough (the counts are read apart)
    assert await lost.check() == [a]


async def test_a_healthy_work_queue_has_no_lost_items(settings: Settings, nc: NATS) -> None:
    await ensure_all(nc.jetstream(timeout=10), settings)
    names = settings.names
    await nc.jetstream().add_consumer(names.work_stream, consumer_config(names, 0, 30.0))
    for _ in range(3):
        await signal_work(nc, names, new_id(), within=2)
    puller = WorkPuller(nc, names, 0)
    await puller.start()
    [held] = await puller.pull(1, wait=2)  # delivered, waiting for its ack
    lost = LostItems(nc, names, 0)
    for _ in range(3):
        assert await lost.check() == []
    await held.nak()
    await puller.close()


async def test_a_waiting_pull_whose_server_stalls_ends_within_a_second(nats_server: NatsServer) -> None:
    """A waiting pull asks for idle heartbeats: when they stop (the consumer leader holding the pull
    died or stalls, the connection not yet seen as lost) the pull ends and the next one goes out,
    instead of waiting for its expiry plus a grace while the server said nothing."""
    settings = Settings.from_env({}, nats_urls=(nats_server.url,), prefix=natsfixtures.unique_prefix())
    names = settings.names
    nc = await connect(settings)
    freeze = Freeze(nats_server)
    puller = WorkPuller(nc, names, 0)
    try:
        await ensure_all(nc.jetstream(timeout=10), settings)
        await nc.jetstream().add_consumer(names.work_stream, consumer_config(names, 0, 30.0))
        await puller.start()
        assert await puller.pull(1, wait=1.0) == []  # heartbeats accepted; no items: the server's 408
        took: list[float] = []

        async def pull() -> None:
            started = anyio.current_time()
            assert await puller.pull(1, wait=1.0) == []
            took.append(anyio.current_time() - started)

        async with anyio.create_task_group() as tg:
            tg.start_soon(pull)
            await anyio.sleep(0.1)  # the server holds the pull and beats
            freeze.now(STALL_SECONDS)
        # 3 heartbeats (0.25 s each) of silence, well before the server answers again.
        assert 0.5 < took[0] < 1.5, took
        freeze.thaw_at_end(STALL_SECONDS)
        await signal_work(nc, names, new_id(), within=10)
        [item] = await puller.pull(1, wait=1.0)  # the next pull is served once the server is back
        await item.ack()
    finally:
        freeze.thaw_at_end(STALL_SECONDS)
        await puller.close()
        await nc.close()


async def _wait_for_signal(nc: NATS, settings: Settings, loop_id: str, seconds: float) -> int:
    """The loop's pending signal once there is one within ``seconds`` (0: none came)."""
    deadline = anyio.current_time() + seconds
    while anyio.current_time() < deadline:
        if seq := await _pending(nc, settings, loop_id):
            return seq
        await anyio.sleep(0.05)
    return 0


async def test_work_that_no_drive_took_up_is_signalled_again(
    settings: Settings, nc: NATS, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A loop has been left with a record that needed a drive and no work item (model-step replicas
    # killed). With no model-step running, the item is taken away here after each record; the
    # committer queues the work again once no drive wrote and none holds the loop's lease.
    monkeypatch.setattr(reconcile, "FIRST_LOOK_SECONDS", 0.5)
    names = settings.names
    async with running_committer(settings):
        lc = LoopClient(nc, names)
        loop_id = new_id()
        await lc.start(loop_id, model="demo")
        await lc.input(loop_id, "hello")
        first = await _pending(nc, settings, loop_id)
        assert first > 0
        assert await purge_work(nc, names, loop_id, through_seq=first) == 1

        # A loop a replica drives (its lease is held) is not signalled, however long the drive takes.
        leases = await nc.jetstream().key_value(names.leases_bucket)
        await leases.put(loop_id, b"someone driving it")
        assert await _wait_for_signal(nc, settings, loop_id, 2.5) == 0

        await leases.delete(loop_id)
        again = await _wait_for_signal(nc, settings, loop_id, 5.0)
        assert again > first

        # A drive's record after which the loop needs more driving is watched like a command's ...
        await purge_work(nc, names, loop_id, through_seq=again)
        h = await load(nc, names, loop_id)
        turn = new_id()
        started = make(TurnStarted, loop_id=loop_id, turn_id=turn, turn_index=1, message=user_text("hello"))
        await CommitClient(nc, names).commit(loop_id, h.last_seq, [started])
        after_drive = await _wait_for_signal(nc, settings, loop_id, 5.0)
        assert after_drive > again

        # ... and one the loop rests on is not: nothing is due until the next command.
        await purge_work(nc, names, loop_id, through_seq=after_drive)
        h = await load(nc, names, loop_id)
        rest = [make(TurnDone, loop_id=loop_id, turn_id=turn, turn_index=1), make(LoopIdle, loop_id=loop_id)]
        await CommitClient(nc, names).commit(loop_id, h.last_seq, rest)
        assert await _wait_for_signal(nc, settings, loop_id, 2.5) == 0
