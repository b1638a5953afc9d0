"""Following one turn: which turn took an input, how it ended, and the assistant's answer.

What a program that sends an input and waits for the reply needs (the CLI's ``send --wait``, the
embedded demo, :func:`wait_for_turn` in the public API), read from the committed history only.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, Callable, Iterable
from dataclasses import dataclass
from typing import Literal, cast

from nats.aio.client import Client as NATS

from shared.content import AIMessage, text_of
from shared.errors import LoopwireError
from shared.events import (
    Event,
    LoopClosed,
    StepDone,
    TurnDone,
    TurnFoldedInto,
    TurnStarted,
    ends_turn,
)
from shared.history import TURN_ENDINGS, TurnEnding
from shared.replay import replay
from shared.subjects import Names

# How a turn ended: its terminal record (``shared.history.TURN_ENDINGS``), or the loop was closed.
TurnEnd = Literal[TurnEnding, "closed"]


@dataclass
class TurnOutcome:
    loop_id: str
    turn_id: str
    outcome: TurnEnd
    answer: str
    event: Event | None
    seq: int


def answer_text(events: Iterable[Event]) -> str:
    """The assistant's final text: TurnDone's message, else the last StepDone's AIMessage."""
    text = ""
    for e in events:
        if isinstance(e, TurnDone) and e.message is not None:
            text = text_of(e.message)
        elif isinstance(e, StepDone) and e.messages and isinstance(e.messages[0], AIMessage):
            text = text_of(e.messages[0]) or text
    return text


class TurnTracker:
    """Finds the turn that consumed an input command and tells when it ends (feed it committed events)."""

    def __init__(self, loop_id: str, command_id: str) -> None:
        self.loop_id = loop_id
        self.command_id = command_id
        self.turn_id = ""
        self.seen: list[Event] = []
        self.result: TurnOutcome | None = None

    def feed(self, e: Event, seq: int) -> TurnOutcome | None:
        cmd = e.cause.command_id if e.cause is not None else ""
        if not self.turn_id and isinstance(e, TurnStarted | TurnFoldedInto) and cmd == self.command_id:
            self.turn_id = e.turn_id
        if self.turn_id and e.turn_id == self.turn_id:
            self.seen.append(e)
            if ends_turn(e):
                self.result = TurnOutcome(
                    self.loop_id, self.turn_id, TURN_ENDINGS[type(e)], answer_text(self.seen), e, seq
                )
        elif isinstance(e, LoopClosed):
            self.result = TurnOutcome(self.loop_id, self.turn_id, "closed", answer_text(self.seen), e, seq)
        return self.result


def follow(
    nc: NATS, names: Names, loop_id: str, from_seq: int
) -> contextlib.aclosing[AsyncGenerator[tuple[int, Event], None]]:
    """``replay(..., follow=True)`` closed for sure when the ``async with`` ends."""
    gen = cast(
        "AsyncGenerator[tuple[int, Event], None]", replay(nc, loop_id, names=names, from_seq=from_seq, follow=True)
    )
    return contextlib.aclosing(gen)


async def wait_for_turn(
    nc: NATS,
    names: Names,
    loop_id: str,
    command_id: str,
    from_seq: int,
    *,
    on_event: Callable[[Event, int], None] | None = None,
) -> TurnOutcome:
    """Follow the history from ``from_seq`` until the turn that consumed ``command_id``'s input ends."""
    tracker = TurnTracker(loop_id, command_id)
    async with follow(nc, names, loop_id, from_seq) as records:
        async for seq, e in records:
            if on_event is not None:
                on_event(e, seq)
            result = tracker.feed(e, seq)
            if result is not None:
                return result
    raise LoopwireError("the history ended unexpectedly")  # pragma: no cover - follow never ends by itself
