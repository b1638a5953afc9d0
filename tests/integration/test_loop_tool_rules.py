"""The loop API refuses a policy or re-execution rule naming no tool of the loop (a misspelt tool would
otherwise run ungated), against an in-process committer and tools registered in the real tools bucket."""

from __future__ import annotations

from collections.abc import AsyncIterator

import msgspec
import pytest
from nats.aio.client import Client as NATS

from services.toolwire.bucket import ensure_tools_bucket, registration_key
from services.toolwire.spec import Registration, ToolSpec
from shared.client import CommitClient, LoopClient
from shared.content import AIMessage, ToolUseBlock, tool_result, user_text
from shared.events import StepDone, TurnDone, TurnStarted, make
from shared.protocol import ApiReply, InvalidRequestError, StartRequest, TooLargeError, encode
from shared.replay import replay
from shared.settings import Settings
from tests.integration.committer_fixtures import input_submitted, loop_started, new_id, running_committer, step
from tests.integration.test_history import tool_step

pytestmark = pytest.mark.anyio
T = 10.0


@pytest.fixture
async def committer(settings: Settings, nc: NATS) -> AsyncIterator[Settings]:
    kv = await ensure_tools_bucket(nc.jetstream(), settings.names)
    for name in ("calculator", "clock"):  # what a live worker writes (services.tools.registration)
        reg = Registration(worker_id="w1", spec=ToolSpec(name=name))
        await kv.put(registration_key(name, reg.worker_id), msgspec.json.encode(reg))
    async with running_committer(settings):
        yield settings


async def _records(nc: NATS, settings: Settings, loop_id: str) -> list[object]:
    return [e async for _, e in replay(nc, loop_id, settings=settings)]


async def test_a_policy_naming_no_live_tool_is_refused_with_the_close_match(committer: Settings, nc: NATS) -> None:
    api = LoopClient(nc, committer.names, T)
    loop_id = new_id()
    with pytest.raises(InvalidRequestError) as err:
        await api.start(loop_id, policy={"calculater": "ask"})
    assert err.value.body.field == "policy"
    assert err.value.body.message == "policy: 'calculater' is not a tool of the loop (did you mean calculator?)"
    with pytest.raises(InvalidRequestError) as err:
        await api.start(loop_id, policy={"clock": "ask", "weather": "deny"})
    assert err.value.body.message == "policy: 'weather' is not a tool of the loop (live tools: calculator, clock)"
    assert await _records(nc, committer, loop_id) == []  # nothing written

    # Over the wire as any client sends it: a structured error reply.
    body = encode(StartRequest(command_id=new_id(), policy={"calculater": "ask"}))
    reply = msgspec.json.decode(
        (await nc.request(committer.names.api(loop_id, "start"), body, timeout=T)).data, type=ApiReply
    )
    assert not reply.ok and reply.error is not None
    assert (reply.error.kind, reply.error.field) == (
        "invalid",
        "policy",
    ) and "did you mean calculator?" in reply.error.message

    # Live tools and "*" are accepted.
    assert (await api.start(loop_id, policy={"calculator": "ask", "*": "deny"})).seq > 0


async def test_with_an_allow_list_the_policy_names_only_its_tools(committer: Settings, nc: NATS) -> None:
    api = LoopClient(nc, committer.names, T)
    loop_id = new_id()
    with pytest.raises(InvalidRequestError) as err:
        await api.start(loop_id, tools=["clock"], policy={"calculator": "ask"})  # live, but not the loop's
    assert err.value.body.message == "policy: 'calculator' is not a tool of the loop (its tools: clock)"
    with pytest.raises(InvalidRequestError) as err:
        await api.start(loop_id, tools=[], policy={"clock": "ask"})
    assert err.value.body.message == "policy: 'clock' is not a tool of the loop (the loop has no tools)"
    assert await _records(nc, committer, loop_id) == []
    # An allow-list needs no live worker: the loop's own tools are what its rules may name.
    assert (await api.start(loop_id, tools=["later_tool"], policy={"later_tool": "ask"})).seq > 0


