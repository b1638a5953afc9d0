"""Helpers for the committer / history tests: run a committer in-process, build events, read a loop."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
from nats.aio.client import Client as NATS

from services.committer import CommitterService
from shared.content import Usage, ai_text, user_text
from shared.events import Cause, Event, InputSubmitted, LoopStarted, StepDone, TurnDone, TurnStarted, make
from shared.settings import Settings
from shared.streamreads import StoredMsg, direct_get_batch
from shared.subjects import H_BATCH_SEQ, H_EXPECTED_LAST_SUBJECT_SEQ


@asynccontextmanager
async def running_committer(settings: Settings) -> AsyncIterator[None]:
    """A committer serving ``settings`` in this process until the block exits (graceful stop)."""
    async with anyio.create_task_group() as tg:
        with anyio.fail_after(30):
            await tg.start(CommitterService(settings).run)
        try:
            yield
        finally:
            tg.cancel_scope.cancel()  # it drains


def new_id() -> str:
    return str(uuid.uuid4())


def loop_started(loop_id: str) -> LoopStarted:
    return make(LoopStarted, loop_id=loop_id, model="demo", cause=Cause(command_id=new_id()))


def input_submitted(loop_id: str, text: str = "hi") -> InputSubmitted:
    return make(InputSubmitted, loop_id=loop_id, message=user_text(text), cause=Cause(command_id=new_id()))


def step(loop_id: str, turn_id: str, text: str = "ok", usage: Usage | None = None) -> StepDone:
    return make(StepDone, loop_id=loop_id, turn_id=turn_id, step_id=new_id(), messages=[ai_text(text, usage)])


def text_turn(loop_id: str, index: int = 1, text: str = "hi", command_id: str = "") -> list[Event]:
    """TurnStarted + StepDone + TurnDone: one complete text-only turn."""
    t = new_id()
    cause = Cause(command_id=command_id) if command_id else None
    return [
        make(TurnStarted, loop_id=loop_id, turn_id=t, turn_index=index, message=user_text(text), cause=cause),
        step(loop_id, t, f"answer to {text}"),
        make(TurnDone, loop_id=loop_id, turn_id=t, turn_index=index),
    ]


async def raw_records(nc: NATS, settings: Settings, loop_id: str) -> list[StoredMsg]:
    """Every message stored for ``loop_id``, straight from the stream."""
    out: list[StoredMsg] = []
    start = 1
    while True:
        b = await direct_get_batch(nc, settings.names.history_stream, settings.names.hist(loop_id), start_seq=start)
        out.extend(b.messages)
        if not b.messages or b.num_pending == 0:
            return out
        start = b.messages[-1].seq + 1


async def stored(nc: NATS, settings: Settings, loop_id: str) -> list[tuple[int, bytes, str]]:
    """(seq, payload, msg-id) of every record stored for ``loop_id``."""
    return [(m.seq, m.data, m.msg_id) for m in await raw_records(nc, settings, loop_id)]


async def predecessors_chain(nc: NATS, settings: Settings, loop_id: str) -> bool:
    """True when every record (or batch) was appended expecting exactly the loop's previous record."""
    prev = 0
    for m in await raw_records(nc, settings, loop_id):
        expected = m.headers.get(H_EXPECTED_LAST_SUBJECT_SEQ)
        in_batch = m.headers.get(H_BATCH_SEQ, "1") != "1"
        if not in_batch and expected != str(prev):
            return False
        if in_batch and expected is not None:
            return False
        prev = m.seq
    return True
