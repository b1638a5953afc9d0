"""Forks: valid fork points, re-identified copies of a loop's records, lineage and branch diffs.

A fork is an ordinary loop whose history starts with ``LoopForked`` (source loop and sequence, what
changed), then ``LoopStarted`` (the source's configuration with the overrides), then the source's
records up to the fork point with every id re-derived for the new loop:

* ``event_id = uuid5(FORK_NS, "{new_loop}/{source_event_id}")`` (the same id on a retried fork);
* turn and gate ids: ``uuid5(FORK_NS, "{new_loop}/turn/{id}")`` / ``".../gate/{id}"``;
* step and tool execution ids follow from the new turn id exactly as for any turn (docs/protocol.md,
  "Derived ids"), so a forked turn that continues derives its next step ids like any other turn.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final

import msgspec
from nats.aio.client import Client as NATS

from shared import shards
from shared.codec import decode_event
from shared.content import AIMessage, TextBlock, ToolResultMessage, UserMessage, clone, tool_uses
from shared.errors import ForkPointError as ForkPointError
from shared.errors import LoopwireError
from shared.events import (
    Cause,
    Event,
    ForkChanges,
    GateOpened,
    GateResolved,
    InputSubmitted,
    LoopClosed,
    LoopForked,
    LoopIdle,
    LoopStarted,
    ParentRef,
    PermissionRequested,
    SourceCall,
    SourceCalls,
    StepDone,
    TurnDone,
    TurnFailed,
    TurnFoldedInto,
    TurnInterrupted,
    UserInputRequested,
    execution_id_for,
    step_id_for,
)
from shared.streamreads import get_msg
from shared.strictjson import StrictJSONError, loads
from shared.subjects import Names

FORK_NS: Final = uuid.UUID("2b6f0c1e-8d4a-4f3b-9c27-5e1a7d9b3f60")
# Records after which a loop is consistent: an input, a step (with the inputs folded into it), a turn's end.
POINT_TYPES: Final = (InputSubmitted, StepDone, TurnFoldedInto, TurnDone, TurnFailed, TurnInterrupted)
# Records committed in the same group as a step, after its StepDone: a point is after them.
_STEP_TAIL: Final = (TurnFoldedInto, TurnDone, TurnFailed)
# Records never copied: the source's own lineage and configuration (the fork writes its own).
_NOT_COPIED: Final = (LoopForked, LoopStarted)
# Keys that identify rather than say something: ignored when branches are compared.
_ID_KEYS: Final = frozenset(
    {"loop_id", "turn_id", "step_id", "tool_execution_id", "event_id", "created_at", "cause", "session_id", "gate_id"}
)


def _fid(new_loop: str, kind: str, old: str) -> str:
    return str(uuid.uuid5(FORK_NS, f"{new_loop}/{kind}{old}"))


def fork_event_id(new_loop: str, source_event_id: str) -> str:
    return _fid(new_loop, "", source_event_id)


class ForkPoints:
    """The valid fork points of one loop, kept as its records are fed in order with :meth:`add`.

    A step's point moves past the records committed in its group after it (``_STEP_TAIL``), so
    each record can only withdraw the point its predecessor made.
    """

    __slots__ = ("_last", "points")

    def __init__(self) -> None:
        self.points: list[int] = []
        self._last: Event | None = None

    def add(self, seq: int, e: Event) -> None:
        prev, self._last = self._last, e
        if isinstance(prev, StepDone | TurnFoldedInto) and isinstance(e, _STEP_TAIL) and e.turn_id == prev.turn_id:
            self.points.pop()  # the step's group goes on: the point is after its last record
        if isinstance(e, POINT_TYPES):
            self.points.append(seq)


def valid_points(records: Iterable[tuple[int, Event]]) -> list[int]:
    """Sequences of ``records`` (one loop, in order) a fork may start after."""
    fp = ForkPoints()
    for seq, e in records:
        fp.add(seq, e)
    return fp.points


def check_point(records: Sequence[tuple[int, Event]], at: int | None) -> int:
    """The fork point: ``at`` if valid, the last valid point if None; else ForkPointError naming the nearest."""
    points = valid_points(records)
    if not points:
        raise ForkPointError("the loop has no fork point yet (no input, step or finished turn)")
    if at is None:
        return points[-1]
    if at in points:
        return at
    before = [p for p in points if p < at]
    after = [p for p in points if p > at]
    near = ", ".join(str(p) for p in ([before[-1]] if before else []) + ([after[0]] if after else []))
    what = next((type(e).__name__ for s, e in records if s == at), "")
    where = f"seq {at} ({what})" if what else f"seq {at} (not a record of this loop)"
    raise ForkPointError(f"{where} is not a fork point (after an input, a step or a turn's end); nearest valid: {near}")


@dataclass(frozen=True, slots=True)
class ForkSpec:
    new_loop: str
    source_loop: str
    at: int
    command_id: str
    created_at: str
    changes: ForkChanges
    reexecution: dict[str, Any]
    source_calls: SourceCalls | None = None


class _Ids:
    """Re-derives every id of the copied records for the new loop."""

    def __init__(self, new_loop: str, copied: Sequence[Event]) -> None:
        self.new = new_loop
        self._steps: dict[str, str] = {}
        self._execs: dict[str, str] = {}
        counts: dict[str, int] = {}
        uses: list[tuple[str, str]] = []  # (source step id, tool_use_id)
        for e in copied:
            if e.turn_id and e.step_id and e.step_id not in self._steps:
                k = counts.get(e.turn_id, 0)
                if step_id_for(e.turn_id, k) == e.step_id:
                    self._steps[e.step_id] = step_id_for(self.turn(e.turn_id), k)
            if isinstance(e, StepDone):
                counts[e.turn_id] = counts.get(e.turn_id, 0) + 1
                head = e.messages[0] if e.messages else None
                if isinstance(head, AIMessage):
                    uses += [(e.step_id, b.id) for b in tool_uses(head)]
            elif isinstance(e, GateOpened):
                uses.append((e.step_id, e.gate.tool_use_id))
                if e.gate.step is not None:
                    uses += [(e.step_id, c.id) for c in e.gate.step.calls]
        for step, tuid in uses:
            if tuid and step in self._steps:
                self._execs[execution_id_for(step, tuid)] = execution_id_for(self._steps[step], tuid)

    def turn(self, old: str) -> str:
        return _fid(self.new, "turn/", old) if old else ""

    def step(self, old: str) -> str:
        return self._steps.get(old) or (_fid(self.new, "step/", old) if old else "")

    def execution(self, old: str) -> str:
        return self._execs.get(old) or (_fid(self.new, "exec/", old) if old else "")

    def gate(self, old: str) -> str:
        return _fid(self.new, "gate/", old) if old else ""

    def event(self, old: str) -> str:
        return fork_event_id(self.new, old) if old else ""

    def apply(self, source: Event) -> Event:
        e = clone(source)
        e.loop_id = self.new
        e.turn_id = self.turn(e.turn_id)
        e.step_id = self.step(e.step_id)
        e.tool_execution_id = self.execution(e.tool_execution_id)
        e.event_id = self.event(e.event_id)
        if e.cause is not None:
            e.cause = Cause(
                command_id=e.cause.command_id,
                event_id=self.event(e.cause.event_id),
                tool_execution_id=self.execution(e.cause.tool_execution_id),
            )
        if isinstance(e, GateOpened):
            e.gate.id = self.gate(e.gate.id)
            if e.gate.step is not None:
                for d in e.gate.step.decisions:
                    d.tool_execution_id = self.execution(d.tool_execution_id)
        elif isinstance(e, GateResolved | UserInputRequested):
            e.gate_id = self.gate(e.gate_id)
        elif isinstance(e, PermissionRequested):
            e.request.gate_id = self.gate(e.request.gate_id)
        return e


def _fork_input_command(spec: ForkSpec) -> str:
    return _fid(spec.new_loop, "input/", spec.command_id)


def build_fork(spec: ForkSpec, records: Sequence[tuple[int, Event]], first_event_id: str) -> list[Event]:
    """Every record of the fork, in order: LoopForked, LoopStarted, the copies (and an added input)."""
    config = next((e for _, e in records if isinstance(e, LoopStarted)), None)
    if config is None:
        raise ForkPointError("the source loop was never started")
    copied = [e for s, e in records if s <= spec.at and not isinstance(e, (*_NOT_COPIED, LoopClosed))]
    ids = _Ids(spec.new_loop, copied)
    cause = Cause(command_id=spec.command_id)
    started = clone(config)
    started.loop_id = spec.new_loop
    started.event_id = _fid(spec.new_loop, "started/", spec.command_id)
    started.created_at = spec.created_at
    started.cause = cause
    # A fork of a sub-agent's child is a loop of its own: no parent's call waits for its answer.
    started.parent = None
    ch = spec.changes
    if ch.model is not None:
        started.model = ch.model
    if ch.system is not None:
        started.system = ch.system
    if ch.policy:
        started.policy = {**started.policy, **ch.policy}
    body: list[Event] = [started, *(ids.apply(e) for e in copied)]
    if ch.input is not None:
        message = UserMessage(blocks=[TextBlock(text=ch.input)])
        last = body[-1]
        if isinstance(last, InputSubmitted) and copied and copied[-1].event_id == records_at(records, spec.at):
            last.message = message  # the point ends with this input: replace it
        else:
            body.append(
                InputSubmitted(
                    loop_id=spec.new_loop,
                    event_id=_fid(spec.new_loop, "input-event/", spec.command_id),
                    created_at=spec.created_at,
                    cause=Cause(command_id=_fork_input_command(spec)),
                    message=message,
                )
            )
    forked = LoopForked(
        loop_id=spec.new_loop,
        event_id=first_event_id,
        created_at=spec.created_at,
        cause=cause,
        source_loop_id=spec.source_loop,
        source_seq=spec.at,
        records=len(body),
        changes=ch,
        reexecution=dict(spec.reexecution),
        source_calls=spec.source_calls,
    )
    return [forked, *body]


def records_at(records: Sequence[tuple[int, Event]], seq: int) -> str:
    """The event id of the record at ``seq`` ("" if none)."""
    return next((e.event_id for s, e in records if s == seq), "")


# --- re-execution: the source's calls after the fork point ---------------------------------------


def call_key(name: str, raw_input: str | bytes) -> tuple[str, str]:
    """(tool name, canonical arguments): equal for equal calls whatever the key order or spacing."""
    try:
        value = loads(raw_input)
    except (StrictJSONError, ValueError):
        return name, raw_input.decode("utf-8", "replace") if isinstance(raw_input, bytes) else raw_input
    return name, msgspec.json.encode(value, order="sorted").decode()


def source_results(records: Iterable[tuple[int, Event]], after: int) -> dict[tuple[str, str], ToolResultMessage]:
    """The source's recorded tool results after ``after``, by call (the first of equal calls wins)."""
    out: dict[tuple[str, str], ToolResultMessage] = {}
    for seq, e in records:
        if seq <= after or not isinstance(e, StepDone) or not e.messages:
            continue
        head = e.messages[0]
        if not isinstance(head, AIMessage):
            continue
        results = {m.tool_use_id: m for m in e.messages[1:] if isinstance(m, ToolResultMessage)}
        for use in tool_uses(head):
            r = results.get(use.id)
            if r is not None:
                out.setdefault(call_key(use.name, bytes(use.input)), r)
    return out


