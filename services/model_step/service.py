"""The model-step service: pull work signals, lease the loop, drive it, ack, look once more, release.

Many loops run at once per replica (``LW_MODEL_STEP_CONCURRENCY``), one driver per loop. A replica
never pulls more work items than it has free slots.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from typing import Any

import anyio
import nats.errors
import nats.js.errors
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from services.model_step.driver import LoopDriver
from services.model_step.lease import Lease
from services.model_step.models import resolve_model
from services.model_step.steps import Action, next_action
from shared.bus import ERR_MAX_MSGS_PER_SUBJECT, JetStreamError, connect, ensure_all, js_publish
from shared.client import CommitClient
from shared.history import load
from shared.settings import Settings

log = logging.getLogger("loopwire.model_step")


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


async def serve(settings: Settings, *, ready: anyio.Event | None = None, stop: anyio.Event | None = None) -> None:
    """Run one model-step replica until ``stop`` is set (or the task is cancelled)."""
    from services.tools.executor import make_executor
    from services.tools.registry import ToolRegistry

    names = settings.names
    nc = await connect(settings, name="model-step")
    js = nc.jetstream()
    await ensure_all(js, settings)
    kv = await js.key_value(names.leases_bucket)
    registry = ToolRegistry(nc, names)
    await registry.start()
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
    ttl = settings.lease_ttl_seconds
    psub = await js.pull_subscribe(
        names.work_all,
        durable=names.work_consumer,
        stream=names.work_stream,
        config=ConsumerConfig(
            ack_policy=AckPolicy.EXPLICIT,
            deliver_policy=DeliverPolicy.ALL,
            ack_wait=max(2.0, ttl),
            max_deliver=-1,
            max_ack_pending=-1,
        ),
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
                # No lost wake-ups: a signal that arrived while ours was pending was refused, so look
                # again — and hand found work back to the queue instead of driving it unbacked (a crash
                # now would otherwise strand the loop with no work item left).
                h = await load(nc, names, loop_id, driver.cache.get(loop_id))
                if next_action(h).action is not Action.NONE:
                    await signal_work(nc, names, loop_id)
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
                try:
                    msgs = await psub.fetch(batch=free, timeout=1.0)
                except (nats.errors.TimeoutError, nats.js.errors.FetchTimeoutError):
                    msgs = []
                except nats.errors.ConnectionClosedError:
                    raise
                except Exception as e:
                    log.warning("fetch failed: %s", e)
                    msgs = []
                for m in msgs:
                    tg.start_soon(handle, m)
                for _ in range(free - len(msgs)):
                    slots.release()
    finally:
        with anyio.CancelScope(shield=True):
            with contextlib.suppress(Exception):
                await registry.stop()
            with contextlib.suppress(Exception):
                await nc.drain()
