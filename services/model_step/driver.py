"""Drive one loop: start turns, run steps (model → authorise → tools → commit), open gates, go idle.

The caller holds the loop's lease and passes it in as the drive's guard: every side effect (model
request, tool call, commit attempt) is preceded by ``guard.check()``, so a drive whose lease was
lost or lapsed (e.g. its process was stopped past the TTL) stops instead of acting.

Commits are fenced by the expected sequence: every commit of a step — first send and every
unchanged retry — expects the loop's last sequence *at the moment the step's inputs were read*
(the drive's basis), never a value read later. A conflict re-reads the history from the stream and
decides again at the new position. One drive per loop runs in a process at a time, and a drive's
fold is its own: no two drives share mutable state.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import InitVar, dataclass, field
from typing import Final

import anyio
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from services.lifecycle import raise_single
from services.model_step import context, forkcalls, tracing
from services.model_step.budget import FAIL, Verdict, budget_verdict
from services.model_step.lease import Guard
from services.model_step.live import LiveOutbox
from services.model_step.models.accumulator import StreamAccumulator
from services.model_step.models.base import (
    ModelError,
    ModelFactory,
    ModelRequest,
    ModelStreamError,
    ToolDef,
    is_delta,
)
from services.model_step.policy import (
    ALLOW,
    ASK,
    ASK_RUNNING,
    DENY,
    WAIT_FOR_SOURCE,
    ForkWay,
    fork_way,
    gate_effect,
    policy_effect,
    tool_allowed_for_loop,
)
from services.model_step.steps import Action, always_allowed, execution_id_for, next_action, step_id_for
from services.toolcaller.base import Execute, PlannedCall, RecordFit, ToolLookup, step_needs_plan
from services.toolcaller.client import outcome_of
from services.toolcaller.executor import caller_span
from services.toolwire.spec import KIND_USER_INPUT, ToolSpec
from shared import events as ev
from shared import metrics, shaping, telemetry, tokens
from shared.backoff import Backoff
from shared.bus import is_gone
from shared.client import CommitClient
from shared.codec import decode_live
from shared.connection import subscribe_quick
from shared.content import AIMessage, Message, ToolResultMessage, clone, text_of
from shared.errors import CommitRefused as CommitRefused
from shared.errors import LoopwireError
from shared.errors import StepAbandoned as StepAbandoned
from shared.events import Cause, Event, make, new_id, now_rfc3339
from shared.history import GateState, LoopHistory, OpenTurn, add_usage, compaction_message, load
from shared.modelspec import context_window, model_id
from shared.pricing import price_of, step_cost_micro_usd
from shared.protocol import ConflictError, RemoteError, UnavailableError
from shared.results import DONE, ResultStore, StepPlan, args_digest
from shared.settings import Settings
from shared.toolcall import ToolCall

log = logging.getLogger("loopwire.model_step")


# Decision reasons of a re-run step's calls, and the gate reason of an unknown outcome.
RECORDED_RESULT = "recorded_result"
OUTCOME_UNKNOWN = "outcome_unknown"
RERUN_APPROVED = "rerun_approved"
GATE_OUTCOME_UNKNOWN: Final = "outcome_unknown"
OUTCOME_UNKNOWN_SUMMARY = "outcome unknown (may have run already), run again? "
ON_UNKNOWN_ASK = "ask"
RECORD_POLL_SECONDS = 0.1
WORKER_PING_SECONDS = 0.5
_RECORDED, _UNKNOWN = "recorded", "unknown"


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
    cache: dict[str, LoopHistory] = field(default_factory=dict)
    # Per loop being driven: event ids this driver offered, and whether a record of another writer
    # (the loop API: input, interrupt, answer, close) showed up on the live history subject.
    _own: dict[str, set[str]] = field(default_factory=dict)
    _foreign: dict[str, bool] = field(default_factory=dict)
    # Per loop being driven: its guard (the lease), and the last sequence of the fold the current
    # step was built from (the expected sequence of its commit).
    _guards: dict[str, Guard] = field(default_factory=dict)
    _basis: dict[str, int] = field(default_factory=dict)
    # Per loop being driven: the last sequence of this drive's own latest commit. A step at that
    # position is new: nobody else can have started it while this drive held the lease throughout.
    _made: dict[str, int] = field(default_factory=dict)
    # Per forked loop being driven: the source's recorded results after the fork point, and its fold.
    _fork_sources: dict[str, forkcalls.SourceView] = field(default_factory=dict)
    _source_folds: dict[str, LoopHistory] = field(default_factory=dict)
    # Per loop being driven: its messages' token counts (services.model_step.context).
    _token_memos: dict[str, context.Memo] = field(default_factory=dict)
    # Sends the loops' live events in frames. The service shares it with its executor and runs its
    # clock for its lifetime (otherwise each drive runs the clock for itself).
    live: InitVar[LiveOutbox | None] = None
    outbox: LiveOutbox = field(init=False)

    def __post_init__(self, live: LiveOutbox | None) -> None:
        self.outbox = live if live is not None else LiveOutbox(self.nc, self.settings.names)

    @property
    def _max_record(self) -> int:
        return self.settings.max_record_bytes

    # --- entry ------------------------------------------------------------------------------------

    async def drive(self, loop_id: str, guard: Guard) -> LoopHistory:
        """Do every piece of pending work of ``loop_id`` while ``guard`` holds; return the final fold.

        Raises :class:`~services.model_step.lease.LeaseLost` when the guard stops holding.
        """
        if loop_id in self._guards:
            raise RuntimeError(f"loop {loop_id} is already being driven in this process")
        self._guards[loop_id] = guard
        try:
            if self.outbox.running:
                return await self._drive(loop_id)
            try:
                async with anyio.create_task_group() as tg:
                    await tg.start(self.outbox.run)
                    try:
                        h = await self._drive(loop_id)
                    finally:
                        tg.cancel_scope.cancel()
            except BaseExceptionGroup as group:
                raise_single(group)  # the drive's own error (LeaseLost, ...), as itself
            return h
        finally:
            del self._guards[loop_id]
            self._basis.pop(loop_id, None)
            self._made.pop(loop_id, None)

    async def _drive(self, loop_id: str) -> LoopHistory:
        names = self.settings.names
        interrupted: dict[str, anyio.CancelScope] = {}
        own = self._own[loop_id] = set()
        self._foreign[loop_id] = True  # nothing is known yet: read the history first

        def on_ctl(msg: Msg) -> None:
            try:
                e = decode_live(msg.data)
            except Exception:  # (taken in the connection's read loop: it never raises)
                self._foreign[loop_id] = True
                return
            if e.event_id not in own:
                self._foreign[loop_id] = True  # someone else wrote: read the history before going on
            # Another writer (the committer's loop API) ended our turn: cancel the in-flight step now.
            if isinstance(e, ev.TurnInterrupted | ev.LoopClosed):
                for scope in interrupted.values():
                    scope.cancel()

        # The loop API's records (the committer republishes them on the loop's control subject).
        # Subscribe before the first read: a record committed meanwhile is either read or flagged.
        sub = await subscribe_quick(self.nc, names.ctl(loop_id), on_ctl)
        turn_trace = tracing.TurnTrace(loop_id)
        rests = False  # the drive ended with nothing left to do (its turn, if any, waits at a gate)
        try:
            h = await self._refresh(loop_id)
            passes = 0  # a bound, not a budget: each pass commits something
            while passes < 10_000:
                # One cancel scope for the passes until an interrupt cancels it (then the drive reads
                # the history and goes on in a new one): a scope per pass cost every step its setup.
                with anyio.CancelScope() as scope:
                    interrupted["step"] = scope
                    while passes < 10_000:
                        nxt = next_action(h)
                        if nxt.action is Action.NONE:
                            rests = True
                            return h
                        passes += 1
                        self._basis[loop_id] = h.last_seq  # the step's inputs are read from this fold
                        new_turn = new_id() if nxt.action is Action.START_TURN else ""
                        try:
                            with turn_trace.advance(h, new_turn):
                                await self._advance(h, nxt.action, nxt.gate, new_turn, turn_trace.recorded)
                        except StepAbandoned as e:
                            log.info("loop %s: step abandoned (%s)", loop_id, e, extra={"loop_id": loop_id})
                        except CommitRefused as e:
                            log.error("loop %s: commit refused: %s", loop_id, e, extra={"loop_id": loop_id})
                            if not await self._fail_after_refusal(loop_id, str(e)):
                                return h
                        h = await self._refresh(loop_id)
                interrupted.clear()
                h = await self._refresh(loop_id)
        finally:
            # A drive stopped mid-turn leaves its turn's span to the drive that continues the turn.
            turn_trace.leave(self.cache.get(loop_id), rests=rests)
            await sub.unsubscribe()
            self._own.pop(loop_id, None)
            self._foreign.pop(loop_id, None)
            self._fork_sources.pop(loop_id, None)
            self._source_folds.pop(loop_id, None)
            self._token_memos.pop(loop_id, None)
        return h

    async def open_turn_trace(self, loop_id: str) -> str:
        """The trace context recorded by the loop's open turn ("" with none); the read is cached."""
        t = (await self._load(loop_id)).open_turn
        return t.traceparent if t is not None else ""

    async def _refresh(self, loop_id: str) -> LoopHistory:
        """The loop's fold after our last commit: re-read only when another writer may have written.

        Our own commits are folded as they are acknowledged (the commit's expected sequence proves
        nothing else was appended before them), so the history is read again only when the loop's
        control subject showed a record of the loop API (or one that could not be parsed). A record
        written otherwise (another copy of this driver, a notice dropped on a reconnect) costs nothing
        in correctness: the next commit's expected sequence fails, and a conflict always re-reads.
        """
        h = self.cache.get(loop_id)
        if h is None or self._foreign.get(loop_id, True):
            self._foreign[loop_id] = False
            h = await self._load(loop_id)
        return h

    async def _fail_after_refusal(self, loop_id: str, why: str) -> bool:
        """End the open turn (turn_panic) so a refused step is not re-run forever; False if that fails too."""
        h = await self._load(loop_id)
        if h.open_turn is None:
            return False
        self._basis[loop_id] = h.last_seq
        try:
            await self._fail_turn(h, "turn_panic", f"step could not be committed: {why}")
        except (StepAbandoned, CommitRefused) as e:
            log.error("loop %s: could not end the turn: %s", loop_id, e, extra={"loop_id": loop_id})
            return False
        return True

    async def _load(self, loop_id: str) -> LoopHistory:
        h = await load(
            self.nc, self.settings.names, loop_id, self.cache.get(loop_id), consistent=self.settings.leader_reads
        )
        self.cache[loop_id] = h
        return h

    def _advance(
        self, h: LoopHistory, action: Action, gate: GateState | None, turn_id: str, traceparent: str
    ) -> Awaitable[None]:
        """The action's own coroutine (not one awaiting it: the step's every resumption passes
        through each coroutine frame of its chain). ``turn_id``, ``traceparent``: of a turn it starts."""
        if action is Action.START_TURN:
            inp = h.pending_inputs[0]
            assert inp.cause is not None
            ts = make(
                ev.TurnStarted,
                loop_id=h.loop_id,
                session_id=inp.session_id,
                turn_id=turn_id,
                turn_index=h.turns + 1,
                message=clone(inp.message),
                cause=Cause(command_id=inp.cause.command_id, event_id=inp.event_id),
                traceparent=traceparent,
            )
            return self._commit(h, lambda _h: [ts])
        if action is Action.IDLE:
            return self._commit(h, lambda _h: [make(ev.LoopIdle, loop_id=h.loop_id)])
        if action is Action.RUN_STEP:
            return self._run_step(h)
        if action is Action.FINISH_TURN:
            return self._end_turn(h)
        assert action is Action.RESUME_GATE and gate is not None
        return self._resume(h, gate)

    # --- commits ----------------------------------------------------------------------------------

    async def _commit(
        self, h: LoopHistory, build: Callable[[LoopHistory], list[Event] | None], *, chain: bool = False
    ) -> None:
        """Commit ``build(h)``; on a conflict re-read and rebuild while the step is still ours.

        ``build`` returns None when, after a re-read, the work no longer applies (abandon). The
        expected sequence is the fence: the drive's basis (the fold the step was built from), the
        same for every unchanged retry of an unanswered commit (it may have been stored), and only
        replaced by a conflict's fresh read. A conflict never produces a duplicate or a fork.

        ``chain``: the events are stored one by one, each right after the one before, up to the
        first another writer got ahead of (only for events of which every prefix is a history the
        driver continues from); the stored ones are folded and the history read again.
        """
        pos = _position(h)
        expected = self._basis.get(h.loop_id, h.last_seq)
        if h.last_seq != expected:
            raise StepAbandoned(f"the fold moved under the step ({expected} → {h.last_seq})")
        guard = self._guards.get(h.loop_id)
        backoff = Backoff(0.05, 2.0)
        folded = False
        events: list[Event] | None = None
        try:
            for _attempt in range(100):
                if events is None:
                    events = build(h)
                    if events is None:
                        raise StepAbandoned("work no longer applies")
                own = self._own.get(h.loop_id)
                if own is not None:
                    own.update(e.event_id for e in events)  # before sending: the live copy may overtake the reply
                if guard is not None:
                    guard.check()
                await self.outbox.flush(h.loop_id)  # a step's live events go out before it is committed
                try:
                    with tracing.commit(self.settings.names.history_stream, h.loop_id, len(events)) as span:
                        # Validated once, by the committer: an invalid event is refused there (a bug
                        # of this driver either way), and the same checks here cost every step.
                        result = await self.commits.commit(
                            h.loop_id, expected, events, max_record_bytes=self._max_record, validate=False, chain=chain
                        )
                        span.set_attribute(telemetry.LW_STREAM_SEQ, result.last_seq)
                except ConflictError:
                    events = None  # not stored: rebuild on the re-read history
                    h = await self._load(h.loop_id)
                    if _position(h) != pos:
                        raise StepAbandoned("history moved: another writer or an interrupt") from None
                    expected = self._basis[h.loop_id] = h.last_seq  # a new decision at the new position
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
                    if result.seqs:
                        self._made[h.loop_id] = result.seqs[-1]
                    folded = self._fold_committed(h, events[: len(result.seqs)], result.seqs)
                    if folded:
                        self._basis[h.loop_id] = h.last_seq
                        if len(result.seqs) < len(events):
                            self._foreign[h.loop_id] = True  # a chain cut short: another writer came between
                    return
            raise StepAbandoned("too many commit attempts")
        finally:
            if not folded:
                # Whether an unanswered or abandoned commit was stored is unknown here: re-read.
                self._foreign[h.loop_id] = True

    def _fold_committed(self, h: LoopHistory, events: list[Event], seqs: list[int]) -> bool:
        """Fold our just-committed events into the cached history, as a re-read would.

        The commit appended exactly these events at ``seqs`` right after ``h.last_seq`` (the
        expected sequence is the fence), so nothing of the loop lies between. Anything else is
        left to a re-read.
        """
        if self.cache.get(h.loop_id) is not h or len(seqs) != len(events) or not seqs or seqs[0] <= h.last_seq:
            return False
        for event, seq in zip(events, seqs, strict=True):
            h.apply(event, seq, copy=False)  # built for this commit alone: nothing else holds them
        return True

    async def _fail_turn(
        self, h: LoopHistory, kind: ev.TurnFailedKind, message: str, prefix: AIMessage | None = None
    ) -> None:
        t = h.open_turn
        assert t is not None
        step_id = step_id_for(t.turn_id, t.steps)

        def build(cur: LoopHistory) -> list[Event] | None:
            out: list[Event] = []
            if prefix is not None:
                out.append(self._step_done(cur, t, step_id, [prefix]))
            out.append(
                make(
                    ev.TurnFailed,
                    loop_id=cur.loop_id,
                    turn_id=t.turn_id,
                    turn_index=t.turn_index,
                    err=ev.TurnError(kind=kind, message=shaping.bounded_diagnostic(message)),
                )
            )
            out.extend(self._idle_if_nothing_pending(cur))
            return out

        await self._commit(h, build)

    def _idle_if_nothing_pending(self, h: LoopHistory) -> list[Event]:
        return [] if h.pending_inputs else [make(ev.LoopIdle, loop_id=h.loop_id)]

    def _step_done(self, h: LoopHistory, t: OpenTurn, step_id: str, messages: list[Message]) -> ev.StepDone:
        head = messages[0] if messages else None
        usage = head.usage if isinstance(head, AIMessage) else None
        # Priced now, from the table this process has: the record keeps the cost (docs/budgets.md).
        cost = step_cost_micro_usd(price_of(self._model_spec(h)), usage) if usage is not None else 0
        return make(
            ev.StepDone, loop_id=h.loop_id, turn_id=t.turn_id, step_id=step_id, messages=messages, cost_micro_usd=cost
        )

    def _model_spec(self, h: LoopHistory) -> str:
        return (h.config.model if h.config is not None else "") or self.settings.model

    async def _budget_stop(self, h: LoopHistory, t: OpenTurn, step_id: str, verdict: Verdict) -> None:
        """Fail the turn (kind budget) or open a budget gate before the step asks the model."""
        for limit in verdict.limits:
            metrics.inc(metrics.BUDGET_STOPS, limit, verdict.action)
        if verdict.action == FAIL:
            await self._fail_turn(h, "budget", verdict.message)
            return
        gate_id = new_id()
        common = {"loop_id": h.loop_id, "turn_id": t.turn_id, "step_id": step_id}
        opened = make(
            ev.GateOpened,
            **common,
            gate=ev.Gate(id=gate_id, kind="budget", controls=["approve", "deny"], tool_name=verdict.limits[0]),
        )
        tracing.gate_event("gate.opened", gate_id, "budget", verdict.limits[0])
        await self._commit(h, lambda _cur: [opened])

    async def _compact(
        self, h: LoopHistory, t: OpenTurn, step_id: str, fitted: context.Fitted, step: ModelRequest
    ) -> bool:
        """Have the model summarise the older messages and commit it (ContextCompacted); False when
        nothing is left to summarise. A failed summary fails the turn (and returns True).

        A model-step stopped meanwhile committed nothing: whoever runs the step next compacts the
        same messages again (the range depends only on the history). Two replicas cannot both
        commit one: the commit is fenced by the sequence the step was read at, and its event id is
        derived from the range, so an unanswered retry that was stored is a duplicate.
        """
        assert h.config is not None
        policy = h.config.context
        loop_spec = self._model_spec(h)
        spec = policy.model or loop_spec
        count = tokens.text_counter(loop_spec)
        memo = self._token_memos.setdefault(h.loop_id, {})
        fixed = context.fixed_tokens(step.system, step.tools, count)
        c = h.compaction
        previous = (c.upto, compaction_message(c.summary)) if c is not None else None
        window = policy.window or context_window(loop_spec)
        plan = context.plan_compaction(h.messages, previous, fixed, window, fitted, count, memo)
        if plan is None:
            return False
        try:
            model = self.models(spec)
        except ModelError as e:
            await self._fail_turn(h, "model_error", f"compaction: {e}")
            return True
        request = ModelRequest(
            model=model.model,
            system=context.COMPACT_SYSTEM,
            messages=plan.messages,
            max_tokens=plan.max_tokens,
            compaction=True,
        )
        guard = self._guards.get(h.loop_id)
        if guard is not None:
            guard.check()
        acc = StreamAccumulator()
        try:
            async for chunk in model.stream(request):
                if guard is not None and not guard.held:
                    guard.check()
                acc.add(chunk)
        except ModelError as e:
            await self._fail_turn(h, "model_error", f"compaction: the model failed: {e}")
            return True
        summary = text_of(acc.message()).strip()
        if not summary:
            await self._fail_turn(h, "empty_response", "compaction: the model returned an empty summary")
            return True
        after = plan.tail_tokens + tokens.message_tokens(compaction_message(summary), count)
        usage = acc.message().usage
        cost = step_cost_micro_usd(price_of(spec), usage) if usage is not None else 0
        event = ev.ContextCompacted(
            loop_id=h.loop_id,
            turn_id=t.turn_id,
            step_id=step_id,
            upto=plan.upto,
            previous_upto=plan.previous_upto,
            summary=summary,
            tokens_before=plan.tokens_before,
            tokens_after=after,
            model=spec,
            usage=usage,
            cost_micro_usd=cost,
            event_id=ev.compaction_id_for(h.loop_id, plan.upto),
            created_at=now_rfc3339(),
        )

        def build(cur: LoopHistory) -> list[Event] | None:
            done = cur.compaction.upto if cur.compaction is not None else 0
            return None if done != plan.previous_upto else [event]

        await self._commit(h, build)
        tracing.chat_context(None, context.COMPACT, after, plan.tokens_before, 0)
        return True

    # --- one step ---------------------------------------------------------------------------------

    async def _run_step(self, h: LoopHistory) -> None:
        t = h.open_turn
        assert t is not None and h.config is not None
        step_id = step_id_for(t.turn_id, t.steps)
        if self.results is not None and self._made.get(h.loop_id) != h.last_seq:
            plan = await self.results.plan(step_id)
            if plan is not None and plan.loop_id == h.loop_id and plan.turn_id == t.turn_id:
                # This step ran before (its model-step stopped before committing it): continue the
                # recorded decision instead of asking the model again, whose new calls would be new ids.
                await self._authorise_and_run(h, t, step_id, plan.step, rerun=True)
                return
        # Before the model is asked: a step already asked (its plan, above) is continued whatever
        # the budget says, as it was paid for.
        verdict = budget_verdict(h, now_rfc3339())
        if verdict.action != "go":
            await self._budget_stop(h, t, step_id, verdict)
            return
        spec = self._model_spec(h)
        try:
            model = self.models(spec)
        except ModelError as e:
            await self._fail_turn(h, "model_error", str(e))
            return
        request = ModelRequest(
            model=model.model,
            system=h.config.system,
            messages=list(h.model_messages),  # the fold's own messages: adapters only read them
            tools=self._tool_defs(h),
            max_tokens=h.config.limits.max_tokens,
        )
        fitted = context.fit_request(
            spec,
            h.config.context,
            request.system,
            request.tools,
            request.messages,
            request.max_tokens,
            self._token_memos.setdefault(h.loop_id, {}),
        )
        if fitted is not None:
            if context.wants_compaction(h.config.context, fitted) and await self._compact(
                h, t, step_id, fitted, request
            ):
                return  # committed: the step runs again from the compacted history
            if fitted.overflow:
                await self._fail_turn(h, "context_overflow", context.overflow_message(fitted))
                return
            request.messages = fitted.messages
            if h.compaction is not None:
                request.summarised = list(map(type, h.messages[: h.compaction.upto])).count(AIMessage)
        acc = StreamAccumulator()
        guard = self._guards.get(h.loop_id)
        if guard is not None:
            guard.check()
        model_name = model_id(request.model or spec)
        chat = tracing.chat(model_name, spec.split(":", 1)[0], h, step_id)

        def delta_of(c: ev.Chunk) -> ev.TokenDelta:
            return ev.TokenDelta(
                loop_id=h.loop_id, turn_id=t.turn_id, step_id=step_id, turn_index=t.turn_index, chunk=c
            )

        live = self.outbox
        try:
            with chat as chat_span:
                if fitted is not None:
                    tracing.chat_context(
                        chat_span, h.config.context.strategy, fitted.tokens, fitted.full_tokens, fitted.cleared
                    )
                async for chunk in model.stream(request):
                    if guard is not None and not guard.held:
                        guard.check()
                    if is_delta(chunk.kind):
                        live.chunk(h.loop_id, delta_of, chunk.kind, chunk.text, chunk.index, chunk.id, chunk.name)
                    acc.add(chunk)
                tracing.chat_result(chat_span, model_name, acc)
        except ModelStreamError as e:
            await self._fail_turn(
                h,
                "model_error",
                f"model stream failed: {e}",
                shaping.safe_prefix(acc.message(), shaping.TRUNCATED_NOTICE),
            )
            return
        except ModelError as e:
            await self._fail_turn(h, "model_error", str(e))
            return

        ai = acc.message()
        if shaping.is_empty_response(ai):
            await self._fail_turn(h, "empty_response", "the model returned an empty response")
            return
        stored, calls = shaping.sanitize_step(ai)
        if not calls:
            await self._answer(h, t, step_id, stored)
            return
        limits = h.config.limits
        iterations, calls_so_far = t.tool_iterations + 1, t.tool_calls + len(calls)
        if iterations > limits.max_iterations or calls_so_far > limits.max_calls_per_turn:
            await self._fail_turn(
                h,
                "tool_limit",
                f"tool limit reached: iterations {iterations}/{limits.max_iterations}, "
                f"calls {calls_so_far}/{limits.max_calls_per_turn}",
            )
            return
        suspended = ev.SuspendedStep(
            message=stored,
            calls=[c.raw() for c in calls],
            decisions=[],
            iteration=iterations,
            calls_so_far=calls_so_far,
        )
        if self.results is not None and step_needs_plan(self._spec(h, c.name) for c in calls if not c.minted_id):
            # (a step of read-only calls only needs no plan: asking the model again is harmless)
            if guard is not None:
                guard.check()
            await self.results.record_plan(
                StepPlan(loop_id=h.loop_id, turn_id=t.turn_id, step_id=step_id, step=suspended)
            )
        await self._authorise_and_run(h, t, step_id, suspended, calls)

    async def _resume(self, h: LoopHistory, g: GateState) -> None:
        """Continue a step parked at a gate with the operator's answer, without calling the model."""
        t = h.open_turn
        assert t is not None and g.resolved is not None and g.gate.step is not None
        s = g.gate.step
        effect = gate_effect(g.resolved)
        unknown = g.gate.reason == GATE_OUTCOME_UNKNOWN
        if effect == "approve":
            # A permission gate a fork copied open: the source may have run the call since.
            copied = h.forked is not None and g.opened_seq <= h.formed_seq and not g.gate.reason
            d = ev.Decision(
                tool_use_id=g.gate.tool_use_id,
                tool_execution_id=g.tool_execution_id,
                effect="approve",
                reason=RERUN_APPROVED if unknown else forkcalls.COPIED_GATE_APPROVED if copied else "gate_approved",
            )
        elif effect == "reply":
            d = ev.Decision(
                tool_use_id=g.gate.tool_use_id,
                tool_execution_id=g.tool_execution_id,
                effect="reply",
                reason="user_reply",
                text=g.resolved.text,
            )
        elif g.gate.reason == forkcalls.GATE_FORK_RERUN:
            # A forked call the operator chose not to run again: it takes the source's result.
            d = ev.Decision(
                tool_use_id=g.gate.tool_use_id,
                tool_execution_id=g.tool_execution_id,
                effect="approve",
                reason=forkcalls.FORK_REUSED,
            )
        else:
            why = g.resolved.reason or "denied by operator"
            d = ev.Decision(
                tool_use_id=g.gate.tool_use_id,
                tool_execution_id=g.tool_execution_id,
                effect="deny",
                reason="gate_denied",
                text=shaping.outcome_unknown(g.gate.tool_name) if unknown else shaping.permission_denied(why),
            )
        resumed = ev.SuspendedStep(
            message=s.message,
            calls=s.calls,
            decisions=[*s.decisions, d],
            iteration=s.iteration,
            calls_so_far=s.calls_so_far,
        )
        tracing.gate_event("gate.resolved", g.gate.id, g.gate.kind, g.gate.tool_name, effect=effect)
        # Calls of this step may have been sent before the gate's answer came (a re-run after a stop).
        await self._authorise_and_run(h, t, g.step_id, resumed, rerun=True)

    def _tool_defs(self, h: LoopHistory) -> list[ToolDef]:
        out = []
        for spec in self.tools.live():
            if tool_allowed_for_loop(h.config, spec.name):
                out.append(ToolDef(name=spec.name, description=spec.description, input_schema=spec.input_schema))
        return out

    def _spec(self, h: LoopHistory, name: str) -> ToolSpec | None:
        if not tool_allowed_for_loop(h.config, name):
            return None
        return self.tools.get(name)

    async def _authorise_and_run(
        self,
        h: LoopHistory,
        t: OpenTurn,
        step_id: str,
        s: ev.SuspendedStep,
        calls: list[ToolCall] | None = None,
        *,
        rerun: bool = False,
    ) -> None:
        """Authorise every call in call order (opening at most one gate), then run the batch and commit.

        ``calls``: the step's calls as just checked (:func:`shared.shaping.sanitize_step`); None for
        a step continued from its record (its plan or a gate), whose calls are checked here.

        ``rerun``: calls of this step may have been sent before (the step is continued from its plan
        or a gate); each call's record decides — finished: its outcome is reused; possibly run but
        unfinished: run again only if the tool is read-only or idempotent, else the loop's
        ``on_unknown`` (an error result, or a gate).
        """
        decided = {d.tool_use_id: d for d in s.decisions}
        grants = always_allowed(h)
        planned: list[PlannedCall] = []
        for call in calls if calls is not None else [ToolCall.of(c) for c in s.calls]:
            exec_id = execution_id_for(step_id, call.id)
            p = PlannedCall(call=call, execution_id=exec_id, fresh=not rerun)
            planned.append(p)
            if rerun and self.results is not None and not call.minted_id:
                prior = await self._prior(h, p)
                if prior == _RECORDED:
                    p.decision = ev.Decision(
                        tool_use_id=call.id, tool_execution_id=exec_id, effect="approve", reason=RECORDED_RESULT
                    )
                    continue
                known = decided.get(call.id)
                if prior == _UNKNOWN and not (known is not None and known.reason in (RERUN_APPROVED, "gate_denied")):
                    spec = self._spec(h, call.name)
                    if spec is None or not spec.rerun_safe:
                        if h.config is not None and h.config.on_unknown == ON_UNKNOWN_ASK:
                            await self._open_gate(h, t, step_id, s, p, spec, kind="permission", unknown=True)
                            return
                        p.decision = ev.Decision(
                            tool_use_id=call.id,
                            tool_execution_id=exec_id,
                            effect="deny",
                            reason=OUTCOME_UNKNOWN,
                            text=shaping.outcome_unknown(call.name),
                        )
                        continue
            if call.id in decided:
                p.decision = decided[call.id]
                if p.decision.reason == forkcalls.COPIED_GATE_APPROVED:
                    # Approved in the fork; but a call the source ran since (or may be running) is a
                    # repeated call, and the fork's re-execution rule decides whether it runs again.
                    spec = self._spec(h, call.name)
                    if spec is not None and not call.invalid:
                        way, s = await self._fork_repeat(h, t, step_id, s, p, spec)
                        if way in (forkcalls.ASK, ASK_RUNNING):
                            return
                elif p.decision.reason == forkcalls.FORK_REUSED:
                    view = await self._fork_view(h)
                    p.recorded = forkcalls.recorded_outcome(view.results, call.name, call.input)
                    if p.recorded is None:  # nothing to take: the source has not committed the call
                        p.decision = ev.Decision(
                            tool_use_id=call.id,
                            tool_execution_id=exec_id,
                            effect="deny",
                            reason=forkcalls.FORK_NO_RESULT,
                            text=shaping.fork_no_source_result(call.name),
                        )
                continue
            spec = self._spec(h, call.name)
            if call.minted_id or spec is None or call.invalid:
                continue  # a pre-execution failure: the executor reports it, no authorisation
            if h.forked is not None:
                way, s = await self._fork_repeat(h, t, step_id, s, p, spec)
                if way in (forkcalls.ASK, ASK_RUNNING):
                    return
                if way == forkcalls.REUSE:
                    continue
            if spec.kind == KIND_USER_INPUT:
                await self._open_gate(h, t, step_id, s, p, spec, kind="user_input")
                return
            effect = policy_effect(h.config, call.name, grants)
            if effect == ALLOW:
                reason = "always_allowed" if call.name in grants else "policy_allow"
                p.decision = ev.Decision(
                    tool_use_id=call.id, tool_execution_id=exec_id, effect="approve", reason=reason
                )
                if _has_policy(h.config) or reason == "always_allowed":
                    p.permission_event = self._decided(h, t, step_id, p, "approve", reason)
            elif effect == DENY:
                text = shaping.permission_denied(f"policy denies {call.name}")
                p.decision = ev.Decision(
                    tool_use_id=call.id, tool_execution_id=exec_id, effect="deny", reason="policy_deny", text=text
                )
                p.permission_event = self._decided(h, t, step_id, p, "deny", "policy_deny")
            else:
                assert effect == ASK
                await self._open_gate(h, t, step_id, s, p, spec, kind="permission")
                return
            s = _with_decision(s, p.decision)
        guard = self._guards.get(h.loop_id)
        if guard is not None:
            guard.check()
        results = await self.execute(
            loop_id=h.loop_id,
            turn_id=t.turn_id,
            step_id=step_id,
            planned=planned,
            limits=h.config.limits if h.config else ev.Limits(),
            spec_of=lambda name: self._spec(h, name),
            fence=guard,
            retries=h.config.retries if h.config else None,
            fit=RecordFit(s.message, self._max_record),
        )
        await self._commit_tool_step(h, t, step_id, s.message, planned, results)

    async def _fork_view(self, h: LoopHistory) -> forkcalls.SourceView:
        """The source's calls as the fork sees them; kept once the source rests (a busy one is read again)."""
        found = self._fork_sources.get(h.loop_id)
        if found is None and h.forked is not None:
            found, self._source_folds[h.loop_id] = await forkcalls.read_source(
                self.nc,
                self.settings.names,
                h.forked,
                self._max_record,
                self._source_folds.get(h.loop_id),
                consistent=self.settings.leader_reads,
            )
            if not found.busy:
                self._fork_sources[h.loop_id] = found
        return found or forkcalls.SourceView(results={}, busy=False)

    async def _settled_view(self, h: LoopHistory, p: PlannedCall, wait: float) -> forkcalls.SourceView:
        """The source's view once it has a result of ``p``'s call or rests, or after ``wait`` seconds."""
        deadline = anyio.current_time() + wait
        view = await self._fork_view(h)
        while view.busy and forkcalls.recorded_outcome(view.results, p.call.name, p.call.input) is None:
            if anyio.current_time() >= deadline:
                break
            await anyio.sleep(0.25)
            view = await self._fork_view(h)
        return view

    async def _fork_repeat(
        self, h: LoopHistory, t: OpenTurn, step_id: str, s: ev.SuspendedStep, p: PlannedCall, spec: ToolSpec
    ) -> tuple[ForkWay, ev.SuspendedStep]:
        """A fork's call that its source may have made too: asked (the step parks at a gate, opened
        here), reused (the step records the decision) or run as any call; the step as it is now."""
        way = await self._fork_reexecution(h, p, spec)
        if way in (forkcalls.ASK, ASK_RUNNING):
            await self._open_gate(h, t, step_id, s, p, spec, kind="permission", fork=True, running=way == ASK_RUNNING)
        elif way == forkcalls.REUSE:
            assert p.decision is not None
            s = _with_decision(s, p.decision)
        return way, s

    async def _fork_reexecution(self, h: LoopHistory, p: PlannedCall, spec: ToolSpec) -> ForkWay:
        """In a fork, what ``p``'s call does (:func:`~services.model_step.policy.fork_way`), after
        waiting, when the source may be running it, up to the tool's deadline (at most
        SOURCE_WAIT_SECONDS) for the source to commit it; reuse also sets the decision and the
        source's outcome."""
        assert h.forked is not None
        rule = forkcalls.reexecution_for(h.forked, p.call.name, spec)
        view = await self._fork_view(h)
        waited = False
        while True:
            outcome = forkcalls.recorded_outcome(view.results, p.call.name, p.call.input)
            known = outcome is not None
            way = fork_way(rule, source_result=known, source_busy=view.busy, rerun_safe=spec.rerun_safe, waited=waited)
            if way != WAIT_FOR_SOURCE:
                break
            wait = min(float(spec.timeout_seconds or 0.0), forkcalls.SOURCE_WAIT_SECONDS)
            view, waited = await self._settled_view(h, p, wait), True
        if way == forkcalls.REUSE:
            p.recorded = outcome
            p.decision = ev.Decision(
                tool_use_id=p.call.id, tool_execution_id=p.execution_id, effect="approve", reason=forkcalls.FORK_REUSED
            )
        return way

    async def _prior(self, h: LoopHistory, p: PlannedCall) -> str:
        """What an earlier run of the step left of this call: "" (nothing: it never started, or it
        was sent with other arguments, which its worker refuses), recorded, or unknown."""
        assert self.results is not None
        rec = await self.results.call(p.call.name, p.execution_id)
        if rec is None or rec.args_digest != args_digest(p.call.data):
            return ""
        if rec.state != DONE:
            # Started and not done: maybe still running on its worker (our predecessor stopped, not
            # the worker) — then its result comes within the call's deadline, unless the worker is gone.
            spec = self.tools.get(p.call.name)
            timeout = float(spec.timeout_seconds if spec is not None else self.settings.tool_timeout_seconds)
            left = rec.started_ms / 1000 + timeout + 3 * self.settings.heartbeat_seconds - time.time()
            until = time.monotonic() + max(0.0, left)
            with caller_span(p.call.name, p.call.id, p.execution_id):  # the worker's span's parent
                while rec.state != DONE:
                    if time.monotonic() >= until or await is_gone(
                        self.nc, self.settings.names.tool_worker(rec.worker_id), timeout=WORKER_PING_SECONDS
                    ):
                        return _UNKNOWN
                    await anyio.sleep(RECORD_POLL_SECONDS)
                    rec = await self.results.call(p.call.name, p.execution_id) or rec
        p.recorded = outcome_of(rec.reply_kind, bytes(rec.reply), rec.worker_id)
        return _RECORDED

    def _decided(
        self, h: LoopHistory, t: OpenTurn, step_id: str, p: PlannedCall, effect: str, reason: str
    ) -> ev.PermissionDecided:
        return make(
            ev.PermissionDecided,
            loop_id=h.loop_id,
            turn_id=t.turn_id,
            step_id=step_id,
            tool_execution_id=p.execution_id,
            tool_name=p.call.name,
            effect=effect,
            reason=reason,
        )

    async def _open_gate(
        self,
        h: LoopHistory,
        t: OpenTurn,
        step_id: str,
        s: ev.SuspendedStep,
        p: PlannedCall,
        spec: ToolSpec | None,
        *,
        kind: ev.GateKind,
        unknown: bool = False,
        fork: bool = False,
        running: bool = False,
    ) -> None:
        gate_id = new_id()
        common: dict[str, str] = {
            "loop_id": h.loop_id,
            "turn_id": t.turn_id,
            "step_id": step_id,
            "tool_execution_id": p.execution_id,
        }
        if kind == "user_input":
            question, choices = _question_of(p.call.input)
            controls: list[ev.GateAction] = ["reply"]
            request: Event = make(ev.UserInputRequested, **common, gate_id=gate_id, question=question, choices=choices)
        else:
            controls = ["approve", "approve_always", "deny"]
            request = make(
                ev.PermissionRequested,
                **common,
                request=ev.PermissionRequest(
                    gate_id=gate_id,
                    tool_name=p.call.name,
                    summary=_gate_summary(unknown=unknown, fork=fork, running=running)
                    + shaping.summary_for_call(p.call.name, p.call.input),
                ),
            )
        opened = make(
            ev.GateOpened,
            **common,
            gate=ev.Gate(
                id=gate_id,
                kind=kind,
                controls=controls,
                tool_use_id=p.call.id,
                tool_name=p.call.name,
                step=s,
                reason=GATE_OUTCOME_UNKNOWN if unknown else forkcalls.GATE_FORK_RERUN if fork else "",
            ),
        )

        tracing.gate_event("gate.opened", gate_id, kind, p.call.name)

        def build(cur: LoopHistory) -> list[Event] | None:
            return [opened, request]

        await self._commit(h, build)

    async def _answer(self, h: LoopHistory, t: OpenTurn, step_id: str, stored: AIMessage) -> None:
        """Commit the final answer, the turn's end and (no input waiting) ``LoopIdle``: one chained commit.

        Chained, not atomic: on a one-node (R1) file-stored stream the server stages every
        multi-record atomic batch in a store of its own on disk, which cost 5.5-7.6 ms of server CPU
        per batch against about 0.1 ms for plain publishes (docs/benchmarks.md). Each prefix of the
        three is a history the loop goes on from: one holding the answer but not yet the end is
        ended by ``next_action`` (``_end_turn``), with no further step in the turn, whoever drives
        the loop next; one ending the turn goes idle or starts the next input's turn.
        """

        def build(cur: LoopHistory) -> list[Event] | None:
            turn = cur.open_turn
            if turn is None or turn.turn_id != t.turn_id:
                return None
            usage = turn.usage if stored.usage is None else add_usage(turn.usage, stored.usage)
            done = make(
                ev.TurnDone,
                loop_id=cur.loop_id,
                turn_id=turn.turn_id,
                turn_index=turn.turn_index,
                message=clone(stored),
                usage=usage,
            )
            return [self._step_done(cur, t, step_id, [stored]), done, *self._idle_if_nothing_pending(cur)]

        await self._commit(h, build, chain=True)

    async def _end_turn(self, h: LoopHistory) -> None:
        """``TurnDone`` for a turn whose final answer is stored (its message and the turn's usage)."""

        def build(cur: LoopHistory) -> list[Event] | None:
            t = cur.open_turn
            answer = cur.messages[-1] if cur.messages else None
            if t is None or not t.answered or not isinstance(answer, AIMessage):
                return None
            return [
                make(
                    ev.TurnDone,
                    loop_id=cur.loop_id,
                    turn_id=t.turn_id,
                    turn_index=t.turn_index,
                    message=clone(answer),
                    usage=t.usage,
                )
            ]

        await self._commit(h, build)

    def _commit_tool_step(
        self,
        h: LoopHistory,
        t: OpenTurn,
        step_id: str,
        stored: AIMessage,
        planned: list[PlannedCall],
        results: list[ToolResultMessage],
    ) -> Awaitable[None]:
        decisions = [p.permission_event for p in planned if p.permission_event is not None]

        def build(cur: LoopHistory) -> list[Event] | None:
            folds: list[Event] = [
                make(
                    ev.TurnFoldedInto,
                    loop_id=cur.loop_id,
                    turn_id=t.turn_id,
                    turn_index=t.turn_index,
                    message=clone(inp.message),
                    cause=Cause(command_id=inp.cause.command_id if inp.cause else "", event_id=inp.event_id),
                )
                for inp in cur.pending_inputs
            ]
            return [*decisions, self._step_done(cur, t, step_id, [stored, *results]), *folds]

        return self._commit(h, build)


