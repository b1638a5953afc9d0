"""The loop API (start, input, interrupt, answer, close) against in-process committers (R1)."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator

import anyio
import msgspec
import pytest
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from services.committer.api import LoopApi
from services.committer.appender import Appender
from shared.client import CommitClient, LoopClient
from shared.content import user_text
from shared.events import (
    Cause,
    Gate,
    GateOpened,
    GateResolved,
    InputSubmitted,
    Limits,
    LoopClosed,
    LoopStarted,
    RetryPolicy,
    TurnInterrupted,
    TurnStarted,
    make,
)
from shared.history import LoopHistory
from shared.protocol import (
    ApiReply,
    ClosedError,
    ConflictError,
    InputRequest,
    InvalidRequestError,
    NotFoundError,
    StartRequest,
    UnavailableError,
    encode,
)
from shared.replay import load, replay
from shared.settings import Settings
from shared.streams import ensure_all, ensure_work_stream
from shared.subjects import Verb, js_api
from tests.integration.committer_fixtures import new_id, running_committer

pytestmark = pytest.mark.anyio
T = 10.0


@pytest.fixture
async def committer(settings: Settings) -> AsyncIterator[Settings]:
    async with running_committer(settings):
        yield settings


@pytest.fixture
def api(nc: NATS, settings: Settings) -> LoopClient:
    return LoopClient(nc, settings.names, T)


async def history(nc: NATS, settings: Settings, loop_id: str) -> LoopHistory:
    return await load(nc, settings.names, loop_id)


async def events(nc: NATS, settings: Settings, loop_id: str) -> list[object]:
    return [e async for _, e in replay(nc, loop_id, settings=settings)]


async def work_pending(nc: NATS, settings: Settings, loop_id: str) -> int:
    info = await nc.jetstream().stream_info(settings.names.work_stream, subjects_filter=settings.names.work(loop_id))
    return int((info.state.subjects or {}).get(settings.names.work(loop_id), 0))


async def test_a_command_whose_work_cannot_be_queued_is_not_acknowledged_and_its_work_is_queued_later(
    nc: NATS, settings: Settings
) -> None:
    """Stored records without a work item would wait for the loop's next command: the command is
    answered ``unavailable`` (a repeat stores nothing again) and the committer queues the work itself
    once the work stream is back."""
    s = dataclasses.replace(settings, commit_retry_seconds=0.5)
    api = LoopClient(nc, s.names, T)
    async with running_committer(s):
        res = await api.start()
        await nc.jetstream().delete_stream(s.names.work_stream)  # no stream: every signal fails
        cid = new_id()
        with pytest.raises(UnavailableError, match="stored"):
            await api.input(res.loop_id, "hello", command_id=cid)
        stored = await events(nc, s, res.loop_id)
        assert [type(e) for e in stored] == [LoopStarted, InputSubmitted]
        await ensure_work_stream(nc.jetstream(), s)
        with anyio.fail_after(10):  # no repeat needed: the committer tries again by itself
            while await work_pending(nc, s, res.loop_id) == 0:
                await anyio.sleep(0.1)
        again = await api.input(res.loop_id, "hello", command_id=cid)
        assert again.seq == (await history(nc, s, res.loop_id)).last_seq
        assert await events(nc, s, res.loop_id) == stored  # the repeat wrote nothing


async def open_turn_with_gates(
    nc: NATS, settings: Settings, loop_id: str, n_gates: int, controls: list[str] | None = None
) -> tuple[str, list[GateOpened]]:
    """Commit (as the model-step would) a TurnStarted and ``n_gates`` GateOpened."""
    h = await history(nc, settings, loop_id)
    turn = new_id()
    step = new_id()
    gates = [
        make(
            GateOpened,
            loop_id=loop_id,
            turn_id=turn,
            step_id=step,
            tool_execution_id=new_id(),
            gate=Gate(id=new_id(), kind="permission", controls=controls or ["approve", "deny"], tool_name="calc"),
        )
        for _ in range(n_gates)
    ]
    started = make(TurnStarted, loop_id=loop_id, turn_id=turn, turn_index=h.turns + 1, message=user_text("go"))
    await CommitClient(nc, settings.names, T).commit(loop_id, h.last_seq, [started, *gates])
    return turn, gates


async def test_start_is_idempotent_by_command_id(committer: Settings, nc: NATS, api: LoopClient) -> None:
    res = await api.start(system="be brief", tools=["calc"], policy={"calc": "ask"}, limits=Limits(max_iterations=3))
    again = await api.start(res.loop_id, command_id=res.command_id)
    assert again.seq == res.seq and again.loop_id == res.loop_id
    with pytest.raises(ConflictError):
        await api.start(res.loop_id)
    [started] = await events(nc, committer, res.loop_id)
    assert isinstance(started, LoopStarted)
    assert started.model == committer.model and started.system == "be brief" and started.tools == ["calc"]
    assert started.policy == {"calc": "ask"} and started.limits.max_iterations == 3
    assert started.cause == Cause(command_id=res.command_id)
    # A loop without input has no work: nothing is signalled until its first input.
    assert await work_pending(nc, committer, res.loop_id) == 0
    await api.input(res.loop_id, "hello")
    assert await work_pending(nc, committer, res.loop_id) == 1


async def test_start_refuses_bad_bodies(committer: Settings, nc: NATS, api: LoopClient) -> None:
    loop_id = new_id()
    for kwargs, field in [
        ({"policy": {"calc": "maybe"}}, "policy"),
        ({"default_policy": "sometimes"}, "default_policy"),
        ({"tools": ["bad name!"]}, "tools"),
        ({"limits": Limits(max_iterations=0)}, "limits"),
        ({"on_unknown": "retry"}, "on_unknown"),
        ({"retries": {"calc": RetryPolicy(max_attempts=0)}}, "retries"),
        (
            {"retries": {"calc": RetryPolicy(max_attempts=2, initial_backoff_seconds=5, max_backoff_seconds=1)}},
            "retries",
        ),
        ({"retries": {"bad name!": RetryPolicy(max_attempts=2)}}, "retries"),
        ({"retries": {"calc": RetryPolicy(max_attempts=2, retry_on=["refused"])}}, "retries"),
    ]:
        with pytest.raises(InvalidRequestError) as err:
            await api.start(loop_id, **kwargs)  # type: ignore[arg-type]
        assert err.value.body.field == field
    with pytest.raises(InvalidRequestError) as err:
        await api.start("not-a-uuid")
    assert err.value.body.field == "loop_id"
    for body, field in [
        (b'{"command_id": "nope"}', "command_id"),
        (b'{"model": "demo"}', "command_id"),
        (b'{"command_id": "%s", "colour": 1}' % new_id().encode(), "colour"),
        (b"not json", ""),
    ]:
        msg = await nc.request(committer.names.api(loop_id, "start"), body, timeout=T)
        reply = msgspec.json.decode(msg.data, type=ApiReply)
        assert not reply.ok and reply.error is not None and reply.error.kind == "invalid", body
        assert reply.error.field == field, (body, reply.error)
    msg = await nc.request(committer.names.api(loop_id, "launch"), b"{}", timeout=T)
    reply = msgspec.json.decode(msg.data, type=ApiReply)
    assert reply.error is not None and reply.error.field == "verb"
    assert await events(nc, committer, loop_id) == []


async def test_input_idempotent_unknown_and_closed(committer: Settings, nc: NATS, api: LoopClient) -> None:
    with pytest.raises(NotFoundError):
        await api.input(new_id(), "hello")
    loop = await api.start()
    first = await api.input(loop.loop_id, "hello")
    assert (await api.input(loop.loop_id, "hello", command_id=first.command_id)).seq == first.seq
    second = await api.input(loop.loop_id, message=user_text("again"))
    assert second.seq > first.seq
    with pytest.raises(InvalidRequestError):
        await api.input(loop.loop_id, "  ")
    with pytest.raises(InvalidRequestError):
        await api.input(loop.loop_id, "a", message=user_text("b"))
    h = await history(nc, committer, loop.loop_id)
    assert [i.cause.command_id for i in h.pending_inputs if i.cause] == [first.command_id, second.command_id]
    closed = await api.close(loop.loop_id)
    with pytest.raises(ClosedError):
        await api.input(loop.loop_id, "too late")
    # a repeat of a command that was accepted before the close still answers its original seq
    assert (await api.input(loop.loop_id, "hello", command_id=first.command_id)).seq == first.seq
    assert (await api.close(loop.loop_id, command_id=closed.command_id)).seq == closed.seq  # a repeat
    with pytest.raises(ClosedError, match="closed already"):  # another close: nothing left to do, refused
        await api.close(loop.loop_id)
    kinds = [type(e).__name__ for e in await events(nc, committer, loop.loop_id)]
    assert kinds == ["LoopStarted", "InputSubmitted", "InputSubmitted", "LoopClosed"]


async def test_concurrent_inputs_through_two_committers(nc: NATS, settings: Settings) -> None:
    """Two committers take turns on one loop's commands: OCC + retry, nothing lost or doubled."""
    async with running_committer(settings), running_committer(settings):
        api = LoopClient(nc, settings.names, T)
        loop = await api.start()
        results = []

        async def send(i: int) -> None:
            results.append(await api.input(loop.loop_id, f"message {i}"))

        async with anyio.create_task_group() as tg:
            for i in range(12):
                tg.start_soon(send, i)
        h = await history(nc, settings, loop.loop_id)
        assert len(h.pending_inputs) == 12
        assert sorted(r.seq for r in results) == sorted(h.commands[r.command_id] for r in results)
        assert len({r.seq for r in results}) == 12


