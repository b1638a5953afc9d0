"""The console's live index of every loop: one ordered consumer per history stream (:func:`shared.follow.follow_all`).

Each committed record is folded into its loop's :class:`~services.console.rules.LoopSummary`;
waiters of :meth:`LoopIndex.wait_changed` wake on every change (the pages' live updates). The
index holds no messages, only a summary and the record sequences per loop, so it stays small with
thousands of loops; a loop's timeline is read from JetStream page by page, from its home stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Final

import nats.errors
import nats.js.errors
from nats.aio.client import Client as NATS

from services.console.rules import LoopSummary
from shared import shards
from shared.errors import LoopwireError
from shared.follow import Follower, Record
from shared.jserrors import JetStreamUnavailableError
from shared.settings import Settings
from shared.streamreads import get_msg

log = logging.getLogger("loopwire.console.index")

RETRY_SECONDS: Final = 0.5
# How long a page waits for a loop it knows exists (its first record is stored) to reach the index.
CATCH_UP_SECONDS: Final = 3.0


class LoopIndex:
    def __init__(self, nc: NATS, settings: Settings) -> None:
        self._nc = nc
        self._settings = settings
        self._names = settings.names
        self.loops: dict[str, LoopSummary] = {}
        self.version = 0
        self._follower = Follower(nc, self._names, self._on_record)
        self.ready = self._follower.caught_up  # set once the records stored at start are folded
        self._changed = asyncio.Event()
        self._following = False

    async def start(self) -> None:
        """Subscribe (retrying until every history stream exists); returns without waiting for the catch-up."""
        while True:
            try:
                await self._follower.start()
                break
            # No stream yet, or JetStream did not answer within start()'s own bound: the console waits on.
            except (nats.js.errors.NotFoundError, JetStreamUnavailableError):
                await asyncio.sleep(RETRY_SECONDS)
        self._following = True

    @property
    def following(self) -> bool:
        return self._following

    async def stop(self) -> None:
        self._following = False
        await self._follower.stop()

    async def _on_record(self, r: Record) -> None:
        try:
            event = r.event(self._settings.max_record_bytes)
        except LoopwireError as e:  # never expected: the committer validated it
            log.warning("record %s of loop %s does not decode: %s", r.seq, r.loop_id, e)
            return
        s = self.loops.get(r.loop_id)
        if s is None:
            s = self.loops[r.loop_id] = LoopSummary(loop_id=r.loop_id)
        s.apply(event, r.seq)
        self.version += 1
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait_changed(self, version: int, timeout: float) -> int:
        """The index version once it is past ``version`` (or the current one after ``timeout``)."""
        if self.version > version:
            return self.version
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), timeout)
        return self.version

    async def find(self, loop_id: str) -> LoopSummary | None:
        """The loop's summary; a loop committed a moment ago is waited for, an unknown one is None."""
        s = self.loops.get(loop_id)
        if s is not None:
            return s
        home = await shards.home_of(self._nc, self._names, loop_id)
        tip = await get_msg(self._nc, home.stream, last_by_subj=home.subject)
        if tip is None:
            return None
        deadline = asyncio.get_running_loop().time() + CATCH_UP_SECONDS
        while asyncio.get_running_loop().time() < deadline:
            s = self.loops.get(loop_id)
            if s is not None:
                return s
            await self.wait_changed(self.version, 0.2)
        return self.loops.get(loop_id)
