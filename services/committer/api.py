"""The loop API: ``lw.api.<loop_id>.<verb>`` (start, input, interrupt, answer, close, fork, budget).

Each command is a read-modify-write of the loop's folded history: fold (cached; only the tail is
read), decide, append with OCC at the folded ``last_seq``; on a conflict read the tail and decide
again. Every command is idempotent by its ``command_id``: it is stored in the written events'
``cause.command_id`` and a repeat is recognised from the fold (and the events' ids are derived from
it, so even two committers racing on one command store it once).
"""

from __future__ import annotations

import asyncio
import logging
import math
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from nats.aio.client import Client as NATS

from shared import telemetry
from shared.codec import encode_event
from shared.content import TextBlock, UserMessage
from shared.errors import ErrorKind, InvalidEventError, LoopwireError, Rule
from shared.events import (
    Budget,
    BudgetChanged,
    Cause,
    ContextPolicy,
    Event,
    GateResolved,
    InputSubmitted,
    Limits,
    LoopClosed,
    LoopStarted,
    TurnInterrupted,
    now_rfc3339,
)
from shared.history import LoopHistory
from shared.modelspec import spec_problem
from shared.pricing import price_of
from shared.protocol import (
    REQUEST_TYPES,
    RESOLVER_MAX_CHARS,
    AnswerRequest,
    ApiReply,
    BudgetRequest,
    CloseRequest,
    ForkRequest,
    InputRequest,
    InterruptRequest,
    StartRequest,
    WireError,
    decode_request,
    encode,
)
from shared.settings import Settings
from shared.subjects import VERBS
from shared.validate import is_uuid, validate_event
from shared.wiretypes import ALLOW, ANSWER_ACTIONS, POLICY_EFFECTS

from .appender import Appender, EventIdTaken
from .fork import fork
from .loops import Loops
from .looptools import LoopTools, loop_tools

log = logging.getLogger("loopwire.committer.api")

# Namespace of the event ids derived from (loop, verb, command, index).
_EVENT_NS: Final = uuid.UUID("8f7d2c56-93b4-4c1e-9a1f-6b0d3e5a7c21")


@dataclass(slots=True)
class Outcome:
    """What a command decided: events to append (``events``) or the answer without a write (``seq``)."""

    events: list[Event] = field(default_factory=list)
    seq: int = 0
    signal_work: bool = False


def _derived_id(loop_id: str, verb: str, command_id: str, k: int) -> str:
    return str(uuid.uuid5(_EVENT_NS, f"{loop_id}/{verb}/{command_id}/{k}"))


def _stamp(events: list[Event], loop_id: str, verb: str, command_id: str) -> list[Event]:
    now = now_rfc3339()
    for k, e in enumerate(events):
        e.event_id = _derived_id(loop_id, verb, command_id, k)
        e.created_at = now
        e.cause = Cause(command_id=command_id)
    return events


def _invalid(e: InvalidEventError) -> WireError:
    return WireError(ErrorKind.INVALID, str(e), event=e.event, field=e.field, rule=e.rule)


