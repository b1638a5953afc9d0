"""A loop's committed history folded for every consumer (``LoopHistory``, ``fold``).

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

Reading a history is :mod:`shared.replay`'s.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any, Final, Literal, TypeVar

import msgspec

from shared.budget import Figures, extended, seconds_between, total_tokens
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
from shared.errors import UsageOverflowError
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

__all__ = ["TURN_ENDINGS", "GateState", "LoopHistory", "OpenTurn", "TurnEnding", "fold"]

# Events whose cause.command_id records a loop-API command (TurnStarted / TurnFoldedInto carry the
# command_id of the input they consume instead, which is not a new command).
COMMAND_EVENTS: Final = (LoopStarted, InputSubmitted, GateResolved, TurnInterrupted, LoopClosed, BudgetChanged)
_T = TypeVar("_T", bound=msgspec.Struct)

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
    last_at: str = ""  # the created_at of the last record (sequences of different shards do not compare)
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
        self.last_at = event.created_at
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
