"""The model-step service: pull work signals, lease the loop, drive it, ack, look once more, release.

Many loops run at once per replica (``LW_MODEL_STEP_CONCURRENCY``), one driver per loop. A replica
never pulls more work items than it has free slots; a drive waiting on long tool calls gives its slot
back meanwhile (see :mod:`services.model_step.slots`). It serves the shards ``LW_SHARDS_SERVED`` names
(all by default): one work consumer, one puller and one pull loop per shard, sharing its slots.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from functools import partial
from typing import Any, Final

import anyio
import nats.errors
import nats.js.errors
from anyio.abc import TaskGroup, TaskStatus
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js.kv import KeyValue

from services.lifecycle import close_quietly, let_go
from services.model_step.driver import LoopDriver
from services.model_step.lease import CONNECTION_LOST, Lease, LeaseLost, Leases, keep
from services.model_step.live import LiveOutbox
from services.model_step.models import resolve_model
from services.model_step.slots import Slot, SlotPool
from services.model_step.steps import Action, next_action
from services.model_step.work import WorkPuller, consumer_config, served_shards
from services.reconcile import ReplicaReconciler
from shared import logfmt, metrics, telemetry
from shared.client import CommitClient
from shared.connect import connect
from shared.results import ResultStore
from shared.settings import Settings
from shared.streams import ensure_all, is_transient_setup_error
from shared.subjects import H_TRACEPARENT
from shared.worksignals import purge_work

log = logging.getLogger("loopwire.model_step")

# How long start-up waits for JetStream (a fresh or busy cluster may still be electing leaders).
START_RETRY_SECONDS: Final = 30.0
# Longest wait of one pull for the first work item (an idle replica asks again after it).
PULL_WAIT_SECONDS: Final = 1.0
# Delay before a work item whose loop is driven elsewhere comes back.
BUSY_NAK_SECONDS: Final = 0.25


def work_ack_wait(settings: Settings) -> float:
    """How long a work item may go without a sign of life before the server hands it to another
    replica: what a SIGKILLed replica's loops wait before they resume elsewhere."""
    return max(0.5, min(1.0, settings.lease_ttl_seconds / 2))


async def _start_up(js: Any, settings: Settings, registry: Any, shards: tuple[int, ...]) -> dict[int, KeyValue]:
    """Streams, buckets, the tool registry, and each served shard's work consumer and leases bucket;
    JetStream may still be electing leaders (a fresh or busy cluster answers with timeouts for a
    while), so retry for some time."""
    names = settings.names
    await ensure_all(js, settings)
    deadline = anyio.current_time() + START_RETRY_SECONDS
    while True:
        try:
            buckets: dict[int, KeyValue] = {}
            for k in shards:
                buckets[k] = await js.key_value(names.leases_bucket_of(k))
            await registry.start()
            for k in shards:
                try:
                    await js.consumer_info(names.work_stream_of(k), names.work_consumer)
                except nats.js.errors.NotFoundError:
                    await js.add_consumer(names.work_stream_of(k), consumer_config(names, k, work_ack_wait(settings)))
            return buckets
        except Exception as e:
            if not is_transient_setup_error(e) or anyio.current_time() > deadline:
                raise
            log.warning("start-up: JetStream not ready (%r); retrying", e)
            await registry.stop()
            await anyio.sleep(0.5)


class _Item:
    """A work item in the logs: its stream sequence, read only when a line is written."""

    __slots__ = ("msg",)

    def __init__(self, msg: Msg) -> None:
        self.msg = msg

    def __str__(self) -> str:
        try:
            return str(self.msg.metadata.sequence.stream)
        except Exception:  # not a JetStream message (cannot happen for items the puller returns)
            return "?"


@dataclass(slots=True)
class _Handling:
    """A loop this process handles right now (drive, ack, last look)."""

    # The stream sequence of the latest work signal that came in meanwhile: deleted after the
    # drive's last look instead of coming back for a drive of its own.
    noted: int = 0
    finishing: bool = False  # the last look may have begun: a signal now must come back soon


