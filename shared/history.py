"""A loop's committed history for every consumer: fold it (``LoopHistory``) and read it (``replay``).

Fold rules: ``TurnStarted`` appends its message, counts a turn and opens
it; ``StepDone`` appends its messages in order; ``TurnFoldedInto`` appends its message; the three
terminals close the turn and record how it ended, adding no message (TurnDone's is in the last StepDone);
everything else leaves ``messages`` alone. Usage is summed from StepDone AIMessage usage and a
ContextCompacted's own, never from TurnDone, so nothing is counted twice. Cost is summed from
``cost_micro_usd`` of the same two (per loop and per turn); the budget is LoopStarted's, replaced
by each BudgetChanged and extended by each approved budget gate (``shared.budget.extended``,
docs/budgets.md).

A lean fold (``lean=True``, the console's thousands of loops) keeps no messages (only their count),
step ids or command ids, nor the suspended steps of gates or the messages of pending inputs; the
state it derives is the same.

``replay`` reads the first 1,000 records with one Direct Get batch (no consumer: cheapest for a
short history or a tail) and anything beyond (a long history, or live records with ``follow=True``)
with an ordered consumer that starts right after the last record read, so nothing is missed or
repeated across the switch (faster than more Direct Get batches for a long history).
Every yielded event is freshly decoded and validated: the consumer owns it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any, Final, Literal, TypeVar

import msgspec
import nats.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import api

from shared.budget import Figures, extended, seconds_between, total_tokens
from shared.codec import DEFAULT_MAX_RECORD_BYTES, decode_event
from shared.content import (
    UINT64_MAX,
    AIMessage,
    Message,
    TextBlock,
    Usage,
    UserMessage,
    clone,
    clone_messages,
    tool_uses,
)
from shared.errors import InvalidEventError, Rule, UsageOverflowError
from shared.events import (
    Budget,
    BudgetChanged,
    ContextCompacted,
    Event,
    Gate,
    GateOpened,
    GateResolved,
    InputSubmitted,
    LoopClosed,
    LoopForked,
    LoopIdle,
    LoopStarted,
    StepDone,
    TurnDone,
    TurnError,
    TurnFailed,
    TurnFoldedInto,
    TurnInterrupted,
    TurnStarted,
)
from shared.jserrors import JetStreamUnavailableError
from shared.settings import Settings
from shared.streamreads import direct_get_batch, get_msg, subjects
from shared.subjects import DEFAULT_NAMES, Names
from shared.validate import is_uuid

__all__ = ["TURN_ENDINGS", "GateState", "LoopHistory", "OpenTurn", "TurnEnding", "fold", "load", "loops", "replay"]

# Events whose cause.command_id records a loop-API command (TurnStarted / TurnFoldedInto carry the
# command_id of the input they consume instead, which is not a new command).
COMMAND_EVENTS: Final = (LoopStarted, InputSubmitted, GateResolved, TurnInterrupted, LoopClosed, BudgetChanged)
DIRECT_BATCH: Final = 1000  # records read with one Direct Get before switching to a consumer
IDLE_TIMEOUT: Final = 10.0
_T = TypeVar("_T", bound=msgspec.Struct)
QUEUE_LIMIT: Final = 4096

# How a turn ended, by its terminal record.
TurnEnding = Literal["done", "failed", "interrupted"]
TURN_ENDINGS: Final[dict[type[Event], TurnEnding]] = {
    TurnDone: "done",
    TurnFailed: "failed",
    TurnInterrupted: "interrupted",
}


class OpenTurn(msgspec.Struct, kw_only=True):
    turn_id: str
    turn_index: int
    started_seq: int
    steps: int = 0
    tool_iterations: int = 0  # committed steps that ran tools
    tool_calls: int = 0  # tool uses in those steps
    usage: Usage = msgspec.field(default_factory=Usage)
    traceparent: str = ""  # the turn's trace (TurnStarted), "" when it was not traced
    started_at: str = ""  # the TurnStarted's created_at
    # A final answer (a one-message StepDone) is stored: the turn's only next record is its end.
    answered: bool = False
    cost_micro_usd: int = 0  # the turn's StepDone costs


class GateState(msgspec.Struct, kw_only=True):
    gate: Gate
    turn_id: str
    step_id: str
    tool_execution_id: str
    opened_seq: int
    resolved: GateResolved | None = None
    resolved_seq: int = 0


def add_usage(a: Usage, b: Usage) -> Usage:
    """``a + b``, saturating at uint64 instead of failing (the fold's sum of a turn's usages)."""
    try:
        return a.add(b)
    except UsageOverflowError:
        # Saturate instead of failing the fold: a history must always be readable.
        return Usage(**{f: min(UINT64_MAX, getattr(a, f) + getattr(b, f)) for f in Usage.__struct_fields__})


class LoopHistory(msgspec.Struct, kw_only=True):
    """The fold of one loop's committed events. Build with :func:`fold` or :meth:`apply`."""

    loop_id: str = ""
    config: LoopStarted | None = None
    messages: list[Message] = msgspec.field(default_factory=list)
    turns: int = 0
    open_turn: OpenTurn | None = None
    gates: dict[str, GateState] = msgspec.field(default_factory=dict)
    pending_inputs: list[InputSubmitted] = msgspec.field(default_factory=list)
    consumed_inputs: set[str] = msgspec.field(default_factory=set)
    commands: dict[str, int] = msgspec.field(default_factory=dict)  # command_id → seq of its last event
    step_ids: set[str] = msgspec.field(default_factory=set)
    last_seq: int = 0
    usage: Usage = msgspec.field(default_factory=Usage)
    closed: bool = False
    closed_seq: int = 0
    idle: bool = False
    events: int = 0
    # A forked loop: its LoopForked record, and how many of the records it announced are not stored yet.
    forked: LoopForked | None = None
    forming_left: int = 0
    formed_seq: int = 0  # the sequence of a fork's last copied record
    # Budget (docs/budgets.md): the loop's cost so far, per turn index, and its budget now (``budget``:
    # as set by LoopStarted or the latest BudgetChanged, then extended by approved budget gates).
    cost_micro_usd: int = 0
    turn_costs: dict[int, int] = msgspec.field(default_factory=dict)
    budget: Budget = msgspec.field(default_factory=Budget)
    budget_base: Budget = msgspec.field(default_factory=Budget)
    # The latest ContextCompacted (docs/context.md): ``messages`` keeps every message, ``model_messages``
    # is what model requests send.
    compaction: ContextCompacted | None = None
    # How the last ended turn ended (None before any), its index, and why when it failed.
    last_outcome: TurnEnding | None = None
    last_turn_index: int = 0
    last_error: TurnError | None = None
    # Lean fold (module docstring): ``messages``, ``step_ids`` and ``commands`` stay empty, so
    # ``model_messages`` and ``resolved_gates`` do not hold; ``dropped_messages`` counts the messages.
    lean: bool = False
    dropped_messages: int = 0

    # --- views

    @property
    def model_messages(self) -> list[Message]:
        """The messages a model request is built from: the latest compaction's summary in place of
        the messages it covers, then the messages after them (``messages`` itself when none)."""
        c = self.compaction
        if c is None:
            return self.messages
        return [compaction_message(c.summary), *self.messages[c.upto :]]

    @property
    def message_count(self) -> int:
        return len(self.messages) + self.dropped_messages

    @property
    def forming(self) -> bool:
        """A fork whose copied records are not all stored yet: not a loop to drive or command."""
        return self.forming_left > 0

    @property
    def started(self) -> bool:
        return self.config is not None

    @property
    def open_gates(self) -> list[GateState]:
        """Gates of the open turn nobody has resolved yet (in opening order)."""
        t = self.open_turn
        if t is None:
            return []
        return [g for g in self.gates.values() if g.resolved is None and g.turn_id == t.turn_id]

    @property
    def resolved_gates(self) -> list[GateState]:
        """Gates of the open turn that were answered (not abandoned) whose step is not committed yet."""
        t = self.open_turn
        if t is None:
            return []
        return [
            g
            for g in self.gates.values()
            if g.resolved is not None
            and g.resolved.action != "abandoned"
            and g.turn_id == t.turn_id
            and g.step_id not in self.step_ids
        ]

    def figures(self, now: str = "") -> Figures:
        """What the loop has spent, as its budget counts it; the turn's wall time up to ``now`` (RFC 3339)."""
        t = self.open_turn
        return Figures(
            tokens=total_tokens(self.usage),
            cost_micro_usd=self.cost_micro_usd,
            steps=t.steps if t is not None else 0,
            turn_seconds=seconds_between(t.started_at, now) if t is not None else 0.0,
        )

    def gate_is_open(self, gate_id: str) -> bool:
        g = self.gates.get(gate_id)
        t = self.open_turn
        return g is not None and g.resolved is None and t is not None and g.turn_id == t.turn_id

    # --- folding

    def apply(self, event: Event, seq: int = 0, *, copy: bool = True) -> None:
        """Fold one committed event (stored at ``seq``). Records at or below ``last_seq`` are skipped.

        Message content is cloned: the history never shares objects with the caller's event.
        ``copy=False`` takes the content over instead, for an event nobody else holds (one just
        decoded for this fold, as :func:`load` does); it saves a deep copy per record.
        """
        if seq and seq <= self.last_seq:
            return
        if not self.loop_id:
            self.loop_id = event.loop_id
        if seq:
            self.last_seq = seq
        self.events += 1
        if self.forming_left and not isinstance(event, LoopForked):
            self.forming_left -= 1
            if not self.forming_left:
                self.formed_seq = seq
        cmd = event.cause.command_id if event.cause is not None else ""
        if cmd and isinstance(event, COMMAND_EVENTS) and not self.lean:
            self.commands[cmd] = seq
        on = _FOLD.get(type(event))  # one small method per event type; the rest change nothing more
        if on is not None:
            on(self, event, seq, copy, cmd)

    def _step_done(self, e: StepDone, seq: int, copy: bool, cmd: str) -> None:
        self.idle = False
        if self.lean:
            msgs = e.messages or []
            self.dropped_messages += len(msgs)
        else:
            msgs = (clone_messages(e.messages) if copy else e.messages) or []
            self.messages.extend(msgs)
            self.step_ids.add(e.step_id)
        head = msgs[0] if msgs else None
        usage = head.usage if isinstance(head, AIMessage) else None
        self._spent(e.turn_id, usage, e.cost_micro_usd)
        t = self.open_turn
        if t is not None and t.turn_id == e.turn_id:
            t.steps += 1
            if len(msgs) > 1 and isinstance(head, AIMessage):
                t.tool_iterations += 1
                t.tool_calls += len(tool_uses(head))
            elif len(msgs) == 1:
                t.answered = True

    def _add_message(self, message: Message, copy: bool) -> None:
        if self.lean:
            self.dropped_messages += 1
        else:
            self.messages.append(_copied(message, copy))

    def _turn_started(self, e: TurnStarted, seq: int, copy: bool, cmd: str) -> None:
        self.idle = False
        self._add_message(e.message, copy)
        self.turns += 1
        self.open_turn = OpenTurn(
            turn_id=e.turn_id,
            turn_index=e.turn_index,
            started_seq=seq,
            traceparent=e.traceparent,
            started_at=e.created_at,
        )
        self._consume(cmd)

    def _folded_into(self, e: TurnFoldedInto, seq: int, copy: bool, cmd: str) -> None:
        self.idle = False
        self._add_message(e.message, copy)
        self._consume(cmd)

    def _turn_ended(self, e: TurnDone | TurnFailed | TurnInterrupted, seq: int, copy: bool, cmd: str) -> None:
        self.idle = False
        if self.open_turn is not None and self.open_turn.turn_id == e.turn_id:
            self.open_turn = None
        self.last_outcome = TURN_ENDINGS[type(e)]
        self.last_turn_index = e.turn_index
        self.last_error = _copied(e.err, copy) if isinstance(e, TurnFailed) else None

    def _input(self, e: InputSubmitted, seq: int, copy: bool, cmd: str) -> None:
        if cmd not in self.consumed_inputs:
            if self.lean:
                e = msgspec.structs.replace(e, message=UserMessage())
            self.pending_inputs.append(_copied(e, copy))

    def _gate_opened(self, e: GateOpened, seq: int, copy: bool, cmd: str) -> None:
        gate = msgspec.structs.replace(e.gate, step=None) if self.lean and e.gate.step is not None else e.gate
        self.gates[e.gate.id] = GateState(
            gate=_copied(gate, copy),
            turn_id=e.turn_id,
            step_id=e.step_id,
            tool_execution_id=e.tool_execution_id,
            opened_seq=seq,
        )

    def _gate_resolved(self, e: GateResolved, seq: int, copy: bool, cmd: str) -> None:
        g = self.gates.get(e.gate_id)
        if g is not None and g.resolved is None:
            g.resolved = _copied(e, copy)
            g.resolved_seq = seq
            if g.gate.kind == "budget" and e.action == "approve":
                self.budget = extended(self.budget, self.budget_base, self.figures(e.created_at))

    def _compacted(self, e: ContextCompacted, seq: int, copy: bool, cmd: str) -> None:
        # Only a compaction that continues the one before and covers folded messages counts: a
        # repeat of a stored one (or a stale one) changes nothing.
        done = self.compaction.upto if self.compaction is not None else 0
        if e.previous_upto == done < e.upto <= self.message_count:
            self.compaction = _copied(e, copy)
            self._spent(e.turn_id, e.usage, e.cost_micro_usd)

    def _budget_changed(self, e: BudgetChanged, seq: int, copy: bool, cmd: str) -> None:
        self.budget = _copied(e.budget, copy)
        self.budget_base = _copied(e.budget, copy)

    def _loop_idle(self, e: LoopIdle, seq: int, copy: bool, cmd: str) -> None:
        self.idle = True

    def _loop_closed(self, e: LoopClosed, seq: int, copy: bool, cmd: str) -> None:
        if not self.closed:
            self.closed = True
            self.closed_seq = seq

    def _loop_started(self, e: LoopStarted, seq: int, copy: bool, cmd: str) -> None:
        if self.config is None:
            self.config = _copied(e, copy)
            self.budget = _copied(e.budget, copy)
            self.budget_base = _copied(e.budget, copy)

    def _loop_forked(self, e: LoopForked, seq: int, copy: bool, cmd: str) -> None:
        if self.forked is None and self.events == 1:
            self.forked = _copied(e, copy)
            self.forming_left = e.records

    def _spent(self, turn_id: str, usage: Usage | None, cost_micro_usd: int) -> None:
        """A model request's usage and cost (a step's, a compaction's), added to the loop and its open turn."""
        t = self.open_turn
        in_turn = t is not None and t.turn_id == turn_id
        if usage is not None:
            self.usage = add_usage(self.usage, usage)
            if in_turn:
                assert t is not None
                t.usage = add_usage(t.usage, usage)
        if cost_micro_usd:
            self.cost_micro_usd += cost_micro_usd
            if in_turn:
                assert t is not None
                t.cost_micro_usd += cost_micro_usd
                self.turn_costs[t.turn_index] = t.cost_micro_usd

    def _consume(self, command_id: str) -> None:
        if not command_id:
            return
        self.consumed_inputs.add(command_id)
        self.pending_inputs = [i for i in self.pending_inputs if i.cause is None or i.cause.command_id != command_id]

    def copy(self) -> LoopHistory:
        """A deep, independent copy."""
        return msgspec.json.decode(msgspec.json.encode(self), type=LoopHistory)


