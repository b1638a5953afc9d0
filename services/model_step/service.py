"""The model-step service: pull work signals, lease the loop, drive it, ack, look once more, release.

Many loops run at once per replica (``LW_MODEL_STEP_CONCURRENCY``), one driver per loop. A replica
never pulls more work items than it has free slots.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from typing import Any, Final

import anyio
import nats.errors
import nats.js.errors
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.kv import KeyValue

from services.model_step.driver import LoopDriver
from services.model_step.lease import Lease
from services.model_step.models import resolve_model
from services.model_step.steps import Action, next_action
from shared.bus import ERR_MAX_MSGS_PER_SUBJECT, JetStreamError, connect, ensure_all, js_publish
from shared.client import CommitClient
from shared.history import load
from shared.settings import Settings

log = logging.getLogger("loopwire.model_step")

# After the first work item, how long a pull may wait for more to fill the other free slots.
TOP_UP_SECONDS: Final = 0.01


async def _fetch(psub: Any, batch: int, timeout: float) -> list[Msg]:
    """Up to ``batch`` work items; [] on a timeout or a failed fetch (logged)."""
    try:
        msgs: list[Msg] = await psub.fetch(batch=batch, timeout=timeout)
    except (nats.errors.TimeoutError, nats.js.errors.FetchTimeoutError):
        return []
    except nats.errors.ConnectionClosedError:
        raise
    except Exception as e:
        log.warning("fetch failed: %s", e)
        return []
    return msgs


# How long a replica keeps trying to queue a loop's remaining work after acking its item.
LOOK_AGAIN_SECONDS: Final = 300.0
# How long start-up waits for JetStream (a fresh or busy cluster may still be electing leaders).
START_RETRY_SECONDS: Final = 30.0


async def signal_work(nc: Any, names: Any, loop_id: str) -> None:
    """Queue a work signal for ``loop_id``; one already pending is just as good."""
    for delay in (0.05, 0.1, 0.2, 0.5, 1.0):
        try:
            await js_publish(nc, names.work(loop_id), b"", {}, request_timeout=2.0)
            return
        except JetStreamError as e:
            if e.err_code == ERR_MAX_MSGS_PER_SUBJECT:
                return
        except Exception as e:  # transient (leader election, reconnect): try again shortly
            log.warning("work signal for %s failed: %s", loop_id, e)
        await anyio.sleep(delay)
    raise RuntimeError(f"could not queue a work signal for loop {loop_id}")


async def _start_up(js: Any, settings: Settings, registry: Any) -> tuple[KeyValue, Any]:
    """Streams, buckets, the tool registry and the work consumer; JetStream may still be electing
    leaders (a fresh or busy cluster answers with timeouts for a while), so retry for some time."""
    names = settings.names
    await ensure_all(js, settings)
    deadline = anyio.current_time() + START_RETRY_SECONDS
    while True:
        try:
            kv = await js.key_value(names.leases_bucket)
            await registry.start()
            psub = await js.pull_subscribe(
                names.work_all,
                durable=names.work_consumer,
                stream=names.work_stream,
                config=ConsumerConfig(
                    ack_policy=AckPolicy.EXPLICIT,
                    deliver_policy=DeliverPolicy.ALL,
                    ack_wait=max(2.0, settings.lease_ttl_seconds),
                    max_deliver=-1,
                    max_ack_pending=-1,
                ),
            )
            return kv, psub
        except (
            nats.errors.TimeoutError,
            nats.errors.NoRespondersError,
            nats.js.errors.ServiceUnavailableError,
            TimeoutError,
        ) as e:
            if anyio.current_time() > deadline:
                raise
            log.warning("start-up: JetStream not ready (%r); retrying", e)
            await registry.stop()
            await anyio.sleep(0.5)


async def serve(settings: Settings, *, ready: anyio.Event | None = None, stop: anyio.Event | None = None) -> None:
    """Run one model-step replica until ``stop`` is set (or the task is cancelled)."""
    from services.tools.executor import make_executor
    from services.tools.registry import ToolRegistry

    names = settings.names
    nc = await connect(settings, name="model-step")
    js = nc.jetstream()
    registry = ToolRegistry(nc, names, replicas=settings.replicas)
    ttl = settings.lease_ttl_seconds
    try:
        kv, psub = await _start_up(js, settings, registry)
    except BaseException:
        # Close what was opened, so a replica that cannot start exits instead of lingering half-started.
        with anyio.CancelScope(shield=True):
            with contextlib.suppress(Exception):
                await registry.stop()
            with contextlib.suppress(Exception):
                await nc.close()
        raise
    holder = f"{socket.gethostname()}:{os.getpid()}"
    models_cache: dict[str, Any] = {}

    def model_for(spec: str) -> Any:
        if spec not in models_cache:
            models_cache[spec] = resolve_model(spec, settings)
        return models_cache[spec]

    driver = LoopDriver(
        nc=nc,
        settings=settings,
        commits=CommitClient(nc, names),
        models=model_for,
        tools=registry,
        execute=make_executor(nc, names, registry, settings),
    )
    slots = anyio.Semaphore(max(1, settings.model_step_concurrency))
    stop = stop or anyio.Event()

    async def handle(msg: Msg) -> None:
        try:
            await _handle(msg)
        except Exception:
            log.exception("work item %s failed; retrying later", msg.subject)
            with contextlib.suppress(Exception):
                await msg.nak(delay=1.0)
        finally:
            slots.release()

    async def look_again(loop_id: str) -> None:
        """After the ack: queue a work item if the loop has work again (no lost wake-ups).

        A signal that arrived while ours was pending was refused, so look once more, and hand found
        work back to the queue instead of driving it unbacked (a crash now would otherwise strand
        the loop with no work item left). Our item is already acked, so a failed look must not end
        here (a leader election makes reads fail for seconds): signal anyway (a spare signal costs
        one look) and keep trying until one of the two succeeds.
        """
        deadline = anyio.current_time() + LOOK_AGAIN_SECONDS
        while True:
            try:
                h = await load(nc, names, loop_id, driver.cache.get(loop_id))
                if next_action(h).action is not Action.NONE:
                    await signal_work(nc, names, loop_id)
                return
            except Exception as e:
                log.warning("loop %s: looking again after the ack failed (%s); signalling anyway", loop_id, e)
            try:
                await signal_work(nc, names, loop_id)
                return
            except Exception as e:
                if anyio.current_time() > deadline:
                    log.error("loop %s: could not queue its work for %gs: %s", loop_id, LOOK_AGAIN_SECONDS, e)
                    return
            await anyio.sleep(0.5)

    async def _handle(msg: Msg) -> None:
        loop_id = names.loop_of_work(msg.subject)
        lease = await Lease.acquire(kv, loop_id, holder)
        if lease is None:
            await msg.nak(delay=min(1.0, ttl / 3))  # another replica drives it; it looks again after its ack
            return
        try:
            async with anyio.create_task_group() as tg:

                async def keepalive() -> None:
                    while True:
                        await anyio.sleep(ttl / 3)
                        await lease.refresh()
                        with contextlib.suppress(Exception):
                            await msg.in_progress()

                tg.start_soon(keepalive)
                await driver.drive(loop_id)
                await msg.ack()
                await look_again(loop_id)
                tg.cancel_scope.cancel()
        finally:
            await lease.release()

    if ready is not None:
        ready.set()
    try:
        async with anyio.create_task_group() as tg:

            async def watch_stop() -> None:
                await stop.wait()
                tg.cancel_scope.cancel()

            tg.start_soon(watch_stop)
            while True:
                await slots.acquire()
                free = 1
                while slots.value > 0 and free < 64:
                    await slots.acquire()
                    free += 1
                # Wait for ONE item, start it, then top up the other free slots with what is already
                # queued. (nats-py's fetch(batch=n) on an empty queue returns only when n items came or
                # the timeout passed: a lone work item on an idle replica waited up to the full second.)
                taken = 0
                for batch, timeout in ((1, 1.0), (free - 1, TOP_UP_SECONDS)):
                    if batch < 1:
                        continue
                    msgs = await _fetch(psub, batch, timeout)
                    for m in msgs:
                        tg.start_soon(handle, m)
                    taken += len(msgs)
                    if not msgs:
                        break
                for _ in range(free - taken):
                    slots.release()
    finally:
        with anyio.CancelScope(shield=True):
            with contextlib.suppress(Exception):
                await registry.stop()
            # Work items fetched but never handled (a fetch cut short by the stop) would keep drain
            # waiting for a reader that is gone (nats-py waits drain_timeout, 30 s): drop them here;
            # the server redelivers them to another replica after ack_wait.
            with contextlib.suppress(Exception):
                await psub.unsubscribe()
            with contextlib.suppress(Exception):
                await nc.drain()