async def test_interrupt_abandons_open_gates_atomically(committer: Settings, nc: NATS, api: LoopClient) -> None:
    loop = await api.start()
    with pytest.raises(ConflictError, match="no turn is running") as idle:  # nothing to interrupt: refused
        await api.interrupt(loop.loop_id)
    assert idle.value.body.last_seq == loop.seq
    assert len(await events(nc, committer, loop.loop_id)) == 1
    turn, gates = await open_turn_with_gates(nc, committer, loop.loop_id, 2)
    res = await api.interrupt(loop.loop_id)
    assert (await api.interrupt(loop.loop_id, command_id=res.command_id)).seq == res.seq
    tail = (await events(nc, committer, loop.loop_id))[-3:]
    assert [type(e).__name__ for e in tail] == ["GateResolved", "GateResolved", "TurnInterrupted"]
    resolved = [e for e in tail if isinstance(e, GateResolved)]
    assert {e.gate_id for e in resolved} == {g.gate.id for g in gates}
    assert all(e.action == "abandoned" and e.resolver == "interrupt" for e in resolved)
    assert all(e.turn_id == turn and e.step_id == gates[0].step_id for e in resolved)
    assert {e.tool_execution_id for e in resolved} == {g.tool_execution_id for g in gates}
    interrupted = tail[-1]
    assert isinstance(interrupted, TurnInterrupted) and interrupted.turn_id == turn
    assert interrupted.turn_index == 1 and interrupted.reason == "interrupted"
    h = await history(nc, committer, loop.loop_id)
    assert h.open_turn is None and h.open_gates == [] and h.commands[res.command_id] == res.seq == h.last_seq
    with pytest.raises(ClosedError):
        await api.answer(loop.loop_id, gates[0].gate.id, "approve")