SUMMARY_PREFIX: Final = "[Summary of the earlier conversation, written to fit the context window]\n"


@functools.lru_cache(maxsize=16)
def compaction_message(summary: str) -> UserMessage:
    """How a compaction's summary is sent to the model: a user message opening the conversation.
    One object per summary (requests only read it), so a step's token counts can be cached by it."""
    return UserMessage(blocks=[TextBlock(text=SUMMARY_PREFIX + summary)])


def _copied(value: _T, copy: bool) -> _T:
    return clone(value) if copy else value


_Fold = Callable[[LoopHistory, Any, int, bool, str], None]
# The fold's step for each event type it reads (exact types: events are never subclassed).
_FOLD: Final[dict[type[Event], _Fold]] = {
    StepDone: LoopHistory._step_done,
    TurnStarted: LoopHistory._turn_started,
    TurnFoldedInto: LoopHistory._folded_into,
    **dict.fromkeys(TURN_ENDINGS, LoopHistory._turn_ended),
    InputSubmitted: LoopHistory._input,
    GateOpened: LoopHistory._gate_opened,
    GateResolved: LoopHistory._gate_resolved,
    ContextCompacted: LoopHistory._compacted,
    BudgetChanged: LoopHistory._budget_changed,
    LoopIdle: LoopHistory._loop_idle,
    LoopClosed: LoopHistory._loop_closed,
    LoopStarted: LoopHistory._loop_started,
    LoopForked: LoopHistory._loop_forked,
}


