"""The records that start, continue and end a turn: its start, a step's result, its answer, its
end or failure, and the loop going idle. Each is committed through the loop's :class:`Drive`."""

from __future__ import annotations

from collections.abc import Awaitable

from services.model_step.drive import Drive
from services.model_step.steps import step_id_for
from services.toolcaller.base import PlannedCall
from shared import events as ev
from shared import shaping, wiretypes
from shared.content import AIMessage, Message, ToolResultMessage, clone
from shared.events import Cause, Event, make
from shared.history import LoopHistory, OpenTurn, add_usage
from shared.pricing import price_of, step_cost_micro_usd


def start_turn(d: Drive, h: LoopHistory, turn_id: str, traceparent: str) -> Awaitable[None]:
    """``TurnStarted`` for the first waiting input, with the turn's id and trace context."""
    inp = h.pending_inputs[0]
    assert inp.cause is not None
    started = make(
        ev.TurnStarted,
        loop_id=h.loop_id,
        session_id=inp.session_id,
        turn_id=turn_id,
        turn_index=h.turns + 1,
        message=clone(inp.message),
        cause=Cause(command_id=inp.cause.command_id, event_id=inp.event_id),
        traceparent=traceparent,
    )
    return d.commit(h, lambda _h: [started])


def go_idle(d: Drive, h: LoopHistory) -> Awaitable[None]:
    return d.commit(h, lambda _h: [make(ev.LoopIdle, loop_id=h.loop_id)])


def idle_if_nothing_pending(h: LoopHistory) -> list[Event]:
    return [] if h.pending_inputs else [make(ev.LoopIdle, loop_id=h.loop_id)]


def step_done(d: Drive, h: LoopHistory, t: OpenTurn, step_id: str, messages: list[Message]) -> ev.StepDone:
    head = messages[0] if messages else None
    usage = head.usage if isinstance(head, AIMessage) else None
    # Priced now, from the table this process has: the record keeps the cost (docs/budgets.md).
    cost = step_cost_micro_usd(price_of(d.model_spec(h)), usage) if usage is not None else 0
    return make(
        ev.StepDone, loop_id=h.loop_id, turn_id=t.turn_id, step_id=step_id, messages=messages, cost_micro_usd=cost
    )


async def fail_turn(
    d: Drive, h: LoopHistory, kind: wiretypes.TurnFailedKind, message: str, prefix: AIMessage | None = None
) -> None:
    """``TurnFailed`` (after a step of ``prefix``, what the model sent before failing, if any)."""
    t = h.open_turn
    assert t is not None
    step_id = step_id_for(t.turn_id, t.steps)

    def build(cur: LoopHistory) -> list[Event] | None:
        out: list[Event] = []
        if prefix is not None:
            out.append(step_done(d, cur, t, step_id, [prefix]))
        out.append(
            make(
                ev.TurnFailed,
                loop_id=cur.loop_id,
                turn_id=t.turn_id,
                turn_index=t.turn_index,
                err=ev.TurnError(kind=kind, message=shaping.bounded_diagnostic(message)),
            )
        )
        out.extend(idle_if_nothing_pending(cur))
        return out

    await d.commit(h, build)


async def answer(d: Drive, h: LoopHistory, t: OpenTurn, step_id: str, stored: AIMessage) -> None:
    """Commit the final answer, the turn's end and (no input waiting) ``LoopIdle``: one chained commit.

    Chained, not atomic: on a one-node (R1) file-stored stream the server stages every
    multi-record atomic batch in a store of its own on disk, far costlier in server CPU than plain
    publishes (docs/benchmarks.md). Each prefix of the three is a history the loop goes on from:
    one holding the answer but not yet the end is ended by ``next_action`` (:func:`end_turn`), with
    no further step in the turn, whoever drives the loop next; one ending the turn goes idle or
    starts the next input's turn.
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
        return [step_done(d, cur, t, step_id, [stored]), done, *idle_if_nothing_pending(cur)]

    await d.commit(h, build, chain=True)


async def end_turn(d: Drive, h: LoopHistory) -> None:
    """``TurnDone`` for a turn whose final answer is stored (its message and the turn's usage)."""

    def build(cur: LoopHistory) -> list[Event] | None:
        t = cur.open_turn
        last = cur.messages[-1] if cur.messages else None
        if t is None or not t.answered or not isinstance(last, AIMessage):
            return None
        return [
            make(
                ev.TurnDone,
                loop_id=cur.loop_id,
                turn_id=t.turn_id,
                turn_index=t.turn_index,
                message=clone(last),
                usage=t.usage,
            )
        ]

    await d.commit(h, build)


def commit_tool_step(
    d: Drive,
    h: LoopHistory,
    t: OpenTurn,
    step_id: str,
    stored: AIMessage,
    planned: list[PlannedCall],
    results: list[ToolResultMessage],
) -> Awaitable[None]:
    """A step of tool calls: its recorded decisions, its messages, and the inputs folded into the turn."""
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
        return [*decisions, step_done(d, cur, t, step_id, [stored, *results]), *folds]

    return d.commit(h, build)