async def test_answer_rules(committer: Settings, nc: NATS, api: LoopClient) -> None:
    loop = await api.start()
    _, (gate, other) = await open_turn_with_gates(nc, committer, loop.loop_id, 2, ["approve", "deny"])
    with pytest.raises(NotFoundError):
        await api.answer(loop.loop_id, new_id(), "approve")
    with pytest.raises(NotFoundError):
        await api.answer(new_id(), gate.gate.id, "approve")
    with pytest.raises(InvalidRequestError) as err:
        await api.answer(loop.loop_id, gate.gate.id, "reply", text="not offered")
    assert err.value.body.field == "action"
    with pytest.raises(InvalidRequestError):
        await api.answer(loop.loop_id, gate.gate.id, "abandoned")
    with pytest.raises(InvalidRequestError):
        await api.answer(loop.loop_id, "not-a-uuid", "approve")
    res = await api.answer(loop.loop_id, gate.gate.id, "deny", reason="no thanks")
    assert (await api.answer(loop.loop_id, gate.gate.id, "deny", command_id=res.command_id)).seq == res.seq
    with pytest.raises(ClosedError):
        await api.answer(loop.loop_id, gate.gate.id, "approve")
    resolved = (await events(nc, committer, loop.loop_id))[-1]
    assert isinstance(resolved, GateResolved)
    assert (resolved.gate_id, resolved.action, resolved.reason, resolved.resolver) == (
        gate.gate.id,
        "deny",
        "no thanks",
        "operator",
    )
    assert (resolved.turn_id, resolved.step_id, resolved.tool_execution_id) == (
        gate.turn_id,
        gate.step_id,
        gate.tool_execution_id,
    )
    h = await history(nc, committer, loop.loop_id)
    assert [g.gate.id for g in h.open_gates] == [other.gate.id]
    assert [g.gate.id for g in h.resolved_gates] == [gate.gate.id]
    assert await work_pending(nc, committer, loop.loop_id) == 1