def fold(events: Iterable[tuple[int, Event]], loop_id: str = "") -> LoopHistory:
    """Fold ``(seq, event)`` pairs in order into a new :class:`LoopHistory`."""
    h = LoopHistory(loop_id=loop_id)
    for seq, event in events:
        h.apply(event, seq)
    return h


# --- reading ----------------------------------------------------------------------------------


def _names(settings: Settings | None, names: Names | None) -> Names:
    if names is not None:
        return names
    return settings.names if settings is not None else DEFAULT_NAMES


def _decode(data: bytes, loop_id: str, max_bytes: int) -> Event:
    event = decode_event(data, max_bytes=max_bytes)
    if event.loop_id != loop_id:
        raise InvalidEventError(type(event).__name__, "loop_id", Rule.INVALID.value)
    return event


async def replay(
    nc: NATS,
    loop_id: str,
    *,
    settings: Settings | None = None,
    names: Names | None = None,
    from_seq: int = 0,
    follow: bool = False,
    max_record_bytes: int | None = None,
) -> AsyncIterator[tuple[int, Event]]:
    """Yield ``(seq, event)`` for every committed record of ``loop_id`` from ``from_seq``, in order.

    Without ``follow`` the iteration ends at the end of the history as it was when reached. With
    ``follow`` it then waits for new records forever (close the iterator to stop, e.g. with
    ``contextlib.aclosing``). Raises :class:`shared.errors.CodecError` / ``InvalidEventError`` for a
    record that does not decode (never expected: the committer validated it), and
    :class:`shared.bus.JetStreamUnavailableError` when the stream cannot be read.
    """
    if not is_uuid(loop_id):
        raise ValueError(f"loop_id must be a canonical UUID, got {loop_id!r}")
    n = _names(settings, names)
    max_bytes = max_record_bytes or (settings.max_record_bytes if settings is not None else DEFAULT_MAX_RECORD_BYTES)
    subject = n.hist(loop_id)
    last = max(0, from_seq - 1)
    # One Direct Get batch first: cheapest for the usual short history or tail (no consumer). When
    # what is left fits one more batch, a second batch beats creating a consumer for a few records.
    for attempt in range(2):
        batch = await direct_get_batch(nc, n.history_stream, subject, start_seq=last + 1, batch=DIRECT_BATCH)
        for m in batch.messages:
            if m.seq <= last:
                continue
            event = _decode(m.data, loop_id, max_bytes)
            last = m.seq
            yield m.seq, event
        more = bool(batch.messages) and batch.num_pending > 0
        if not more or follow or attempt == 1 or batch.num_pending > DIRECT_BATCH:
            break
    if not more and not follow:
        return
    # The rest of a long history and/or live records.
    async for item in _consume(nc, n, loop_id, subject, last, max_bytes, until_caught_up=not follow):
        yield item


