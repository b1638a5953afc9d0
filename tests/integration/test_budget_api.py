"""The loop API's budget: set at start, replaced by the budget command (in-process committer, R1)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest
from nats.aio.client import Client as NATS

from shared.client import LoopClient
from shared.events import Budget, BudgetChanged
from shared.protocol import ClosedError, InvalidRequestError, NotFoundError
from shared.replay import load, replay
from shared.settings import Settings
from tests.integration.committer_fixtures import new_id, running_committer

pytestmark = pytest.mark.anyio


@pytest.fixture
async def committer(settings: Settings) -> AsyncIterator[Settings]:
    async with running_committer(settings):
        yield settings


async def test_start_and_budget_commands(committer: Settings, nc: NATS) -> None:
    api = LoopClient(nc, committer.names, 10.0)
    first = Budget(max_total_tokens=1000, max_cost_usd=0.5, on_budget="ask")
    loop = await api.start(model="demo", budget=first)
    h = await load(nc, committer.names, loop.loop_id)
    assert h.config is not None and h.config.budget == first and h.budget == first

    second = Budget(max_steps_per_turn=3)
    res = await api.budget(loop.loop_id, second)
    assert (await api.budget(loop.loop_id, second, command_id=res.command_id)).seq == res.seq  # idempotent
    h = await load(nc, committer.names, loop.loop_id)
    assert (h.budget, h.budget_base, h.last_seq) == (second, second, res.seq)
    records = [e async for _, e in replay(nc, loop.loop_id, settings=committer)]
    assert [type(e).__name__ for e in records].count("BudgetChanged") == 1
    changed = records[-1]
    assert isinstance(changed, BudgetChanged) and changed.cause is not None
    assert changed.cause.command_id == res.command_id

    with pytest.raises(NotFoundError):
        await api.budget(new_id(), second)
    await api.close(loop.loop_id)
    with pytest.raises(ClosedError):
        await api.budget(loop.loop_id, second)


async def test_a_cost_limit_needs_a_priced_model(committer: Settings, nc: NATS) -> None:
    api = LoopClient(nc, committer.names, 10.0)
    with pytest.raises(InvalidRequestError, match="no price") as info:
        await api.start(model="openai:my-local-model", budget=Budget(max_cost_usd=1))
    assert info.value.body.field == "budget"
    loop = await api.start(model="openai:my-local-model", budget=Budget(max_total_tokens=10))  # tokens: fine
    with pytest.raises(InvalidRequestError, match="no price"):
        await api.budget(loop.loop_id, Budget(max_cost_usd=1))
    priced = await api.start(model="openai:gpt-4o-2024-08-06", budget=Budget(max_cost_usd=1))
    assert priced.seq


async def test_a_bad_budget_is_refused_with_its_field(committer: Settings, nc: NATS) -> None:
    api = LoopClient(nc, committer.names, 10.0)
    loop = await api.start(model="demo")
    body = b'{"command_id": "' + new_id().encode() + b'", "budget": {"max_cost_usd": -1}}'
    reply = await nc.request(committer.names.api(loop.loop_id, "budget"), body, timeout=10)
    assert b'"ok":false' in reply.data and b'"kind":"invalid"' in reply.data
    body = b'{"command_id": "' + new_id().encode() + b'", "budget": {"max_dollars": 1}}'
    reply = await nc.request(committer.names.api(loop.loop_id, "budget"), body, timeout=10)
    assert b'"kind":"invalid"' in reply.data


async def test_a_whole_number_limit_past_the_maximum_is_refused(committer: Settings, nc: NATS) -> None:
    # Raw bodies, as any client may send them: a limit past 2^53 - 1 is refused with a structured
    # error naming it, and nothing is written.
    api = LoopClient(nc, committer.names, 10.0)
    loop = await api.start(model="demo")
    before = (await load(nc, committer.names, loop.loop_id)).last_seq
    for budget in (b'{"max_steps_per_turn": 18446744073709551616}', b'{"max_total_tokens": 9007199254740992}'):
        body = b'{"command_id": "' + new_id().encode() + b'", "budget": ' + budget + b"}"
        reply = json.loads((await nc.request(committer.names.api(loop.loop_id, "budget"), body, timeout=10)).data)
        assert reply["ok"] is False and reply["error"]["kind"] == "invalid", reply
        assert "budget" in reply["error"].get("field", "") and "9007199254740991" in reply["error"]["message"], reply
    assert (await load(nc, committer.names, loop.loop_id)).last_seq == before
    for field, value in (
        ("budget", b'{"max_total_tokens": 99999999999999999999999}'),
        ("limits", b'{"max_tokens": 1000000000000000000000000000000}'),
    ):
        child = new_id()
        body = (
            b'{"command_id": "' + new_id().encode() + b'", "model": "demo", "' + field.encode() + b'": ' + value + b"}"
        )
        reply = json.loads((await nc.request(committer.names.api(child, "start"), body, timeout=10)).data)
        assert reply["ok"] is False and reply["error"]["kind"] == "invalid", reply
        assert (await load(nc, committer.names, child)).config is None
    top = Budget(max_total_tokens=2**53 - 1, max_steps_per_turn=2**53 - 1)
    await api.budget(loop.loop_id, top)
    assert (await load(nc, committer.names, loop.loop_id)).budget == top
