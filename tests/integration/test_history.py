"""shared.history: the fold rules (pure) and replay / follow / load / loops against a real server."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator

import anyio
import msgspec
import pytest
from nats.aio.client import Client as NATS

from shared.client import CommitClient
from shared.content import AIMessage, TextBlock, ToolUseBlock, Usage, ai_text, tool_result, user_text
from shared.events import (
    Cause,
    Event,
    Gate,
    GateOpened,
    GateResolved,
    LoopClosed,
    LoopIdle,
    StepDone,
    TurnDone,
    TurnFoldedInto,
    TurnInterrupted,
    TurnStarted,
    make,
)
from shared.history import LoopHistory, fold
from shared.replay import load, loops, replay
from shared.settings import Settings
from tests.integration.committer_fixtures import (
    input_submitted,
    loop_started,
    new_id,
    running_committer,
    step,
    text_turn,
)

T = 10.0


# --- fold (no server) ---------------------------------------------------------------------------


def tool_step(loop_id: str, turn_id: str, *ids: str, usage: Usage | None = None) -> StepDone:
    ai = AIMessage(
        blocks=[TextBlock(text="calling"), *(ToolUseBlock(id=i, name="calc", input=msgspec.Raw(b"{}")) for i in ids)],
        usage=usage,
    )
    return make(
        StepDone,
        loop_id=loop_id,
        turn_id=turn_id,
        step_id=new_id(),
        messages=[ai, *(tool_result(i, "3") for i in ids)],
    )


def test_fold_mirrors_the_seed_rules() -> None:
    loop_id = new_id()
    start = loop_started(loop_id)
    in1, in2, in3 = (input_submitted(loop_id, t) for t in ("one", "two", "three"))
    assert in1.cause and in2.cause and in3.cause
    t1, t2 = new_id(), new_id()
    gate = Gate(id=new_id(), kind="permission", controls=["approve", "deny"], tool_name="calc")
    s1 = tool_step(loop_id, t1, "a", "b", usage=Usage(input_tokens=10, output_tokens=2))
    s2 = step(loop_id, t1, "final", Usage(input_tokens=20, output_tokens=5))
    evs: list[Event] = [
        start,
        in1,
        in2,
        make(TurnStarted, loop_id=loop_id, turn_id=t1, turn_index=1, message=in1.message, cause=in1.cause),
        s1,
        make(TurnFoldedInto, loop_id=loop_id, turn_id=t1, turn_index=1, message=in2.message, cause=in2.cause),
        make(GateOpened, loop_id=loop_id, turn_id=t1, step_id=s2.step_id, gate=gate),
        in3,
    ]
    h = fold(enumerate(evs, 1))
    assert h.config == start and h.turns == 1 and h.idle is False
    assert h.open_turn is not None and h.open_turn.turn_id == t1 and h.open_turn.started_seq == 4
    assert (h.open_turn.steps, h.open_turn.tool_iterations, h.open_turn.tool_calls) == (1, 1, 2)
    assert [g.gate.id for g in h.open_gates] == [gate.id] and h.resolved_gates == []
    assert [i.message for i in h.pending_inputs] == [in3.message]
    assert h.commands == {
        start.cause.command_id: 1,
        in1.cause.command_id: 2,
        in2.cause.command_id: 3,  # type: ignore[union-attr]
        in3.cause.command_id: 8,
    }
    more: list[Event] = [
        make(GateResolved, loop_id=loop_id, turn_id=t1, step_id=s2.step_id, gate_id=gate.id, action="approve"),
        s2,
        make(
            TurnDone, loop_id=loop_id, turn_id=t1, turn_index=1, message=ai_text("final"), usage=Usage(input_tokens=999)
        ),
        make(LoopIdle, loop_id=loop_id),
    ]
    for seq, e in enumerate(more, len(evs) + 1):
        if isinstance(e, GateResolved):
            h.apply(e, seq)
            assert h.open_gates == [] and [g.gate.id for g in h.resolved_gates] == [gate.id]
        else:
            h.apply(e, seq)
    assert h.open_turn is None and h.idle and h.resolved_gates == []
    # messages: TurnStarted, StepDone(AI + 2 results), TurnFoldedInto, StepDone(AI); the terminal adds nothing
    assert h.messages == [in1.message, *s1.messages, in2.message, *s2.messages]
    # usage from StepDone only: TurnDone's 999 is never added
    assert h.usage == Usage(input_tokens=30, output_tokens=7)
    assert h.step_ids == {s1.step_id, s2.step_id} and h.last_seq == 12 and h.events == 12
    # a second turn, interrupted, then the loop closes
    h.apply(make(TurnStarted, loop_id=loop_id, turn_id=t2, turn_index=2, message=in3.message, cause=in3.cause), 13)
    assert h.pending_inputs == [] and h.turns == 2 and not h.idle
    h.apply(make(TurnInterrupted, loop_id=loop_id, turn_id=t2, turn_index=2, reason="interrupted"), 14)
    h.apply(make(LoopClosed, loop_id=loop_id, cause=Cause(command_id=new_id())), 15)
    assert h.open_turn is None and h.closed and h.closed_seq == 15
    # records at or below last_seq are ignored (re-reading an overlapping tail is harmless)
    h.apply(s1, 5)
    assert h.events == 15 and len(h.messages) == 7


def test_a_stored_final_answer_is_followed_by_the_turn_s_end_and_never_by_another_step() -> None:
    from services.model_step.steps import Action, next_action

    loop_id, t1 = new_id(), new_id()
    in1, in2 = input_submitted(loop_id, "one"), input_submitted(loop_id, "two")
    evs: list[Event] = [
        loop_started(loop_id),
        in1,
        make(TurnStarted, loop_id=loop_id, turn_id=t1, turn_index=1, message=in1.message, cause=in1.cause),
        tool_step(loop_id, t1, "a"),
    ]
    h = fold(enumerate(evs, 1))
    assert h.open_turn is not None and not h.open_turn.answered
    assert next_action(h).action is Action.RUN_STEP
    # The answer is committed on its own (a driver may stop right here): the turn is answered, and
    # its end comes next, even before an input that arrived meanwhile starts a turn.
    h.apply(step(loop_id, t1, "final", Usage(input_tokens=3)), 5)
    h.apply(in2, 6)
    assert h.open_turn is not None and h.open_turn.answered and h.open_turn.steps == 2
    assert next_action(h).action is Action.FINISH_TURN
    h.apply(make(TurnDone, loop_id=loop_id, turn_id=t1, turn_index=1, message=ai_text("final")), 7)
    assert h.open_turn is None and next_action(h).action is Action.START_TURN
    # A tool step's StepDone (an assistant message and its results) never answers the turn.
    t2 = new_id()
    h.apply(make(TurnStarted, loop_id=loop_id, turn_id=t2, turn_index=2, message=in2.message, cause=in2.cause), 8)
    h.apply(tool_step(loop_id, t2, "b"), 9)
    assert h.open_turn is not None and not h.open_turn.answered
    assert next_action(h).action is Action.RUN_STEP


def test_fold_owns_its_data_and_copy_is_deep() -> None:
    loop_id = new_id()
    t = new_id()
    s = step(loop_id, t, "original")
    h = fold(
        [
            (1, loop_started(loop_id)),
            (2, make(TurnStarted, loop_id=loop_id, turn_id=t, turn_index=1, message=user_text("q"))),
            (3, s),
        ]
    )
    block = s.messages[0].blocks[0]  # type: ignore[union-attr,index]
    assert isinstance(block, TextBlock)
    block.text = "mutated by the caller"
    assert h.messages[-1] == ai_text("original")
    c = h.copy()
    assert c == h
    c.messages[-1].blocks[0].text = "changed copy"  # type: ignore[union-attr,index]
    c.apply(step(loop_id, t), 4)
    assert h.messages[-1] == ai_text("original") and h.last_seq == 3 and c.last_seq == 4


# --- replay against a server ----------------------------------------------------------------------


@pytest.fixture
async def committer(settings: Settings) -> AsyncIterator[Settings]:
    async with running_committer(settings):
        yield settings


async def collect(nc: NATS, settings: Settings, loop_id: str, **kw: object) -> list[tuple[int, Event]]:
    return [item async for item in replay(nc, loop_id, settings=settings, **kw)]  # type: ignore[arg-type]


@pytest.mark.anyio
async def test_replay_of_a_long_interleaved_loop(committer: Settings, nc: NATS) -> None:
    client = CommitClient(nc, committer.names, 30)
    main, others = new_id(), [new_id(), new_id()]
    last = {lid: (await client.commit(lid, 0, [loop_started(lid)])).last_seq for lid in [main, *others]}
    expected_ids = []
    turn = new_id()
    for _ in range(50):
        batch = [step(main, turn, f"record {len(expected_ids) + k}") for k in range(100)]
        expected_ids.extend(e.event_id for e in batch)
        last[main] = (await client.commit(main, last[main], batch)).last_seq
        for o in others:
            last[o] = (await client.commit(o, last[o], [step(o, turn), step(o, turn)])).last_seq
    t0 = time.perf_counter()
    got = await collect(nc, committer, main)
    elapsed = time.perf_counter() - t0
    assert len(got) == 5001
    assert [e.event_id for _, e in got[1:]] == expected_ids
    seqs = [s for s, _ in got]
    assert seqs == sorted(seqs) and seqs[-1] == last[main]
    assert all(e.loop_id == main for _, e in got)
    assert elapsed < 5.0, f"replay of 5,001 records took {elapsed:.2f}s"
    # from inside, and a fold of it equals the fold of everything
    tail = await collect(nc, committer, main, from_seq=seqs[4000])
    assert [s for s, _ in tail] == seqs[4000:]
    cached = fold(got[:4000])
    assert await load(nc, committer.names, main, cached) is cached
    assert cached == fold(got) and cached.last_seq == last[main]
    assert sorted(await loops(nc, committer.names)) == sorted([main, *others])


@pytest.mark.anyio
async def test_follow_sees_later_records_without_gap_or_duplicate(committer: Settings, nc: NATS) -> None:
    client = CommitClient(nc, committer.names, T)
    loop_id = new_id()
    last = (await client.commit(loop_id, 0, [loop_started(loop_id)])).last_seq
    for k in range(1, 4):
        last = (await client.commit(loop_id, last, text_turn(loop_id, k))).last_seq
    seen: list[tuple[int, Event]] = []
    want = 1 + 3 * 3 + 40
    async with (
        contextlib.aclosing(replay(nc, loop_id, settings=committer, follow=True)) as it,
        anyio.create_task_group() as tg,
    ):

        async def writer() -> None:
            nonlocal last
            # Append while the reader is catching up and after it went live.
            for k in range(40):
                last = (await client.commit(loop_id, last, [step(loop_id, new_id(), f"live {k}")])).last_seq
                if k % 10 == 0:
                    await anyio.sleep(0.02)

        tg.start_soon(writer)
        with anyio.fail_after(20):
            async for item in it:
                seen.append(item)
                if len(seen) == want:
                    break
    seqs = [s for s, _ in seen]
    assert len(set(seqs)) == want and seqs == sorted(seqs) and seqs[-1] == last
    assert [e.event_id for _, e in seen] == [e.event_id for _, e in await collect(nc, committer, loop_id)]


@pytest.mark.anyio
async def test_follow_from_an_empty_loop(committer: Settings, nc: NATS) -> None:
    loop_id = new_id()
    client = CommitClient(nc, committer.names, T)
    async with contextlib.aclosing(replay(nc, loop_id, settings=committer, follow=True)) as it:
        res = await client.commit(loop_id, 0, [loop_started(loop_id)])
        with anyio.fail_after(10):
            seq, event = await it.__anext__()
    assert seq == res.last_seq and event.loop_id == loop_id


@pytest.mark.anyio
async def test_history_of_unknown_loops_is_empty(committer: Settings, nc: NATS) -> None:
    assert await collect(nc, committer, new_id()) == []
    lid = new_id()
    h = await load(nc, committer.names, lid)
    assert h == LoopHistory(loop_id=lid) and h.last_seq == 0 and h.config is None
    with pytest.raises(ValueError):
        await collect(nc, committer, "not-a-loop")
