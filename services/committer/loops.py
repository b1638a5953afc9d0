"""The committer's access to loops: their cached folds, one writer per loop in this process,
reading a fold's tail, appending, and queueing a loop's work (shared by the loop API and fork)."""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Final

from nats.aio.client import Client as NATS

from services.reconcile import CommitterReconciler
from shared.backoff import Backoff
from shared.errors import ErrorKind, LoopwireError
from shared.events import Event
from shared.history import LoopHistory
from shared.jserrors import JetStreamError, JetStreamUnavailableError
from shared.protocol import WireError
from shared.replay import load
from shared.settings import Settings

from .appender import Appender

log = logging.getLogger("loopwire.committer.api")

CACHE_LOOPS: Final = 1024


class _HistoryCache:
    """Folds of recently used loops (LRU). Only a speed-up: OCC catches every stale entry.

    A fold is *quiet* when this process wrote its last record and queued no work for the loop since:
    no drive can have written after it, so a command may decide on it without reading the tail
    first (a loop just started is the usual case: its input comes next).
    """

    def __init__(self, size: int) -> None:
        self._size = size
        self._items: OrderedDict[str, tuple[LoopHistory, bool]] = OrderedDict()

    def get(self, loop_id: str) -> LoopHistory | None:
        item = self._items.get(loop_id)
        if item is None:
            return None
        self._items.move_to_end(loop_id)
        return item[0]

    def quiet(self, loop_id: str) -> LoopHistory | None:
        item = self._items.get(loop_id)
        return item[0] if item is not None and item[1] else None

    def put(self, loop_id: str, h: LoopHistory, *, quiet: bool = False) -> None:
        self._items[loop_id] = (h, quiet)
        self._items.move_to_end(loop_id)
        while len(self._items) > self._size:
            self._items.popitem(last=False)

    def drop(self, loop_id: str) -> None:
        self._items.pop(loop_id, None)


class Loops:
    """What the loop API and fork share: settings, the appender, cached folds, per-loop locks, work."""

    def __init__(self, nc: NATS, settings: Settings, appender: Appender) -> None:
        self.nc = nc
        self.settings = settings
        self.names = settings.names
        self.appender = appender
        self.cache = _HistoryCache(CACHE_LOOPS)
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}
        self.work = CommitterReconciler(nc, settings)  # queues the work of what commands store

    @asynccontextmanager
    async def lock(self, loop_id: str) -> AsyncIterator[None]:
        # One read-modify-write per loop at a time in this process (the cached fold is shared).
        lock, users = self._locks.get(loop_id, (asyncio.Lock(), 0))
        self._locks[loop_id] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[loop_id]
            if users <= 1:
                del self._locks[loop_id]
            else:
                self._locks[loop_id] = (lock, users - 1)

    async def history(self, loop_id: str, deadline: float) -> LoopHistory:
        backoff = Backoff(0.05, 0.5, deadline=deadline)
        while True:
            cached = self.cache.get(loop_id)
            try:
                h = await load(
                    self.nc,
                    self.names,
                    loop_id,
                    cached,
                    max_record_bytes=self.settings.max_record_bytes,
                    consistent=self.settings.leader_reads,
                )
            except JetStreamUnavailableError as e:
                problem = str(e)
            except JetStreamError as e:
                if not e.retryable:
                    raise WireError(ErrorKind.UNAVAILABLE, f"cannot read the loop's history: {e}") from None
                problem = str(e)
            except LoopwireError as e:
                self.cache.drop(loop_id)
                raise WireError(ErrorKind.UNAVAILABLE, f"the loop's history does not decode: {e}") from None
            else:
                self.cache.put(loop_id, h)
                return h
            if not await backoff.wait():
                raise WireError(ErrorKind.UNAVAILABLE, f"history unavailable: {problem}")

    async def queue_work(self, loop_id: str, seq: int, last: Event | None = None) -> None:
        """Queue the loop's work after a command stored (or repeated) records that need a drive.

        A command is acknowledged only once its work is queued: stored records with no work item
        would wait for the loop's next command. If the work stream stays unavailable for
        ``LW_COMMIT_RETRY_SECONDS`` the caller gets ``unavailable`` and should repeat the request,
        which stores nothing again and queues the work; meanwhile the reconciler keeps trying.
        """
        try:
            await self.work.queue(loop_id, seq, last)
        except (JetStreamError, JetStreamUnavailableError) as e:
            log.warning("loop %s: stored through seq %d, but its work could not be queued: %s", loop_id, seq, e)
            raise WireError(
                ErrorKind.UNAVAILABLE,
                f"the command is stored (seq {seq}) but its work could not be queued ({e}); "
                "repeat the same request to queue it",
            ) from None
