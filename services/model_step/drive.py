"""One loop being driven: its state for the length of one drive, and the fenced commits of its steps.

Commits are fenced by the expected sequence: every commit of a step — first send and every
unchanged retry — expects the loop's last sequence *at the moment the step's inputs were read*
(the drive's basis), never a value read later. A conflict re-reads the history from the stream and
decides again at the new position. One drive per loop runs in a process at a time, and a drive's
fold is its own: no two drives share mutable state.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from nats.aio.client import Client as NATS

from services.model_step import context, forkcalls, tracing
from services.model_step.foldcache import FoldCache
from services.model_step.lease import Guard
from services.model_step.live import LiveOutbox
from services.model_step.models.base import ModelFactory
from services.model_step.policy import tool_allowed_for_loop
from services.model_step.slots import SlotHolder
from services.toolcaller.base import Execute, ToolLookup
from services.toolwire.spec import ToolSpec
from shared import telemetry
from shared.backoff import Backoff
from shared.client import CommitClient, CommitResult
from shared.errors import CommitRefused, LoopwireError, StepAbandoned
from shared.events import Event
from shared.history import LoopHistory
from shared.protocol import ConflictError, RemoteError, UnavailableError
from shared.replay import load
from shared.results import ResultStore
from shared.settings import Settings

log = logging.getLogger("loopwire.model_step")

Build = Callable[[LoopHistory], list[Event] | None]


class Shared(Protocol):
    """What every drive of a driver uses: its connection and settings, the committer, the models
    and tools, the call records, the live outbox, and the loops' folds (kept between drives)."""

    nc: NATS
    settings: Settings
    commits: CommitClient
    models: ModelFactory
    tools: ToolLookup
    execute: Execute
    results: ResultStore | None
    cache: FoldCache
    outbox: LiveOutbox


async def load_fold(shared: Shared, loop_id: str) -> LoopHistory:
    """Read the loop's history on from its cached fold, and cache the result."""
    s = shared.settings
    h = await load(shared.nc, s.names, loop_id, shared.cache.get(loop_id), consistent=s.leader_reads)
    shared.cache[loop_id] = h
    return h