async def _consume(
    nc: NATS, n: Names, loop_id: str, subject: str, last: int, max_bytes: int, *, until_caught_up: bool
) -> AsyncIterator[tuple[int, Event]]:
    """Records after ``last`` through an ordered consumer; ends once caught up if ``until_caught_up``."""
    # Hand messages over in bulk (one wake-up per burst, not per record). A slow reader blocks the
    # callback once QUEUE_LIMIT records wait, which lets the consumer's flow control slow the server.
    pending: deque[Msg] = deque()
    arrived = asyncio.Event()
    drained = asyncio.Event()

    async def on_msg(m: Msg) -> None:
        while len(pending) >= QUEUE_LIMIT:
            drained.clear()
            await drained.wait()
        pending.append(m)
        arrived.set()

    js = nc.jetstream()
    config = api.ConsumerConfig(
        deliver_policy=api.DeliverPolicy.BY_START_SEQUENCE,
        opt_start_seq=last + 1,
        inactive_threshold=30.0,
    )
    sub = await js.subscribe(subject, stream=n.history_stream, ordered_consumer=True, cb=on_msg, config=config)
    try:
        while True:
            if not pending:
                arrived.clear()
                if until_caught_up:
                    try:
                        await asyncio.wait_for(arrived.wait(), IDLE_TIMEOUT)
                    except TimeoutError:
                        raise JetStreamUnavailableError(f"replay of {subject} stalled for {IDLE_TIMEOUT:g}s") from None
                else:
                    await arrived.wait()
            burst = list(pending)
            pending.clear()
            drained.set()
            for m in burst:
                meta = m.metadata
                seq = meta.sequence.stream
                if seq > last:  # an ordered-consumer reset can redeliver
                    event = _decode(m.data, loop_id, max_bytes)
                    last = seq
                    yield seq, event
                if until_caught_up and meta.num_pending == 0:
                    return
    finally:
        with contextlib.suppress(nats.errors.Error, asyncio.CancelledError):
            await sub.unsubscribe()