async def test_a_fork_refuses_rules_naming_no_tool_of_the_loop(committer: Settings, nc: NATS) -> None:
    api = LoopClient(nc, committer.names, T)
    source = (await api.start(model="demo")).loop_id
    await api.input(source, "hello")
    fork_id = new_id()
    with pytest.raises(InvalidRequestError) as err:
        await api.fork(source, reexecution={"calculater": "reuse"}, loop_id=fork_id)
    assert (err.value.body.field, err.value.body.message) == (
        "reexecution",
        "reexecution: 'calculater' is not a tool of the loop (did you mean calculator?)",
    )
    with pytest.raises(InvalidRequestError) as err:
        await api.fork(source, policy={"clokc": "ask"}, loop_id=fork_id)
    assert "did you mean clock?" in err.value.body.message
    with pytest.raises(InvalidRequestError) as err:
        await api.fork(source, model="dmeo", loop_id=fork_id)
    assert err.value.body.field == "model" and "unknown model 'dmeo'" in err.value.body.message
    assert await _records(nc, committer, fork_id) == []
    done = await api.fork(source, reexecution={"calculator": "reuse", "*": "ask"}, loop_id=fork_id)
    assert done.loop_id == fork_id


async def test_start_refuses_a_model_of_no_known_form(committer: Settings, nc: NATS) -> None:
    api = LoopClient(nc, committer.names, T)
    with pytest.raises(InvalidRequestError) as err:
        await api.start(model="dmeo")
    assert err.value.body.field == "model" and "unknown model 'dmeo'" in err.value.body.message


async def test_a_fork_may_name_a_tool_its_source_called_though_none_is_live(committer: Settings, nc: NATS) -> None:
    source = new_id()
    t = new_id()
    records = [
        loop_started(source),
        input_submitted(source, "use calc"),
        make(TurnStarted, loop_id=source, turn_id=t, turn_index=1, message=user_text("use calc")),
        tool_step(source, t, "call_1"),  # a call of "calc", a tool no worker registers now
        step(source, t, "done"),
        make(TurnDone, loop_id=source, turn_id=t, turn_index=1),
    ]
    await CommitClient(nc, committer.names, T).commit(source, 0, records)
    api = LoopClient(nc, committer.names, T)
    with pytest.raises(InvalidRequestError) as err:
        await api.fork(source, at=2, reexecution={"calk": "reuse"})
    assert err.value.body.message == "reexecution: 'calk' is not a tool of the loop (did you mean calc?)"
    assert (await api.fork(source, at=2, reexecution={"calc": "reuse"}, policy={"calc": "ask"})).seq > 0


def _big_call(loop_id: str, turn_id: str, n: int, size: int) -> StepDone:
    """A step calling "calc" with arguments ``{"n": n}`` whose result is ``size`` bytes of text."""
    call = ToolUseBlock(id=f"call_{n}", name="calc", input=msgspec.Raw(b'{"n":%d}' % n))
    ai = AIMessage(blocks=[call])
    return make(
        StepDone, loop_id=loop_id, turn_id=turn_id, step_id=new_id(), messages=[ai, tool_result(call.id, "x" * size)]
    )


async def test_a_fork_whose_copy_of_its_sources_calls_does_not_fit_one_record_is_refused(
    committer: Settings, nc: NATS
) -> None:
    """The source's calls after the point go into the fork's first record; too large for one record,
    the fork is refused (nothing written) rather than written without them."""
    source, t = new_id(), new_id()
    head = [
        loop_started(source),
        input_submitted(source, "use calc"),
        make(TurnStarted, loop_id=source, turn_id=t, turn_index=1, message=user_text("use calc")),
    ]
    commits = CommitClient(nc, committer.names, T)
    seq = (await commits.commit(source, 0, head)).last_seq
    size = committer.max_record_bytes * 2 // 5  # each record fits; three results after the point do not
    for n in range(3):
        seq = (await commits.commit(source, seq, [_big_call(source, t, n, size)])).last_seq
    seq = (
        await commits.commit(
            source, seq, [step(source, t, "done"), make(TurnDone, loop_id=source, turn_id=t, turn_index=1)]
        )
    ).last_seq
    api = LoopClient(nc, committer.names, T)
    fork_id = new_id()
    with pytest.raises(TooLargeError) as err:
        await api.fork(source, at=2, loop_id=fork_id)
    assert (err.value.body.kind, err.value.body.field) == ("too_large", "source_calls")
    assert "3 calls" in err.value.body.message and "fork at a later point" in err.value.body.message
    assert await _records(nc, committer, fork_id) == []  # nothing written
    # From a point after the large calls the fork has nothing to copy: it is written.
    assert (await api.fork(source, loop_id=fork_id)).loop_id == fork_id
