"""Model-step acceptance: committer, tool workers and model-step as separate OS processes."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import anyio
import pytest
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from shared import events as ev
from shared.client import LoopClient
from shared.codec import decode_event, decode_live_frame
from shared.content import AIMessage, ToolResultMessage, ToolUseBlock, text_of, tool_uses
from shared.protocol import ClosedError, NotFoundError
from shared.settings import Settings
from shared.shaping import INVALID_JSON_ARGUMENTS, TRUNCATED_NOTICE
from shared.streamreads import get_msg
from tests.syshelpers import (
    TOOL_TURN_HISTORY,
    check_history_invariants,
    collect_live,
    history,
    system,
    types,
    wait_history,
    write_script,
)

pytestmark = [pytest.mark.anyio, pytest.mark.system]


def _tool_step(k: int, name: str, args: str) -> list[dict[str, object]]:
    return [
        {"kind": "tool_use", "index": 0, "id": f"call_{k}_{{k}}", "name": name},
        {"kind": "tool_use", "index": 0, "text": args},
        {"kind": "finish", "finish_reason": "tool_use"},
    ]


async def test_demo_loop_commits_the_expected_history_and_live_events(settings: Settings, nc: NATS) -> None:
    with system(settings):
        lc = LoopClient(nc, settings.names)
        loop_id = str(uuid.uuid4())
        live = await collect_live(nc, settings, loop_id)
        await lc.start(loop_id, model="demo")
        await lc.input(loop_id, "what is 17*23 and what time is it in Tokyo?")
        await wait_history(nc, settings, loop_id, lambda h: h.idle)
        events = await history(nc, settings, loop_id)
        check_history_invariants(events)
        assert types(events) == TOOL_TURN_HISTORY
        first, second = (e for _, e in events if isinstance(e, ev.StepDone))
        ai = first.messages[0]
        assert isinstance(ai, AIMessage)
        assert [b.name for b in tool_uses(ai)] == ["calculator", "clock"]
        results = first.messages[1:]
        assert len(results) == 2 and all(isinstance(r, ToolResultMessage) and not r.is_error for r in results)
        assert "391" in text_of(results[0])
        assert "Asia/Tokyo" in text_of(results[1])
        assert len(second.messages) == 1 and "391" in text_of(second.messages[0])
        await anyio.sleep(0.2)  # live events are best effort; give the last ones a moment
        names = [type(e).__name__ for e in live]
        assert "TokenDelta" in names
        started = [i for i, n in enumerate(names) if n == "ToolCallStarted"]
        completed = [i for i, n in enumerate(names) if n == "ToolCallCompleted"]
        assert len(started) == 2 and len(completed) == 2
        assert max(started) < min(completed)


async def test_live_frames_arrive_before_their_step_and_a_slow_tool_s_start_while_it_runs(
    settings: Settings, nc: NATS, tmp_path: Path
) -> None:
    # Step 1 calls a quick tool, step 2 one that runs for 1.5 s, then the final answer.
    model = write_script(
        tmp_path,
        [
            [{"kind": "text", "index": 0, "text": "Computing."}, *_tool_step(1, "calculator", '{"expression": "6*7"}')],
            [{"kind": "text", "index": 0, "text": "Waiting."}, *_tool_step(2, "sleep", '{"seconds": 1.5}')],
            [{"kind": "text", "index": 0, "text": "Done: 42."}, {"kind": "finish", "finish_reason": "end_turn"}],
        ],
    )
    with system(settings, tools=("calculator", "sleep")):
        loop_id = str(uuid.uuid4())
        frames: list[tuple[float, bytes]] = []
        committed: dict[str, float] = {}  # step id → when its StepDone reached a core subscriber
        live_subject, hist_subject = settings.names.live(loop_id), settings.names.hist(loop_id)

        # One subscription for both subjects: nats-py runs each subscription's callbacks in a task
        # of its own, so only one subscription sees messages in the order the server sent them.
        async def on_msg(msg: Msg) -> None:
            if msg.subject == live_subject:
                frames.append((time.monotonic(), msg.data))
            elif msg.subject == hist_subject:
                e = decode_event(msg.data)
                if isinstance(e, ev.StepDone):
                    committed.setdefault(e.step_id, time.monotonic())

        await nc.subscribe(settings.names.of_loop(loop_id), cb=on_msg)
        lc = LoopClient(nc, settings.names)
        await lc.start(loop_id, model=model)
        await lc.input(loop_id, "compute, then wait")
        await wait_history(nc, settings, loop_id, lambda h: h.idle)
        await anyio.sleep(0.2)

    seen: list[tuple[float, ev.Event]] = []
    for t, data in frames:
        events = decode_live_frame(data)
        assert events, "a live frame holds at least one event"
        assert all(e.loop_id == loop_id for e in events)
        seen.extend((t, e) for e in events)
    assert len(committed) == 3
    # Every live event of a step reached us before the step's record did.
    for t, e in seen:
        assert t <= committed[e.step_id], f"{type(e).__name__} of a step arrived after the step was committed"
    # The slow call's start was seen while it ran, not held back until it ended.
    started = next(t for t, e in seen if isinstance(e, ev.ToolCallStarted) and e.tool_name == "sleep")
    done = next(t for t, e in seen if isinstance(e, ev.ToolCallCompleted) and e.tool_use_id.startswith("call_2_"))
    assert done - started > 1.0
    # Every chunk's text arrived, in order.
    text = "".join(e.chunk.text for _, e in seen if isinstance(e, ev.TokenDelta) and e.chunk.kind == "text")
    assert text == "Computing.Waiting.Done: 42."
    # The quick step's events travelled together: far fewer messages than events.
    quick = [data for _, data in frames if b"call_1_" in data or b"Computing." in data]
    assert len(quick) <= 2, f"{len(quick)} frames for one quick step"


async def test_malformed_tool_json_is_stored_as_empty_object_and_the_turn_recovers(
    settings: Settings, nc: NATS, tmp_path: Path
) -> None:
    model = write_script(
        tmp_path,
        [
            [
                {"kind": "text", "text": "Let me compute that."},
                {"kind": "tool_use", "index": 0, "id": "call_bad", "name": "calculator"},
                {"kind": "tool_use", "index": 0, "text": "{not valid"},
                {"kind": "tool_use", "index": 0, "text": " json"},
                {"kind": "finish", "finish_reason": "tool_use"},
            ],
            "Sorry, my arguments were broken. 17*23 is 391.",
        ],
    )
    with system(settings, tools=("calculator",)):
        lc = LoopClient(nc, settings.names)
        loop_id = str(uuid.uuid4())
        live = await collect_live(nc, settings, loop_id)
        await lc.start(loop_id, model=model)
        await lc.input(loop_id, "compute")
        await wait_history(nc, settings, loop_id, lambda h: h.idle)
        events = await history(nc, settings, loop_id)
        check_history_invariants(events)
        assert types(events) == TOOL_TURN_HISTORY
        step = next(e for _, e in events if isinstance(e, ev.StepDone))
        ai, result = step.messages
        assert isinstance(ai, AIMessage) and isinstance(result, ToolResultMessage)
        (use,) = tool_uses(ai)
        assert isinstance(use, ToolUseBlock) and bytes(use.input) == b"{}"
        assert result.is_error and text_of(result) == INVALID_JSON_ARGUMENTS
        await anyio.sleep(0.2)
        started = [e for e in live if isinstance(e, ev.ToolCallStarted)]
        completed = [e for e in live if isinstance(e, ev.ToolCallCompleted)]
        assert len(started) == 1 and len(completed) == 1 and completed[0].is_error


async def test_limits_empty_response_and_truncated_stream(settings: Settings, nc: NATS, tmp_path: Path) -> None:
    always_tools = write_script(
        tmp_path,
        {"responses": [_tool_step(0, "calculator", '{"expression": "1+1"}')], "repeat_last": True},
        "always.json",
    )
    two_calls = write_script(
        tmp_path,
        [
            [
                {"kind": "tool_use", "index": 0, "id": "a", "name": "calculator"},
                {"kind": "tool_use", "index": 0, "text": '{"expression": "1"}'},
                {"kind": "tool_use", "index": 1, "id": "b", "name": "calculator"},
                {"kind": "tool_use", "index": 1, "text": '{"expression": "2"}'},
            ]
        ],
        "two.json",
    )
    empty = write_script(tmp_path, [[{"kind": "finish", "finish_reason": "end_turn"}]], "empty.json")
    truncated = write_script(
        tmp_path,
        [
            [
                {"kind": "text", "text": "Here is the beginning of an ans"},
                {"kind": "tool_use", "index": 0, "id": "c", "name": "calculator"},
                {"kind": "tool_use", "index": 0, "text": '{"expr'},
                {"error": "connection reset"},
            ]
        ],
        "truncated.json",
    )
    with system(settings, tools=("calculator",)):
        lc = LoopClient(nc, settings.names)
        loops = {k: str(uuid.uuid4()) for k in ("iterations", "calls", "empty", "truncated")}
        await lc.start(loops["iterations"], model=always_tools, limits=ev.Limits(max_iterations=3))
        await lc.start(loops["calls"], model=two_calls, limits=ev.Limits(max_calls_per_turn=1))
        await lc.start(loops["empty"], model=empty)
        await lc.start(loops["truncated"], model=truncated)
        for loop_id in loops.values():
            await lc.input(loop_id, "go")
        for loop_id in loops.values():
            await wait_history(nc, settings, loop_id, lambda h: h.idle)

        it = await history(nc, settings, loops["iterations"])
        check_history_invariants(it)
        assert types(it).count("StepDone") == 3
        failed = [e for _, e in it if isinstance(e, ev.TurnFailed)]
        assert len(failed) == 1 and failed[0].err.kind == "tool_limit"

        calls = await history(nc, settings, loops["calls"])
        assert "StepDone" not in types(calls)
        assert [e.err.kind for _, e in calls if isinstance(e, ev.TurnFailed)] == ["tool_limit"]

        em = await history(nc, settings, loops["empty"])
        assert "StepDone" not in types(em)
        assert [e.err.kind for _, e in em if isinstance(e, ev.TurnFailed)] == ["empty_response"]

        tr = await history(nc, settings, loops["truncated"])
        check_history_invariants(tr)
        (step,) = [e for _, e in tr if isinstance(e, ev.StepDone)]
        (ai,) = step.messages
        assert isinstance(ai, AIMessage) and not tool_uses(ai)
        assert text_of(ai).startswith("Here is the beginning of an ans") and text_of(ai).endswith(TRUNCATED_NOTICE)
        assert [e.err.kind for _, e in tr if isinstance(e, ev.TurnFailed)] == ["model_error"]


async def test_gate_round_trip_survives_a_model_step_restart(settings: Settings, nc: NATS, tmp_path: Path) -> None:
    # Three calculator steps, then an answer: approve, approve-always (covers the third), deny on a fresh loop.
    script = {
        "responses": [
            _tool_step(0, "calculator", '{"expression": "2*3"}'),
            _tool_step(1, "calculator", '{"expression": "4*5"}'),
            _tool_step(2, "calculator", '{"expression": "6*7"}'),
            "done",
        ]
    }
    model = write_script(tmp_path, script)
    with system(settings, tools=("calculator",)) as sysm:
        lc = LoopClient(nc, settings.names)
        loop_id = str(uuid.uuid4())
        await lc.start(loop_id, model=model, policy={"calculator": "ask"})
        await lc.input(loop_id, "go")
        h = await wait_history(nc, settings, loop_id, lambda h: bool(h.open_gates))
        (gate,) = h.open_gates

        # Restart the model-step while the gate is open: the answer is applied by the new replica.
        (ms,) = sysm.sup.by_name("model-step")
        ms.kill()
        sysm.replace(ms)

        await lc.answer(loop_id, gate.gate.id, "approve")
        with pytest.raises(ClosedError):
            await lc.answer(loop_id, gate.gate.id, "approve")
        with pytest.raises(NotFoundError):
            await lc.answer(loop_id, str(uuid.uuid4()), "approve")

        h = await wait_history(nc, settings, loop_id, lambda h: bool(h.open_gates) or h.idle)
        (gate2,) = h.open_gates
        assert gate2.gate.id != gate.gate.id
        await lc.answer(loop_id, gate2.gate.id, "approve_always")
        h = await wait_history(nc, settings, loop_id, lambda h: h.idle, timeout=20)
        events = await history(nc, settings, loop_id)
        check_history_invariants(events)
        steps = [e for _, e in events if isinstance(e, ev.StepDone)]
        assert len(steps) == 4  # three tool steps + the answer; each applied exactly once
        assert [text_of(s.messages[1]) for s in steps[:3]] == ["6", "20", "42"]
        assert types(events).count("GateOpened") == 2  # the third call was covered by approve-always
        always = [e for _, e in events if isinstance(e, ev.PermissionDecided)]
        assert [(d.effect, d.reason) for d in always] == [("approve", "always_allowed")]
        with pytest.raises(ClosedError):
            await lc.answer(loop_id, gate2.gate.id, "deny")

        # deny: the call never runs; the model sees the denial.
        deny_loop = str(uuid.uuid4())
        await lc.start(deny_loop, model=model, policy={"calculator": "ask"})
        await lc.input(deny_loop, "go")
        h = await wait_history(nc, settings, deny_loop, lambda h: bool(h.open_gates))
        await lc.answer(deny_loop, h.open_gates[0].gate.id, "deny", reason="not today")
        await wait_history(nc, settings, deny_loop, lambda h: len(h.step_ids) >= 1)
        events = await history(nc, settings, deny_loop)
        first = next(e for _, e in events if isinstance(e, ev.StepDone))
        result = first.messages[1]
        assert isinstance(result, ToolResultMessage) and result.is_error
        assert text_of(result).startswith("error: permission denied") and "not today" in text_of(result)


async def test_interrupt_during_a_long_tool_call(settings: Settings, nc: NATS, tmp_path: Path) -> None:
    model = write_script(tmp_path, [_tool_step(0, "sleep", '{"seconds": 30}'), "slept"])
    with system(settings, tools=("sleep",)):
        lc = LoopClient(nc, settings.names)
        loop_id = str(uuid.uuid4())
        live = await collect_live(nc, settings, loop_id)
        cancels: list[str] = []

        async def on_cancel(m: Msg) -> None:
            cancels.append(m.subject)

        await nc.subscribe(settings.names.toolctl("*"), cb=on_cancel)
        await lc.start(loop_id, model=model)
        await lc.input(loop_id, "sleep please")
        with anyio.fail_after(15):
            while not any(isinstance(e, ev.ToolCallStarted) for e in live):
                await anyio.sleep(0.02)
        await anyio.sleep(0.3)
        t0 = time.monotonic()
        await lc.interrupt(loop_id)
        h = await wait_history(nc, settings, loop_id, lambda h: h.open_turn is None, timeout=5)
        assert time.monotonic() - t0 < 1.0
        events = await history(nc, settings, loop_id)
        assert "TurnInterrupted" in types(events) and "StepDone" not in types(events)
        started = next(e for e in live if isinstance(e, ev.ToolCallStarted))
        with anyio.fail_after(2):
            while settings.names.toolctl(started.tool_execution_id) not in cancels:
                await anyio.sleep(0.02)
        # The loop stays usable: a queued input after the interrupt starts a new turn.
        assert h.closed is False


async def test_sigkill_model_step_replicas_at_random_points(settings: Settings, nc: NATS, tmp_path: Path) -> None:
    """30 loops × 10 steps, 2 replicas; one replica is SIGKILLed (and replaced) every ~0.4 s."""
    import random

    rng = random.Random(5)
    steps = 10
    # each model call takes ~0.1 s, so kills land mid-stream, mid-batch and between commit and ack
    script = [[{"sleep": 0.1}, *_tool_step(k, "calculator", f'{{"expression": "{k}+1"}}')] for k in range(steps - 1)]
    script.append([{"sleep": 0.1}, {"kind": "text", "text": "finished"}])
    model = write_script(tmp_path, script)
    n_loops = 30
    with system(settings, model_steps=2, tools=("calculator",)) as sysm:
        lc = LoopClient(nc, settings.names)
        loop_ids = [str(uuid.uuid4()) for _ in range(n_loops)]
        for loop_id in loop_ids:
            await lc.start(loop_id, model=model)
            await lc.input(loop_id, "count")
        kills = 0
        deadline = time.monotonic() + 90
        done: set[str] = set()

        async def kill_while_running() -> None:
            # On its own clock: checking 30 histories takes a while on a loaded machine.
            nonlocal kills
            while kills < 6 and len(done) < n_loops:
                await anyio.sleep(rng.uniform(0.2, 0.5))
                victim = rng.choice(sysm.sup.by_name("model-step"))
                victim.kill()
                kills += 1
                sysm.replace(victim)  # (in the main thread: the child dies with its parent thread)

        async with anyio.create_task_group() as tg:
            tg.start_soon(kill_while_running)
            while len(done) < n_loops and time.monotonic() < deadline:
                await anyio.sleep(0.2)
                for loop_id in loop_ids:
                    if loop_id not in done:
                        h = await wait_history(nc, settings, loop_id, lambda h: True)
                        if h.idle:
                            done.add(loop_id)
        assert kills >= 3
        if len(done) < n_loops:
            js = nc.jetstream()
            info = await js.consumer_info(settings.names.work_stream, settings.names.work_consumer)
            sinfo = await js.stream_info(settings.names.work_stream, subjects_filter=">")
            for loop_id in set(loop_ids) - done:
                print("STUCK", loop_id, types(await history(nc, settings, loop_id)))
            print("CONSUMER", info)
            print("WORK STREAM", sinfo.state)
            print(sysm.logs())
        assert len(done) == n_loops, f"{n_loops - len(done)} loops did not finish"
        for loop_id in loop_ids:
            events = await history(nc, settings, loop_id)
            check_history_invariants(events)
            step_events = [e for _, e in events if isinstance(e, ev.StepDone)]
            assert len(step_events) == steps, f"{loop_id}: {len(step_events)} steps"
            # every tool step answered exactly its own call, in order: no step missing or doubled
            for k, s in enumerate(step_events[:-1]):
                assert text_of(s.messages[1]) == str(k + 1)
            assert types(events)[-2:] == ["TurnDone", "LoopIdle"]


async def test_a_signal_that_came_during_a_drive_is_removed_after_it_not_driven_again(
    settings: Settings, nc: NATS, tmp_path: Path
) -> None:
    # The first answer takes 1.5 s; the second input arrives meanwhile, so its work signal reaches
    # the replica while it drives the loop and is nak'd. The drive handles that input itself, then
    # deletes the signal: it is never delivered again for a drive that would find nothing to do.
    model = write_script(tmp_path, {"responses": [[{"sleep": 1.5}, {"kind": "text", "text": "one"}], "two"]})
    names = settings.names
    with system(settings, tools=("calculator",)):
        deliveries: dict[int, list[bytes]] = {}  # signal stream sequence -> the replica's acks of it

        async def on_ack(m: Msg) -> None:
            tokens = m.subject.split(".")  # $JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>
            deliveries.setdefault(int(tokens[5]), []).append(bytes(m.data[:4]))

        await nc.subscribe(f"$JS.ACK.{names.work_stream}.>", cb=on_ack)
        lc = LoopClient(nc, names)
        loop_id = str(uuid.uuid4())
        await lc.start(loop_id, model=model)
        await lc.input(loop_id, "first")
        await wait_history(nc, settings, loop_id, lambda h: h.open_turn is not None, timeout=10)
        await anyio.sleep(0.3)
        await lc.input(loop_id, "second")
        h = await wait_history(nc, settings, loop_id, lambda h: h.idle and not h.pending_inputs, timeout=15)
        assert h.turns >= 1 and "two" in [text_of(m) for m in h.messages if isinstance(m, AIMessage)]
        await anyio.sleep(2.5)  # past the nak's delay: a signal left in place would be delivered again

        # The loop's last signal is the second input's: it reached the replica during the drive that
        # took that input in, and only ever got naks — removed after the drive, never delivered again
        # for a drive that finds nothing to do (which would end in an ack).
        last = max(deliveries)
        assert deliveries[last] and set(deliveries[last]) == {b"-NAK"}, deliveries
        assert any(b"" in acks for acks in deliveries.values()), deliveries  # the drive that ran the turns
        assert await get_msg(nc, names.work_stream, last_by_subj=names.work(loop_id)) is None


async def test_a_turn_whose_answer_is_stored_without_its_end_is_ended_once_by_the_next_driver(
    settings: Settings, nc: NATS, tmp_path: Path
) -> None:
    """A final answer and its TurnDone are separate commits: a model-step that stopped between them
    leaves an answered turn, and whichever model-step drives the loop next ends it without asking the
    model again (the script would answer a second time)."""
    from shared.client import CommitClient
    from shared.content import Usage, ai_text
    from shared.events import make, new_id
    from shared.replay import load

    model = write_script(tmp_path, {"responses": ["a second answer"], "repeat_last": True})
    with system(settings, model_steps=0, tools=()) as s:
        lc = LoopClient(nc, settings.names)
        loop_id = str(uuid.uuid4())
        await lc.start(loop_id, model=model)
        await lc.input(loop_id, "hello")
        # What a model-step leaves when it stops right after committing the answer.
        h = await load(nc, settings.names, loop_id)
        inp = h.pending_inputs[0]
        assert inp.cause is not None
        turn_id = new_id()
        started = make(
            ev.TurnStarted,
            loop_id=loop_id,
            turn_id=turn_id,
            turn_index=1,
            message=inp.message,
            cause=ev.Cause(command_id=inp.cause.command_id, event_id=inp.event_id),
        )
        answer = make(
            ev.StepDone,
            loop_id=loop_id,
            turn_id=turn_id,
            step_id=ev.step_id_for(turn_id, 0),
            messages=[ai_text("the first answer", Usage(input_tokens=7, output_tokens=3))],
        )
        await CommitClient(nc, settings.names).commit(loop_id, h.last_seq, [started, answer])
        s.model_step()
        await wait_history(nc, settings, loop_id, lambda h: h.idle)
        events = await history(nc, settings, loop_id)
    check_history_invariants(events)
    assert types(events) == ["LoopStarted", "InputSubmitted", "TurnStarted", "StepDone", "TurnDone", "LoopIdle"]
    done = events[4][1]
    assert isinstance(done, ev.TurnDone) and done.turn_id == turn_id and done.message is not None
    assert text_of(done.message) == "the first answer"
    assert done.usage is not None and (done.usage.input_tokens, done.usage.output_tokens) == (7, 3)