async def load(
    nc: NATS,
    names: Names,
    loop_id: str,
    cached: LoopHistory | None = None,
    *,
    max_record_bytes: int | None = None,
    consistent: bool = True,
) -> LoopHistory:
    """The fold of ``loop_id``, reading only the records after ``cached.last_seq``.

    ``cached`` is advanced **in place** and returned (pass ``cached.copy()`` to keep the original).
    If the read fails midway, ``cached`` is still a correct fold of a prefix of the history.

    ``consistent`` (default): first ask the stream **leader** for the loop's last sequence and read
    until the fold reaches it. On R3 a Direct Get may be answered by a follower that lags by a few
    milliseconds; this makes "committed before the call" imply "in the fold" (one extra round trip).
    A one-replica stream needs none of it (``Settings.leader_reads``): its only server answers the
    Direct Get and holds every record it acknowledged.
    """
    h = cached if cached is not None else LoopHistory(loop_id=loop_id)
    target = 0
    if consistent:
        tip = await get_msg(nc, names.history_stream, last_by_subj=names.hist(loop_id))
        target = tip.seq if tip is not None else 0
        if target <= h.last_seq:  # nothing after the fold: no Direct Get
            return h
    loop = asyncio.get_running_loop()
    deadline = loop.time() + IDLE_TIMEOUT
    while True:
        async for seq, event in replay(
            nc, loop_id, names=names, from_seq=h.last_seq + 1, max_record_bytes=max_record_bytes
        ):
            h.apply(event, seq, copy=False)  # freshly decoded for this fold only
        if h.last_seq >= target:
            return h
        if loop.time() > deadline:
            raise JetStreamUnavailableError(f"replica behind the leader at {target} for {IDLE_TIMEOUT:g}s")
        await asyncio.sleep(0.01)


async def loops(nc: NATS, names: Names | None = None) -> list[str]:
    """Every loop id with at least one committed record, sorted."""
    n = names or DEFAULT_NAMES
    found = await subjects(nc, n.history_stream, n.hist_all)
    return sorted(n.loop_of_hist(s) for s in found)