def source_calls(records: Iterable[tuple[int, Event]], after: int, *, busy: bool) -> SourceCalls:
    """The source's calls after ``after`` as a fork copies them (``busy``: the source had work to do)."""
    found = source_results(records, after)
    return SourceCalls(calls=[SourceCall(name=n, input=i, result=r) for (n, i), r in found.items()], busy=busy)


# --- comparing branches ----------------------------------------------------------------------------


def _strip(value: Any) -> Any:
    if isinstance(value, dict):
        out = {k: _strip(v) for k, v in value.items() if k not in _ID_KEYS}
        if isinstance(value.get("gate"), dict):
            out["gate"] = {k: _strip(v) for k, v in value["gate"].items() if k != "id"}
        return out
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


def content_of(e: Event) -> Any:
    """An event without its identifying fields: what two branches compare."""
    return _strip(msgspec.json.decode(msgspec.json.encode(e)))


def conversation(records: Iterable[tuple[int, Event]]) -> list[tuple[int, Event]]:
    """A loop's records as branches compare them: without lineage (LoopForked) or idle markers."""
    return [(s, e) for s, e in records if not isinstance(e, LoopForked | LoopIdle)]


def common_prefix(a: Sequence[tuple[int, Event]], b: Sequence[tuple[int, Event]]) -> int:
    n = 0
    for (_, x), (_, y) in zip(a, b, strict=False):
        if content_of(x) != content_of(y):
            break
        n += 1
    return n