class ModelStepService:
    """One model-step replica: pulls work items, leases their loops and drives them."""

    _nc: NATS  # set once started
    _driver: LoopDriver
    _reconciler: ReplicaReconciler

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.names = settings.names
        self._leases: Leases | None = None
        self._pullers: list[WorkPuller] = []
        self._models: dict[str, Any] = {}
        self._pool = SlotPool(settings.model_step_concurrency, settings.model_step_waiting)
        self._tick = work_ack_wait(settings) / 4
        # Loops handled by this process right now: one handler (drive, ack, look again) per loop.
        self._busy: dict[str, _Handling] = {}

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled: drives in flight stop, their leases are released, the connection drains."""
        from services.toolcaller.executor import make_executor
        from services.toolcaller.registry import ToolRegistry

        settings, names = self.settings, self.names
        shards = served_shards(names, settings.shards_served)
        nc = await connect(settings, name="model-step", disconnected_cb=self._on_disconnect)
        registry = ToolRegistry(nc, names, replicas=settings.replicas)
        pullers = self._pullers = [WorkPuller(nc, names, k) for k in shards]
        try:
            buckets = await _start_up(nc.jetstream(), settings, registry, shards)
            leases = self._leases = Leases(nc, buckets, names, settings.lease_ttl_seconds)
            await leases.start()
            for puller in pullers:
                await puller.start()
        except BaseException:
            # Close what was opened, so a replica that cannot start exits instead of lingering half-started.
            with anyio.CancelScope(shield=True):
                with contextlib.suppress(Exception):
                    await registry.stop()
                await close_quietly(nc)
            raise
        self._nc = nc
        self._reconciler = ReplicaReconciler(nc, settings, has_work=lambda h: next_action(h).action is not Action.NONE)
        live = LiveOutbox(nc, names)
        self._driver = LoopDriver(
            nc=nc,
            settings=settings,
            commits=CommitClient(nc, names),
            models=self._model_for,
            tools=registry,
            execute=make_executor(nc, names, registry, settings, publish=live.publish),
            results=ResultStore(nc, names),
            live=live,
        )
        task_status.started()
        try:
            await self._serve(pullers)
        finally:
            with anyio.CancelScope(shield=True):
                with contextlib.suppress(Exception):
                    await registry.stop()
                with contextlib.suppress(Exception):
                    await leases.stop()
                # Items delivered to our inboxes but never handled (cut short by the stop) come back to
                # another replica after the ack wait.
                for puller in pullers:
                    await puller.close()
                await let_go(nc)

    async def _on_disconnect(self) -> None:
        # Other replicas may take our loops over as soon as our connection is gone (see lease.py).
        if self._leases is not None:
            await self._leases.connection_lost()
        for puller in self._pullers:
            puller.connection_lost()

    def _model_for(self, spec: str) -> Any:
        if spec not in self._models:
            self._models[spec] = resolve_model(spec, self.settings)
        return self._models[spec]

    async def _serve(self, pullers: list[WorkPuller]) -> None:
        async with anyio.create_task_group() as tg:
            await tg.start(self._driver.outbox.run)
            tg.start_soon(self._pool.run)
            assert self._leases is not None
            tg.start_soon(self._reconciler.signal_orphaned, self._leases.orphaned)
            tg.start_soon(self._reconciler.signal_lost_items, self._busy, [p.shard for p in pullers])
            for puller in pullers:
                tg.start_soon(self._pull_loop, tg, puller)

    async def _pull_loop(self, tg: TaskGroup, puller: WorkPuller) -> None:
        """One shard's items: wait for ONE with one slot, start it, then top up the other free slots
        with what is already queued, never asking for more items than there are free slots."""
        slots = self._pool.free
        while True:
            await slots.acquire()
            free = 1
            msgs = await puller.pull(1, wait=PULL_WAIT_SECONDS)
            if msgs:
                while slots.value > 0 and free < 64:
                    slots.acquire_nowait()
                    free += 1
                if free > 1:
                    msgs += await puller.pull(free - 1)
            for m in msgs[:free]:
                tg.start_soon(self._handle, m, self._pool.slot())
            for m in msgs[free:]:  # cannot happen with the pulls above; never hold an item unbacked
                with contextlib.suppress(Exception):
                    await m.nak()
            for _ in range(free - min(free, len(msgs))):
                slots.release()

    async def _handle(self, msg: Msg, slot: Slot) -> None:
        try:
            await self._handle_item(msg, slot)
        except Exception:
            log.exception("work item %s failed; retrying later", msg.subject)
            with contextlib.suppress(Exception):
                await msg.nak(delay=1.0)
        finally:
            slot.release()

    async def _look_again(self, loop_id: str) -> None:
        """After the ack: queue a work item if the loop has work again (see :mod:`services.reconcile`)."""
        await self._reconciler.look_again(loop_id, self._driver.cache.get(loop_id))

    async def _drop_signals(self, loop_id: str, seq: int) -> None:
        """Delete the loop's signals up to ``seq``, which came in during the drive, after the look
        again: each was published after its commit and before that look, which saw their work (and
        queued a new signal if there was any). Deleting them before the look would strand the loop
        if the drive stopped in between. An optimisation: a signal left in place is delivered again
        and costs one drive that finds nothing to do."""
        if seq and self._nc is not None:
            try:
                await purge_work(self._nc, self.names, loop_id, through_seq=seq)
            except Exception as e:
                log.debug("loop %s: signals of the drive left in place (%s)", loop_id, e, extra={"loop_id": loop_id})

    async def _handle_item(self, msg: Msg, slot: Slot) -> None:
        loop_id = self.names.loop_of_work(msg.subject)
        handling = self._busy.get(loop_id)
        if handling is not None:  # a drive of this loop here has not stopped yet (e.g. it just lost its lease)
            if handling.finishing:
                log.debug(
                    "loop %s: item %s came while its drive finishes; back soon",
                    loop_id,
                    _Item(msg),
                    extra={"loop_id": loop_id},
                )
                await msg.nak(delay=BUSY_NAK_SECONDS)
                return
            # The drive looks at the history again when it ends and then removes this signal; it comes
            # back if the drive stops before, after the ack wait like the drive's own item.
            with contextlib.suppress(Exception):
                handling.noted = max(handling.noted, msg.metadata.sequence.stream)
            log.debug("loop %s: item %s came during its drive; noted", loop_id, _Item(msg), extra={"loop_id": loop_id})
            await msg.nak(delay=work_ack_wait(self.settings))
            return
        handling = self._busy[loop_id] = _Handling()
        if metrics.ENABLED:
            with contextlib.suppress(Exception):  # a pull reply's metadata says how many wait behind it
                metrics.gauge_set(metrics.WORK_PENDING, msg.metadata.num_pending)
        metrics.gauge_add(metrics.LOOPS_DRIVEN, 1)
        try:
            with telemetry.attached(msg.headers), logfmt.bind(loop_id=loop_id):  # the signal's trace
                await self._drive_item(msg, loop_id, handling, slot)
        finally:
            metrics.gauge_add(metrics.LOOPS_DRIVEN, -1)
            del self._busy[loop_id]

    async def _drive_item(self, msg: Msg, loop_id: str, handling: _Handling, slot: Slot) -> None:
        leases = self._leases
        assert leases is not None
        lease = await leases.acquire(loop_id)
        if lease is None:
            log.debug(
                "loop %s: item %s: another replica drives the loop; back soon",
                loop_id,
                _Item(msg),
                extra={"loop_id": loop_id},
            )
            await msg.nak(delay=BUSY_NAK_SECONDS)  # another replica drives it; it looks again after its ack
            return
        try:
            with telemetry.attached(await self._item_trace(msg, loop_id)):
                await self._drive_held(msg, loop_id, handling, lease, slot)
        finally:
            leases.forget(lease)
            with anyio.CancelScope(shield=True):
                await lease.release()

    async def _item_trace(self, msg: Msg, loop_id: str) -> dict[str, str] | None:
        """The trace to drive an item in when it carries none (a signal sent again, e.g. for the loops
        of a replica that died): that of the loop's open turn, so the lines of its takeover are in it."""
        if not telemetry.ENABLED or (msg.headers and msg.headers.get(H_TRACEPARENT)):
            return None
        try:
            tp = await self._driver.open_turn_trace(loop_id)
        except Exception:  # the drive reads the history anyway, and says what failed
            return None
        return {H_TRACEPARENT: tp} if tp else None

    async def _drive_held(self, msg: Msg, loop_id: str, handling: _Handling, lease: Lease, slot: Slot) -> None:
        if lease.taken_from:
            log.info(
                "loop %s taken over from a replica that is gone (%r)",
                loop_id,
                lease.taken_from,
                extra={"loop_id": loop_id},
            )
        log.debug("loop %s: item %s: driving", loop_id, _Item(msg), extra={"loop_id": loop_id})
        acked = at_rest = False
        async with anyio.create_task_group() as tg:
            lease.on_lost(tg.cancel_scope.cancel)  # a drive that lost its lease stops at once
            tg.start_soon(partial(keep, lease, tick=self._tick, in_progress=msg.in_progress))
            try:
                h = await self._driver.drive(loop_id, lease, slot)
                # Only the holder acks: after a lost lease the item may already be another replica's.
                lease.check()
                await msg.ack()
                at_rest = next_action(h).action is Action.NONE
                acked = True
                log.debug(
                    "loop %s: item %s acked; drive ended at seq %d (%s)",
                    loop_id,
                    _Item(msg),
                    h.last_seq,
                    "at rest" if at_rest else "work left",
                    extra={"loop_id": loop_id},
                )
            except LeaseLost:
                log.info("loop %s: stopped driving (lease no longer held)", loop_id, extra={"loop_id": loop_id})
            tg.cancel_scope.cancel()
        if not acked and lease.why == CONNECTION_LOST:
            # The item comes back at once (the nak leaves with the reconnect), not after the ack
            # wait: the lease is free for any replica to take now (see lease.py).
            with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
                await msg.nak()
        if acked:
            # With the item acked, the last look is all that backs work that came in during the
            # drive. It only reads and signals, so neither a lost lease (a JetStream outage can
            # lapse it while the look's signal is still being retried) nor a stopping service may
            # cut it short.
            with anyio.CancelScope(shield=True):
                # The signals noted so far were published before this look: it sees their work.
                handling.finishing = True
                noted = handling.noted
                # A drive that ended at rest with no signal noted needs no look: a record its fold
                # lacks can only come from a command (the loop API), whose signal is then still
                # pending — it replaced our item if it came first, and acking our item leaves it —
                # so it is delivered like any other.
                if noted or not at_rest:
                    await self._look_again(loop_id)
                    await self._drop_signals(loop_id, noted)
