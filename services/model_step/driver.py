"""Drive loops: start turns, run steps (model → authorise → tools → commit), open gates, go idle.

The caller holds the loop's lease and passes it in as the drive's guard: every side effect (model
request, tool call, commit attempt) is preceded by ``guard.check()``, so a drive whose lease was
lost or lapsed (e.g. its process was stopped past the TTL) stops instead of acting. Each loop being
driven has its :class:`~services.model_step.drive.Drive` (its state, its fenced commits), made and
dropped by :meth:`LoopDriver.drive`; the loops' folds outlive their drives, in ``cache``.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable
from dataclasses import InitVar, dataclass, field

import anyio
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from services.lifecycle import raise_single
from services.model_step import gates, toolstep, tracing, turns
from services.model_step.drive import Drive, load_fold
from services.model_step.foldcache import FoldCache
from services.model_step.lease import Guard
from services.model_step.live import LiveOutbox
from services.model_step.models.base import ModelFactory
from services.model_step.runstep import run_step
from services.model_step.slots import SlotHolder
from services.model_step.steps import Action, next_action
from services.toolcaller.base import Execute, ToolLookup
from shared import events as ev
from shared.client import CommitClient
from shared.codec import decode_live
from shared.connection import subscribe_quick
from shared.errors import CommitRefused, StepAbandoned
from shared.events import new_id
from shared.history import GateState, LoopHistory
from shared.results import ResultStore
from shared.settings import Settings

log = logging.getLogger("loopwire.model_step")

# A bound on a drive's passes, not a budget: each pass commits something.
MAX_PASSES = 10_000


@dataclass
class LoopDriver:
    nc: NATS
    settings: Settings
    commits: CommitClient
    models: ModelFactory
    tools: ToolLookup
    execute: Execute
    # Step plans and tool-call records (None: not recorded, e.g. tests of the driver alone).
    results: ResultStore | None = None
    # Each loop's last fold, kept between drives (a drive reads on from it); made in __post_init__.
    cache: FoldCache = field(init=False)
    # The loops being driven in this process.
    _drives: dict[str, Drive] = field(default_factory=dict)
    # Sends the loops' live events in frames. The service shares it with its executor and runs its
    # clock for its lifetime (otherwise each drive runs the clock for itself).
    live: InitVar[LiveOutbox | None] = None
    outbox: LiveOutbox = field(init=False)

    def __post_init__(self, live: LiveOutbox | None) -> None:
        self.outbox = live if live is not None else LiveOutbox(self.nc, self.settings.names)
        self.cache = FoldCache(self.settings.model_step_folds)

    async def drive(self, loop_id: str, guard: Guard, slot: SlotHolder | None = None) -> LoopHistory:
        """Do every piece of pending work of ``loop_id`` while ``guard`` holds; return the final fold.

        ``slot``: the drive slot of the service's handler, given back while long tool calls run
        and taken again before each pass (None: the drive holds none, e.g. a test of the driver).
        Raises :class:`~services.model_step.lease.LeaseLost` when the guard stops holding.
        """
        if loop_id in self._drives:
            raise RuntimeError(f"loop {loop_id} is already being driven in this process")
        d = self._drives[loop_id] = Drive(self, loop_id, guard, slot)
        try:
            if self.outbox.running:
                return await self._drive(d)
            try:
                async with anyio.create_task_group() as tg:
                    await tg.start(self.outbox.run)
                    try:
                        h = await self._drive(d)
                    finally:
                        tg.cancel_scope.cancel()
            except BaseExceptionGroup as group:
                raise_single(group)  # the drive's own error (LeaseLost, ...), as itself
            return h
        finally:
            del self._drives[loop_id]

    async def open_turn_trace(self, loop_id: str) -> str:
        """The trace context recorded by the loop's open turn ("" with none); the read is cached."""
        t = (await load_fold(self, loop_id)).open_turn
        return t.traceparent if t is not None else ""

    async def _drive(self, d: Drive) -> LoopHistory:
        interrupted: dict[str, anyio.CancelScope] = {}
        sub = await self._watch(d, interrupted)
        turn_trace = tracing.TurnTrace(d.loop_id)
        rests = False  # the drive ended with nothing left to do (its turn, if any, waits at a gate)
        try:
            h = await d.refresh()
            passes = 0
            while passes < MAX_PASSES:
                # One cancel scope for the passes until an interrupt cancels it (then the drive reads
                # the history and goes on in a new one): a scope per pass cost every step its setup.
                with anyio.CancelScope() as scope:
                    interrupted["step"] = scope
                    while passes < MAX_PASSES:
                        nxt = next_action(h)
                        if nxt.action is Action.NONE:
                            rests = True
                            return h
                        passes += 1
                        if d.slot is not None:  # given back by a wait on calls that was cut short
                            await d.slot.take()
                        d.basis = h.last_seq  # the step's inputs are read from this fold
                        new_turn = new_id() if nxt.action is Action.START_TURN else ""
                        try:
                            with turn_trace.advance(h, new_turn):
                                await self._advance(d, h, nxt.action, nxt.gate, new_turn, turn_trace.recorded)
                        except StepAbandoned as e:
                            log.info("loop %s: step abandoned (%s)", d.loop_id, e, extra={"loop_id": d.loop_id})
                        except CommitRefused as e:
                            log.error("loop %s: commit refused: %s", d.loop_id, e, extra={"loop_id": d.loop_id})
                            if not await self._fail_after_refusal(d, str(e)):
                                return h
                        h = await d.refresh()
                interrupted.clear()
                h = await d.refresh()
        finally:
            # A drive stopped mid-turn leaves its turn's span to the drive that continues the turn.
            turn_trace.leave(self.cache.get(d.loop_id), rests=rests)
            await sub.unsubscribe()
        return h

    async def _watch(self, d: Drive, interrupted: dict[str, anyio.CancelScope]) -> Subscription:
        """Follow the loop API's records (the committer republishes them on the loop's control
        subject): another writer's record makes the drive read the history before going on, and an
        interrupt or close cancels the in-flight step. Subscribed before the first read: a record
        committed meanwhile is either read or flagged."""

        def on_ctl(msg: Msg) -> None:
            try:
                e = decode_live(msg.data)
            except Exception:  # (taken in the connection's read loop: it never raises)
                d.foreign = True
                return
            if e.event_id not in d.own:
                d.foreign = True  # someone else wrote: read the history before going on
            # Another writer (the committer's loop API) ended our turn: cancel the in-flight step now.
            if isinstance(e, ev.TurnInterrupted | ev.LoopClosed):
                for scope in interrupted.values():
                    scope.cancel()

        return await subscribe_quick(self.nc, self.settings.names.ctl(d.loop_id), on_ctl)

    async def _fail_after_refusal(self, d: Drive, why: str) -> bool:
        """End the open turn (turn_panic) so a refused step is not re-run forever; False if that fails too."""
        h = await d.read()
        if h.open_turn is None:
            return False
        d.basis = h.last_seq
        try:
            await turns.fail_turn(d, h, "turn_panic", f"step could not be committed: {why}")
        except (StepAbandoned, CommitRefused) as e:
            log.error("loop %s: could not end the turn: %s", d.loop_id, e, extra={"loop_id": d.loop_id})
            return False
        return True

    @staticmethod
    def _advance(
        d: Drive, h: LoopHistory, action: Action, gate: GateState | None, turn_id: str, traceparent: str
    ) -> Awaitable[None]:
        """The action's own coroutine (not one awaiting it: the step's every resumption passes
        through each coroutine frame of its chain). ``turn_id``, ``traceparent``: of a turn it starts."""
        match action:
            case Action.START_TURN:
                return turns.start_turn(d, h, turn_id, traceparent)
            case Action.IDLE:
                return turns.go_idle(d, h)
            case Action.RUN_STEP:
                return run_step(d, h)
            case Action.FINISH_TURN:
                return turns.end_turn(d, h)
            case Action.RESUME_GATE:
                # Continue the step parked at the gate with the operator's answer, without calling the
                # model. Calls of this step may have been sent before the answer came (a re-run after a stop).
                t = h.open_turn
                assert t is not None and gate is not None
                return toolstep.run_calls(d, h, t, gate.step_id, gates.resumed_step(h, gate), rerun=True)
        raise AssertionError(f"nothing to do for {action}")


__all__ = ["LoopDriver"]