async def test_answer_names_its_resolver(committer: Settings, nc: NATS, api: LoopClient) -> None:
    loop = await api.start()
    _, (gate, other) = await open_turn_with_gates(nc, committer, loop.loop_id, 2, ["approve", "deny"])
    for bad in ("x" * 65, "tab\there"):
        with pytest.raises(InvalidRequestError) as err:
            await api.answer(loop.loop_id, gate.gate.id, "approve", resolver=bad)
        assert err.value.body.field == "resolver"
    await api.answer(loop.loop_id, gate.gate.id, "approve", resolver=" alice ")
    await api.answer(loop.loop_id, other.gate.id, "deny", resolver="   ")
    resolved = [e for e in await events(nc, committer, loop.loop_id) if isinstance(e, GateResolved)]
    assert [(e.gate_id, e.resolver) for e in resolved] == [(gate.gate.id, "alice"), (other.gate.id, "operator")]


async def test_close_ends_an_open_turn(committer: Settings, nc: NATS, api: LoopClient) -> None:
    with pytest.raises(NotFoundError):
        await api.close(new_id())
    loop = await api.start()
    await open_turn_with_gates(nc, committer, loop.loop_id, 1)
    res = await api.close(loop.loop_id)
    tail = (await events(nc, committer, loop.loop_id))[-3:]
    assert [type(e).__name__ for e in tail] == ["GateResolved", "TurnInterrupted", "LoopClosed"]
    assert isinstance(tail[-1], LoopClosed)
    h = await history(nc, committer, loop.loop_id)
    assert h.closed and h.open_turn is None and h.last_seq == res.seq
    with pytest.raises(ClosedError):
        await api.input(loop.loop_id, "hello")