# --- lineage -----------------------------------------------------------------------------------------


async def first_record(nc: NATS, names: Names, loop_id: str) -> Event | None:
    """A loop's first committed record (None: no history, or it does not decode)."""
    home = await shards.home_of(nc, names, loop_id)
    m = await get_msg(nc, home.stream, seq=1, next_by_subj=home.subject)
    if m is None:
        return None
    try:
        return decode_event(m.data)
    except LoopwireError:
        return None


async def parents(nc: NATS, names: Names, loop_ids: Iterable[str]) -> dict[str, LoopForked | None]:
    """Per loop: its LoopForked record (None for a loop that was started, not forked)."""
    out: dict[str, LoopForked | None] = {}
    for loop_id in loop_ids:
        first = await first_record(nc, names, loop_id)
        out[loop_id] = first if isinstance(first, LoopForked) else None
    return out


async def origins(nc: NATS, names: Names, loop_ids: Iterable[str]) -> dict[str, LoopForked | ParentRef | None]:
    """Per loop: where it comes from: its LoopForked (a fork), the parent's call it runs for (a
    sub-agent's child, from its LoopStarted), or None (a loop started on its own)."""
    out: dict[str, LoopForked | ParentRef | None] = {}
    for loop_id in loop_ids:
        first = await first_record(nc, names, loop_id)
        if isinstance(first, LoopForked):
            out[loop_id] = first
        elif isinstance(first, LoopStarted) and first.parent is not None:
            out[loop_id] = first.parent
        else:
            out[loop_id] = None
    return out


def descendants(origins_: dict[str, LoopForked | ParentRef | None], loop_id: str) -> list[str]:
    """The sub-agent child loops of ``loop_id``, theirs, and so on (depth first); forks are not children."""
    kids: dict[str, list[str]] = {}
    for child, o in origins_.items():
        if isinstance(o, ParentRef):
            kids.setdefault(o.loop_id, []).append(child)
    found: list[str] = []
    todo = list(reversed(kids.get(loop_id, [])))
    while todo:
        child = todo.pop()
        if child in found or child == loop_id:
            continue  # a cycle can only be forged, never made by agents; do not loop on it
        found.append(child)
        todo.extend(reversed(kids.get(child, [])))
    return found


__all__ = [
    "FORK_NS",
    "ForkPointError",
    "ForkPoints",
    "ForkSpec",
    "build_fork",
    "call_key",
    "check_point",
    "common_prefix",
    "content_of",
    "conversation",
    "descendants",
    "fork_event_id",
    "origins",
    "parents",
    "source_calls",
    "source_results",
    "valid_points",
]
