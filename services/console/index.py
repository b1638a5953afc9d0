"""The console's live index of every loop: one ordered consumer on the whole history stream.

Each committed record is folded into its loop's :class:`~services.console.rules.LoopSummary`;
waiters of :meth:`LoopIndex.wait_changed` wake on every change (the pages' live updates). The
index holds no messages, only a summary and the record sequences per loop, so it stays small with
thousands of loops; a loop's timeline is read from JetStream page by page.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Final

import nats.errors
import nats.js.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import api

from services.console.rules import LoopSummary
from shared.codec import decode_event
from shared.errors import LoopwireError
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
        self.last_seq = 0
        self.ready = asyncio.Event()  # set once the records stored at start are folded
        self._changed = asyncio.Event()
        self._target = 0
        self._sub: object | None = None

    async def start(self) -> None:
        """Subscribe (retrying until the history stream exists); returns without waiting for the catch-up."""
        js = self._nc.jetstream()
        while True:
            try:
                info = await js.stream_info(self._names.history_stream)
                break
            except (nats.js.errors.NotFoundError, nats.errors.TimeoutError, nats.errors.NoRespondersError):
                await asyncio.sleep(RETRY_SECONDS)
        self._target = info.state.last_seq
        config = api.ConsumerConfig(deliver_policy=api.DeliverPolicy.ALL, inactive_threshold=30.0)
        self._sub = await js.subscribe(
            self._names.hist_all,
            stream=self._names.history_stream,
            ordered_consumer=True,
            cb=self._on_msg,
            config=config,
        )
        if self._target == 0:
            self.ready.set()  # (after the subscription: a ready index is always following)

    @property
    def following(self) -> bool:
        return self._sub is not None

    async def stop(self) -> None:
        sub = self._sub
        self._sub = None
        if sub is not None:
            with contextlib.suppress(nats.errors.Error):
                await sub.unsubscribe()  # type: ignore[attr-defined]

    async def _on_msg(self, m: Msg) -> None:
        seq = m.metadata.sequence.stream
        if seq <= self.last_seq:  # an ordered-consumer reset can redeliver
            return
        self.last_seq = seq
        loop_id = self._names.loop_of_hist(m.subject)
        try:
            event = decode_event(m.data, max_bytes=self._settings.max_record_bytes)
        except LoopwireError as e:  # never expected: the committer validated it
            log.warning("record %s of loop %s does not decode: %s", seq, loop_id, e)
            return
        s = self.loops.get(loop_id)
        if s is None:
            s = self.loops[loop_id] = LoopSummary(loop_id=loop_id)
        s.apply(event, seq)
        if not self.ready.is_set() and seq >= self._target:
            self.ready.set()
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
        tip = await get_msg(self._nc, self._names.history_stream, last_by_subj=self._names.hist(loop_id))
        if tip is None:
            return None
        deadline = asyncio.get_running_loop().time() + CATCH_UP_SECONDS
        while asyncio.get_running_loop().time() < deadline:
            s = self.loops.get(loop_id)
            if s is not None:
                return s
            await self.wait_changed(self.version, 0.2)
        return self.loops.get(loop_id)