def _with_decision(s: ev.SuspendedStep, decision: ev.Decision) -> ev.SuspendedStep:
    """The step with one more call decided (what a gate opened later stores, to resume from)."""
    return ev.SuspendedStep(
        message=s.message,
        calls=s.calls,
        decisions=[*s.decisions, decision],
        iteration=s.iteration,
        calls_so_far=s.calls_so_far,
    )


def _has_policy(config: ev.LoopStarted | None) -> bool:
    """A loop with no policy at all allows every call; there is no decision worth recording per call."""
    return config is not None and (bool(config.policy) or config.default_policy != ALLOW)


Position = tuple[str, int, bool]


def _position(h: LoopHistory) -> Position:
    """Where the loop stands: (open turn id, committed steps in it, closed). A step's commit
    is still valid after a conflict only if the position did not change (e.g. just a new input)."""
    t = h.open_turn
    return (t.turn_id if t else "", t.steps if t else -1, h.closed)


def _question_of(raw: str) -> tuple[str, list[str]]:
    # (a gated call's arguments were checked when it was planned: this only reads them)
    try:
        args = json.loads(raw)
    except ValueError:
        return "(the model sent an unreadable question)", []
    if not isinstance(args, dict):
        return "(the model sent an unreadable question)", []
    q = args.get("question")
    choices = args.get("choices")
    question = q if isinstance(q, str) and q.strip() else "(no question given)"
    return question, [c for c in choices if isinstance(c, str)] if isinstance(choices, list) else []


__all__ = ["CommitRefused", "LoopDriver", "StepAbandoned"]


def _gate_summary(*, unknown: bool, fork: bool, running: bool) -> str:
    """What a permission gate says before the call's own summary."""
    if unknown:
        return OUTCOME_UNKNOWN_SUMMARY
    if fork:
        return forkcalls.FORK_RUNNING_SUMMARY if running else forkcalls.FORK_RERUN_SUMMARY
    return ""