@dataclass(eq=False)
class Drive:
    """One loop being driven, for one :meth:`~services.model_step.driver.LoopDriver.drive` call.

    ``guard``: the loop's lease (None: a drive without one, e.g. a test of the commit alone).
    ``slot``: the handler's drive slot (None: the drive holds none).
    """

    shared: Shared
    loop_id: str
    guard: Guard | None
    slot: SlotHolder | None = None
    # Event ids this drive offered, and whether a record of another writer (the loop API: input,
    # interrupt, answer, close) showed up on the live history subject since the last read.
    own: set[str] = field(default_factory=set)
    foreign: bool = True  # nothing is known yet: read the history first
    # The last sequence of the fold the current step was built from (its commit's expected sequence).
    basis: int | None = None
    # The last sequence of this drive's own latest commit. A step at that position is new: nobody
    # else can have started it while this drive held the lease throughout.
    made: int | None = None
    # A fork's source: its recorded results after the fork point (kept once it rests), and its fold.
    source: forkcalls.SourceView | None = None
    source_fold: LoopHistory | None = None
    # The loop's messages' token counts (services.model_step.context).
    memo: context.Memo = field(default_factory=dict)

    @property
    def settings(self) -> Settings:
        return self.shared.settings

    def check(self) -> None:
        """Raise LeaseLost unless the drive still holds the loop (before every side effect)."""
        if self.guard is not None:
            self.guard.check()

    def model_spec(self, h: LoopHistory) -> str:
        return (h.config.model if h.config is not None else "") or self.settings.model

    def tool_spec(self, h: LoopHistory, name: str) -> ToolSpec | None:
        """The live tool ``name`` if the loop may call it."""
        if not tool_allowed_for_loop(h.config, name):
            return None
        return self.shared.tools.get(name)

    def waiting_on_calls(self) -> contextlib.AbstractAsyncContextManager[None]:
        """Around a wait on tool calls: a long one gives the drive slot back until it ends (a loop
        waiting on a sub-agent must not keep the slot its child needs)."""
        return self.slot.waiting() if self.slot is not None else contextlib.nullcontext()

    # --- reads ------------------------------------------------------------------------------------

    async def read(self) -> LoopHistory:
        return await load_fold(self.shared, self.loop_id)

    async def refresh(self) -> LoopHistory:
        """The loop's fold after our last commit: re-read only when another writer may have written.

        Our own commits are folded as they are acknowledged (the commit's expected sequence proves
        nothing else was appended before them), so the history is read again only when the loop's
        control subject showed a record of the loop API (or one that could not be parsed). A record
        written otherwise (another copy of this driver, a notice dropped on a reconnect) costs nothing
        in correctness: the next commit's expected sequence fails, and a conflict always re-reads.
        """
        h = self.shared.cache.get(self.loop_id)
        if h is None or self.foreign:
            self.foreign = False
            h = await self.read()
        return h

    async def source_view(self, h: LoopHistory) -> forkcalls.SourceView:
        """The source's calls as the fork sees them: as copied at the fork (the source is then never
        read), else read from the source (kept once it rests: a busy one is read again)."""
        found = self.source
        if found is None and h.forked is not None:
            found = self.source = forkcalls.copied_view(h.forked)
        if found is None and h.forked is not None:
            s = self.settings
            found, self.source_fold = await forkcalls.read_source(
                self.shared.nc,
                s.names,
                h.forked,
                s.max_record_bytes,
                self.source_fold,
                consistent=s.leader_reads,
            )
            if not found.busy:
                self.source = found
        return found or forkcalls.SourceView(results={}, busy=False)

    # --- commits ----------------------------------------------------------------------------------

    async def commit(self, h: LoopHistory, build: Build, *, chain: bool = False) -> None:
        """Commit ``build(h)``; on a conflict re-read and rebuild while the step is still ours.

        ``build`` returns None when, after a re-read, the work no longer applies (abandon). The
        expected sequence is the fence: the drive's basis (the fold the step was built from), the
        same for every unchanged retry of an unanswered commit (it may have been stored), and only
        replaced by a conflict's fresh read. A conflict never produces a duplicate or a fork.

        ``chain``: the events are stored one by one, each right after the one before, up to the
        first another writer got ahead of (only for events of which every prefix is a history the
        driver continues from); the stored ones are folded and the history read again.
        """
        pos = position(h)
        expected = self.basis if self.basis is not None else h.last_seq
        if h.last_seq != expected:
            raise StepAbandoned(f"the fold moved under the step ({expected} → {h.last_seq})")
        backoff = Backoff(0.05, 2.0)
        folded = False
        events: list[Event] | None = None
        try:
            for _attempt in range(100):
                if events is None:
                    events = build(h)
                    if events is None:
                        raise StepAbandoned("work no longer applies")
                self.own.update(e.event_id for e in events)  # before sending: the live copy may overtake the reply
                self.check()
                await self.shared.outbox.flush(self.loop_id)  # a step's live events go out before it is committed
                try:
                    result = await self._send(expected, events, chain)
                except ConflictError:
                    events = None  # not stored: rebuild on the re-read history
                    h = await self.read()
                    if position(h) != pos:
                        raise StepAbandoned("history moved: another writer or an interrupt") from None
                    expected = self.basis = h.last_seq  # a new decision at the new position
                except UnavailableError as e:
                    # Unanswered is not refused: the commit may be stored. Retry exactly the same events
                    # (same event ids), so the committer recognises a stored one as done instead of
                    # finding a "partial append" where our first events match and a rebuilt one does not.
                    log.warning(
                        "loop %s: committer unavailable (%s); retrying", h.loop_id, e, extra={"loop_id": h.loop_id}
                    )
                    await backoff.sleep()
                except (RemoteError, LoopwireError) as e:
                    # invalid / too_large: never retried blindly.
                    raise CommitRefused(str(e)) from e
                else:
                    folded = self._committed(h, events, result)
                    return
            raise StepAbandoned("too many commit attempts")
        finally:
            if not folded:
                # Whether an unanswered or abandoned commit was stored is unknown here: re-read.
                self.foreign = True

    async def _send(self, expected: int, events: list[Event], chain: bool) -> CommitResult:
        # Named after the history streams' family (shard 0's stream), so span names stay few.
        with tracing.commit(self.settings.names.history_stream_of(0), self.loop_id, len(events)) as span:
            # Validated once, by the committer: an invalid event is refused there (a bug of this
            # driver either way), and the same checks here cost every step.
            result = await self.shared.commits.commit(
                self.loop_id,
                expected,
                events,
                max_record_bytes=self.settings.max_record_bytes,
                validate=False,
                chain=chain,
            )
            span.set_attribute(telemetry.LW_STREAM_SEQ, result.last_seq)
        return result

    def _committed(self, h: LoopHistory, events: list[Event], result: CommitResult) -> bool:
        """Take an acknowledged commit in; whether its events were folded into the cached history."""
        if result.seqs:
            self.made = result.seqs[-1]
        folded = self._fold_committed(h, events[: len(result.seqs)], result.seqs)
        if folded:
            self.basis = h.last_seq
            if len(result.seqs) < len(events):
                self.foreign = True  # a chain cut short: another writer came between
        return folded

    def _fold_committed(self, h: LoopHistory, events: list[Event], seqs: list[int]) -> bool:
        """Fold our just-committed events into the cached history, as a re-read would.

        The commit appended exactly these events at ``seqs`` right after ``h.last_seq`` (the
        expected sequence is the fence), so nothing of the loop lies between. Anything else is
        left to a re-read.
        """
        if self.shared.cache.get(h.loop_id) is not h or len(seqs) != len(events) or not seqs or seqs[0] <= h.last_seq:
            return False
        for event, seq in zip(events, seqs, strict=True):
            h.apply(event, seq, copy=False)  # built for this commit alone: nothing else holds them
        return True


Position = tuple[str, int, bool]


def position(h: LoopHistory) -> Position:
    """Where the loop stands: (open turn id, committed steps in it, closed). A step's commit
    is still valid after a conflict only if the position did not change (e.g. just a new input)."""
    t = h.open_turn
    return (t.turn_id if t else "", t.steps if t else -1, h.closed)