class LoopApi:
    def __init__(self, nc: NATS, settings: Settings, appender: Appender) -> None:
        self._nc = nc
        self._settings = settings
        self._names = settings.names
        self.loops = Loops(nc, settings, appender)

    async def handle(self, subject: str, data: bytes) -> bytes:
        """The reply to one loop-API request (never raises for bad input)."""
        verb = subject.rsplit(".", 1)[-1]
        attributes = {telemetry.MESSAGING_SYSTEM: "nats", telemetry.MESSAGING_OPERATION: verb}
        with telemetry.span(f"{verb} {self._names.prefix}.api", kind="server", attributes=attributes) as span:
            try:
                reply = await self._handle(subject, data)
            except WireError as e:
                telemetry.set_error(span, str(e.kind), str(e))
                return encode(ApiReply(ok=False, error=e.body()))
        return encode(reply)

    async def _handle(self, subject: str, data: bytes) -> ApiReply:
        tokens = subject.split(".")
        verb, loop_id = tokens[-1], tokens[-2] if len(tokens) >= 2 else ""
        if verb not in VERBS:
            raise WireError(
                ErrorKind.INVALID, f"unknown verb {verb!r}; expected one of {', '.join(VERBS)}", field="verb"
            )
        if not is_uuid(loop_id):
            raise WireError(ErrorKind.INVALID, f"loop id {loop_id!r} is not a canonical UUID", field="loop_id")
        req = decode_request(data, REQUEST_TYPES[verb])
        command_id = req.command_id  # type: ignore[attr-defined]
        if not is_uuid(command_id):
            raise WireError(ErrorKind.INVALID, "command_id must be a canonical UUID", field="command_id")
        if isinstance(req, ForkRequest):
            return await fork(self.loops, loop_id, req, _derived_id(loop_id, verb, command_id, 0))
        decide: Callable[[LoopHistory], Outcome]
        if isinstance(req, StartRequest):
            started = self._loop_started(loop_id, req)
            tools = await loop_tools(self._nc, self._settings, started.tools, started.policy)
            decide = lambda h: self._start(h, started, command_id, tools)  # noqa: E731
        elif isinstance(req, InputRequest):
            submitted = self._input_submitted(loop_id, req)
            decide = lambda h: self._input(h, submitted, command_id)  # noqa: E731
        elif isinstance(req, InterruptRequest):
            decide = lambda h: self._interrupt(h, loop_id, command_id)  # noqa: E731
        elif isinstance(req, AnswerRequest):
            decide = lambda h: self._answer(h, loop_id, req)  # noqa: E731
        elif isinstance(req, BudgetRequest):
            decide = lambda h: self._budget(h, loop_id, req)  # noqa: E731
        else:
            assert isinstance(req, CloseRequest)
            decide = lambda h: self._close(h, loop_id, command_id)  # noqa: E731
        async with self.loops.lock(loop_id):
            seq, signal, last = await self._read_modify_write(loop_id, verb, command_id, decide)
        if signal:
            await self.loops.queue_work(loop_id, seq, last)
        return ApiReply(ok=True, seq=seq, loop_id=loop_id if isinstance(req, StartRequest) else None)

    # --- read-modify-write ----------------------------------------------------------------------

    async def _read_modify_write(
        self, loop_id: str, verb: str, command_id: str, decide: Callable[[LoopHistory], Outcome]
    ) -> tuple[int, bool, Event | None]:
        """Decide on the loop's fold and append with OCC at its ``last_seq``; on a conflict read and decide again.

        The first decision may skip the read: on a quiet cached fold (see :class:`_HistoryCache`), or on
        an empty fold for a ``start`` of a loop this process does not know (nearly always a new loop).
        Only a decision that writes is taken that way, the append's expected sequence proving the
        fold was the latest; one that answers without a write, or refuses, reads the tail and
        decides again.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._settings.commit_retry_seconds
        unread = self.loops.cache.quiet(loop_id)
        if unread is None and verb == "start" and self.loops.cache.get(loop_id) is None:
            unread = LoopHistory(loop_id=loop_id)
        while True:
            h = unread if unread is not None else await self.loops.history(loop_id, deadline)
            try:
                outcome = decide(h)
            except WireError:
                if unread is None:
                    raise
                outcome = Outcome()  # refused on an unread fold: read it and decide again
            if not outcome.events:
                if unread is not None:
                    unread = None
                    continue
                return outcome.seq, outcome.signal_work, None
            events = _stamp(outcome.events, loop_id, verb, command_id)
            try:
                payloads = [encode_event(e, max_bytes=self._settings.max_record_bytes) for e in events]
            except InvalidEventError as e:
                raise _invalid(e) from None
            except LoopwireError as e:
                raise WireError(e.kind, str(e)) from None
            try:
                seqs = await self.loops.appender.append(loop_id, h.last_seq, payloads, [e.event_id for e in events])
            except WireError as e:
                # A taken event id: this very command was stored already (by another committer, or
                # before a restart); the history shows it as a repeat.
                if not (e.kind is ErrorKind.CONFLICT or isinstance(e, EventIdTaken)) or loop.time() > deadline:
                    raise
                log.debug("%s on %s raced another write (%s); reading the tail again", verb, loop_id, e)
                unread = None
                continue
            for event, seq in zip(events, seqs, strict=True):
                h.apply(event, seq)
            # A fold that gets a work signal now may be followed by a drive's records.
            self.loops.cache.put(loop_id, h, quiet=not outcome.signal_work)
            if verb != "start":  # a loop just started has no drive to tell
                await self._notify_driver(loop_id, payloads)
            return seqs[-1], outcome.signal_work, events[-1]

    async def _notify_driver(self, loop_id: str, payloads: list[bytes]) -> None:
        """Republish stored records on the loop's control subject for the model-step driving it.

        Best effort: a notice lost here only delays the driver until its next commit, whose
        expected sequence then fails and makes it read the history again.
        """
        subject = self._names.ctl(loop_id)
        try:
            for payload in payloads:
                await self._nc.publish(subject, payload)
        except Exception as e:
            log.warning("loop %s: could not notify its driver (%s)", loop_id, e)

    # --- building events ------------------------------------------------------------------------

    def _loop_started(self, loop_id: str, req: StartRequest) -> LoopStarted:
        if req.default_policy is not None and req.default_policy not in POLICY_EFFECTS:
            raise WireError(
                ErrorKind.INVALID, f"default_policy must be one of {', '.join(POLICY_EFFECTS)}", field="default_policy"
            )
        e = LoopStarted(
            loop_id=loop_id,
            model=req.model if req.model is not None else self._settings.model,
            system=req.system or "",
            tools=req.tools,
            policy=dict(req.policy or {}),
            default_policy=req.default_policy or ALLOW,
            limits=req.limits if req.limits is not None else Limits(),
            on_unknown=req.on_unknown or "error",
            retries=dict(req.retries or {}),
            parent=req.parent,
            budget=req.budget if req.budget is not None else Budget(),
            context=req.context if req.context is not None else ContextPolicy(),
        )
        if problem := spec_problem(e.model):
            raise WireError(ErrorKind.INVALID, problem, field="model")
        _check_budget(e.budget, e.model)
        _check_context(e.context, e.limits)
        _check(e)
        return e

    def _input_submitted(self, loop_id: str, req: InputRequest) -> InputSubmitted:
        if (req.text is None) == (req.message is None):
            raise WireError(ErrorKind.INVALID, "give exactly one of text and message", field="text")
        if req.message is not None:
            message = req.message
        else:
            assert req.text is not None
            if not req.text.strip():
                raise WireError(ErrorKind.INVALID, "text must not be empty", field="text", rule=Rule.REQUIRED.value)
            message = UserMessage(blocks=[TextBlock(text=req.text)])
        e = InputSubmitted(loop_id=loop_id, message=message)
        _check(e)
        return e

    # --- deciding -------------------------------------------------------------------------------

    def _repeat(self, h: LoopHistory, command_id: str) -> int | None:
        return h.commands.get(command_id)

    def _start(self, h: LoopHistory, started: LoopStarted, command_id: str, tools: LoopTools) -> Outcome:
        if h.forked is not None:
            raise WireError(ErrorKind.CONFLICT, "the loop was created by a fork", last_seq=h.last_seq)
        if h.config is not None:
            first = h.config.cause.command_id if h.config.cause is not None else ""
            if first == command_id:
                return Outcome(seq=h.commands.get(command_id, 0))
            raise WireError(ErrorKind.CONFLICT, "the loop was already started by another command", last_seq=h.last_seq)
        if h.last_seq:
            raise WireError(ErrorKind.CONFLICT, "the loop has history but no LoopStarted", last_seq=h.last_seq)
        # After the repeat check: a start already stored stands even if a tool it names is gone since.
        tools.check("policy", started.policy)
        # No work signal: a started loop has nothing to do until its first input, which signals
        # (steps.next_action); a signal here only cost a drive that found nothing.
        return Outcome(events=[started])

    def _require_loop(self, h: LoopHistory) -> None:
        if h.config is None:
            raise WireError(ErrorKind.NOT_FOUND, "no such loop (never started)")
        if h.forming:
            raise WireError(ErrorKind.NOT_FOUND, "the loop is still being forked (repeat the fork to finish it)")

    def _input(self, h: LoopHistory, submitted: InputSubmitted, command_id: str) -> Outcome:
        seq = self._repeat(h, command_id)
        if seq is not None:
            return Outcome(seq=seq, signal_work=True)
        self._require_loop(h)
        if h.closed:
            raise WireError(ErrorKind.CLOSED, "the loop is closed")
        return Outcome(events=[submitted], signal_work=True)

    def _abandon_turn(self, h: LoopHistory, loop_id: str, resolver: str, reason: str) -> list[Event]:
        t = h.open_turn
        if t is None:
            return []
        events: list[Event] = [
            GateResolved(
                loop_id=loop_id,
                turn_id=g.turn_id,
                step_id=g.step_id,
                tool_execution_id=g.tool_execution_id,
                gate_id=g.gate.id,
                action="abandoned",
                resolver=resolver,
            )
            for g in h.open_gates
        ]
        events.append(TurnInterrupted(loop_id=loop_id, turn_id=t.turn_id, turn_index=t.turn_index, reason=reason))
        return events

    def _interrupt(self, h: LoopHistory, loop_id: str, command_id: str) -> Outcome:
        seq = self._repeat(h, command_id)
        if seq is not None:
            return Outcome(seq=seq, signal_work=True)
        self._require_loop(h)
        # Refused, not answered ok: a caller told "done" would believe it stopped something.
        if h.closed:
            raise WireError(ErrorKind.CLOSED, f"the loop is closed (at seq {h.closed_seq}): no turn to interrupt")
        if h.open_turn is None:
            raise WireError(
                ErrorKind.CONFLICT, "no turn is running (the loop is idle): nothing to interrupt", last_seq=h.last_seq
            )
        return Outcome(events=self._abandon_turn(h, loop_id, "interrupt", "interrupted"), signal_work=True)

    def _answer(self, h: LoopHistory, loop_id: str, req: AnswerRequest) -> Outcome:
        seq = self._repeat(h, req.command_id)
        if seq is not None:
            return Outcome(seq=seq, signal_work=True)
        self._require_loop(h)
        if not is_uuid(req.gate_id):
            raise WireError(ErrorKind.INVALID, "gate_id must be a canonical UUID", field="gate_id")
        if len(req.resolver) > RESOLVER_MAX_CHARS or not req.resolver.isprintable():
            raise WireError(
                ErrorKind.INVALID,
                f"resolver must be at most {RESOLVER_MAX_CHARS} printable characters",
                field="resolver",
            )
        if req.action not in ANSWER_ACTIONS:
            raise WireError(ErrorKind.INVALID, f"action must be one of {', '.join(ANSWER_ACTIONS)}", field="action")
        g = h.gates.get(req.gate_id)
        if g is None:
            raise WireError(ErrorKind.NOT_FOUND, f"no gate {req.gate_id} in this loop")
        if not h.gate_is_open(req.gate_id):
            how = g.resolved.action if g.resolved is not None else "closed with its turn"
            raise WireError(ErrorKind.CLOSED, f"gate {req.gate_id} is no longer open ({how})")
        if g.gate.controls and req.action not in g.gate.controls:
            raise WireError(
                ErrorKind.INVALID,
                f"action {req.action!r} is not offered by this gate ({', '.join(g.gate.controls)})",
                field="action",
            )
        e = GateResolved(
            loop_id=loop_id,
            turn_id=g.turn_id,
            step_id=g.step_id,
            tool_execution_id=g.tool_execution_id,
            gate_id=req.gate_id,
            action=req.action,
            text=req.text,
            reason=req.reason,
            resolver=req.resolver.strip() or "operator",
        )
        return Outcome(events=[e], signal_work=True)

    def _budget(self, h: LoopHistory, loop_id: str, req: BudgetRequest) -> Outcome:
        seq = self._repeat(h, req.command_id)
        if seq is not None:
            return Outcome(seq=seq)
        self._require_loop(h)
        if h.closed:
            raise WireError(ErrorKind.CLOSED, "the loop is closed")
        assert h.config is not None
        _check_budget(req.budget, h.config.model or self._settings.model)
        e = BudgetChanged(loop_id=loop_id, budget=req.budget)
        _check(e)
        # No work signal: a drive running a turn reads it before its next step (the loop's control
        # subject), and a loop resting idle or at a gate has no step to check until a command comes.
        return Outcome(events=[e])

    def _close(self, h: LoopHistory, loop_id: str, command_id: str) -> Outcome:
        seq = self._repeat(h, command_id)
        if seq is not None:
            return Outcome(seq=seq)
        self._require_loop(h)
        if h.closed:
            raise WireError(ErrorKind.CLOSED, f"the loop is closed already (at seq {h.closed_seq})")
        events = self._abandon_turn(h, loop_id, "close", "closed")
        events.append(LoopClosed(loop_id=loop_id))
        return Outcome(events=events)


def _check_budget(budget: Budget, model: str) -> None:
    """A budget a loop can keep: finite limits, and a cost limit only for a model with a price."""
    for name in ("max_cost_usd", "max_turn_seconds"):
        value = getattr(budget, name)
        if not math.isfinite(value) or not 0 <= value <= 1e9:
            raise WireError(ErrorKind.INVALID, f"budget.{name} must be a number from 0 to 1e9", field="budget")
    if budget.max_cost_usd > 0 and price_of(model) is None:
        raise WireError(
            ErrorKind.INVALID,
            f"model {model!r} has no price in the price table: a loop with max_cost_usd needs one "
            "(docs/budgets.md); set no cost limit, or use a priced model",
            field="budget",
        )


# A window below this holds hardly a system prompt and a reply: a typo (16 for 16k), not a model.
MIN_CONTEXT_WINDOW: Final = 1_024
MAX_CONTEXT_WINDOW: Final = 100_000_000


def _check_context(policy: ContextPolicy, limits: Limits) -> None:
    """A context policy a loop can follow (docs/context.md)."""
    if policy.window and not MIN_CONTEXT_WINDOW <= policy.window <= MAX_CONTEXT_WINDOW:
        raise WireError(
            ErrorKind.INVALID,
            f"context.window must be 0 (the model's) or {MIN_CONTEXT_WINDOW} to {MAX_CONTEXT_WINDOW} tokens",
            field="context",
        )
    if policy.window and limits.max_tokens >= policy.window:
        raise WireError(
            ErrorKind.INVALID,
            f"limits.max_tokens ({limits.max_tokens}) leaves no room for input in context.window ({policy.window})",
            field="context",
        )
    if policy.model and (problem := spec_problem(policy.model)):
        raise WireError(ErrorKind.INVALID, f"context.model: {problem}", field="context")
    if policy.strategy == "none" and (policy.trigger or policy.clear_at_least or policy.exclude_tools):
        raise WireError(
            ErrorKind.INVALID,
            "context.trigger, clear_at_least and exclude_tools need a strategy (clear_tool_results or compact)",
            field="context",
        )


def _check(e: Event) -> None:
    """Validate a command's event before it is stamped (placeholder ids, as every API event gets them)."""
    probe = type(e)(**{f: getattr(e, f) for f in e.__struct_fields__})
    probe.event_id = str(uuid.UUID(int=1))
    probe.created_at = now_rfc3339()
    probe.cause = Cause(command_id=str(uuid.UUID(int=2)))
    try:
        validate_event(probe)
    except InvalidEventError as err:
        raise _invalid(err) from None