async def test_api_reads_the_tail_before_deciding(committer: Settings, nc: NATS, api: LoopClient) -> None:
    """A model-step commit lands after the committer cached the loop: the command sees it."""
    loop = await api.start()
    await api.input(loop.loop_id, "warm the cache")
    # The committer has the loop cached; append behind its back.
    h = await history(nc, committer, loop.loop_id)
    inp = h.pending_inputs[0]
    assert isinstance(inp, InputSubmitted) and inp.cause is not None
    started = make(
        TurnStarted,
        loop_id=loop.loop_id,
        turn_id=new_id(),
        turn_index=1,
        message=inp.message,
        cause=Cause(command_id=inp.cause.command_id),
    )
    await CommitClient(nc, committer.names, T).commit(loop.loop_id, h.last_seq, [started])
    res = await api.interrupt(loop.loop_id)
    last = (await events(nc, committer, loop.loop_id))[-1]
    assert isinstance(last, TurnInterrupted) and last.turn_id == started.turn_id
    assert res.seq == (await history(nc, committer, loop.loop_id)).last_seq


def _api_of(nc: NATS, settings: Settings) -> LoopApi:
    """A loop API with a fold cache of its own (what a second committer process has)."""
    return LoopApi(nc, settings, Appender(nc, settings.names, retry_seconds=5))


async def _command(api: LoopApi, settings: Settings, loop_id: str, verb: Verb, req: msgspec.Struct) -> ApiReply:
    return msgspec.json.decode(await api.handle(settings.names.api(loop_id, verb), encode(req)), type=ApiReply)


async def test_commands_decided_without_a_read_still_see_what_other_committers_stored(
    nc: NATS, settings: Settings
) -> None:
    # A start of a loop a committer does not know, and a command on a fold it wrote last itself, are
    # decided without reading the history first. What another committer stored meanwhile — a repeat
    # of this very command included — is still found: the append's expected sequence fails, or the
    # command's derived event id is taken, and the command is decided again on the read history.
    await ensure_all(nc.jetstream(timeout=T), settings)
    a, b = _api_of(nc, settings), _api_of(nc, settings)
    loop_id, start_id, input_id = new_id(), new_id(), new_id()
    start = StartRequest(command_id=start_id)
    started = await _command(a, settings, loop_id, "start", start)
    assert started.ok and started.seq
    # b stores an input behind a's back; a gets the same command (a client's retry, say).
    first = await _command(b, settings, loop_id, "input", InputRequest(command_id=input_id, text="hi"))
    again = await _command(a, settings, loop_id, "input", InputRequest(command_id=input_id, text="hi"))
    assert first.ok and again.ok and again.seq == first.seq
    # A repeated start reaching a committer that never saw the loop answers its first seq.
    for api in (b, _api_of(nc, settings)):
        repeat = await _command(api, settings, loop_id, "start", start)
        assert repeat.ok and repeat.seq == started.seq, repeat
    refused = await _command(_api_of(nc, settings), settings, loop_id, "start", StartRequest(command_id=new_id()))
    assert not refused.ok and refused.error is not None and refused.error.kind == "conflict"
    # a's fold is behind b's input: its next input is appended after it all the same.
    second = await _command(a, settings, loop_id, "input", InputRequest(command_id=new_id(), text="more"))
    assert second.ok and second.seq is not None and first.seq is not None and second.seq > first.seq
    kinds = [type(e).__name__ for e in await events(nc, settings, loop_id)]
    assert kinds == ["LoopStarted", "InputSubmitted", "InputSubmitted"]


async def test_a_loop_s_start_and_first_input_read_no_history(committer: Settings, nc: NATS, api: LoopClient) -> None:
    reads: list[str] = []

    async def tap(msg: Msg) -> None:
        reads.append(msg.subject)

    gets = [
        await nc.subscribe(js_api(kind, committer.names.history_stream), cb=tap)
        for kind in ("STREAM.MSG.GET", "DIRECT.GET")
    ]
    await nc.flush()
    loop = await api.start()
    await api.input(loop.loop_id, "hello")
    await nc.flush()
    for sub in gets:
        await sub.unsubscribe()
    assert reads == []
    assert [type(e).__name__ for e in await events(nc, committer, loop.loop_id)] == ["LoopStarted", "InputSubmitted"]
