"""Durable tool-call records, recorded-result reuse, argument-digest refusal and retry policies."""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager

import anyio
import msgspec
import pytest
from nats.aio.client import Client as NATS

from services.toolcaller import client as cl
from services.toolcaller.executor import PlannedCall, run_batch
from services.tools.sdk import Tool, ToolContext, tool
from services.toolwire.protocol import CallIds
from services.toolwire.spec import ToolSpec
from shared.content import TextBlock, text_of
from shared.events import Event, RawToolUse, RetryPolicy, ToolCallCompleted, ToolCallProgress, ToolCallStarted
from shared.results import DONE, STARTED, ResultStore, args_digest
from shared.settings import Settings
from tests.integration.test_tools_protocol import worker as serving

pytestmark = pytest.mark.anyio

RUNS: list[str] = []
SEEN_DURING_RUN: list[str] = []  # the record state each run of "effect" found while running
FLAKY_SLOW: dict[str, int] = {}  # tag → runs so far (the first run of a tag is slow)


class Args(msgspec.Struct):
    tag: str = ""


@tool(name="effect", description="a side effect (unannotated: may not run twice)")
async def effect(args: Args, ctx: ToolContext) -> str:
    RUNS.append(args.tag)
    rec = await ResultStore(ctx.nc, ctx.settings.names).call("effect", ctx.ids.execution_id, loop_id=ctx.ids.loop_id)
    SEEN_DURING_RUN.append(rec.state if rec is not None else "")
    return f"did {args.tag}"


@tool(name="lookup", description="reads only", read_only=True)
async def lookup(args: Args, ctx: ToolContext) -> str:
    RUNS.append(args.tag)
    rec = await ResultStore(ctx.nc, ctx.settings.names).call("lookup", ctx.ids.execution_id, loop_id=ctx.ids.loop_id)
    SEEN_DURING_RUN.append(rec.state if rec is not None else "")
    return f"found {args.tag}"


@tool(name="flaky", description="slow the first time", idempotent=True, timeout=0.5)
async def flaky(args: Args) -> str:
    FLAKY_SLOW[args.tag] = FLAKY_SLOW.get(args.tag, 0) + 1
    if FLAKY_SLOW[args.tag] == 1:
        await anyio.sleep(5)
    return f"ok {args.tag}"


@tool(name="flaky_effect", description="slow the first time, not idempotent", timeout=0.5)
async def flaky_effect(args: Args) -> str:
    FLAKY_SLOW[args.tag] = FLAKY_SLOW.get(args.tag, 0) + 1
    if FLAKY_SLOW[args.tag] == 1:
        await anyio.sleep(5)
    return f"ok {args.tag}"


TOOLS = [effect, lookup, flaky, flaky_effect]


@pytest.fixture
def fast(settings: Settings) -> Settings:
    return dataclasses.replace(settings, heartbeat_seconds=0.3)


def worker(settings: Settings, tools: Sequence[Tool] = TOOLS) -> AbstractAsyncContextManager[None]:
    return serving(settings, tools)


def ids() -> CallIds:
    return CallIds(loop_id=str(uuid.uuid4()), step_id="s", tool_use_id="u", execution_id=str(uuid.uuid4()))


def text(out: cl.CallOutcome) -> str:
    assert out.result is not None, out
    return "".join(b.text for b in out.result.blocks if isinstance(b, TextBlock))


async def test_a_recorded_call_is_answered_from_its_record_by_any_worker(nc: NATS, fast: Settings) -> None:
    RUNS.clear()
    SEEN_DURING_RUN.clear()
    call_ids = ids()
    async with cl.ToolClient(nc, fast.names, heartbeat_seconds=0.3) as client:
        async with worker(fast):
            first = await client.call("effect", b'{"tag": "a"}', ids=call_ids, timeout=5)
        assert text(first) == "did a" and RUNS == ["a"]
        assert SEEN_DURING_RUN == [STARTED], "a tool that may not run twice is known as started before it runs"
        rec = await ResultStore(nc, fast.names).call("effect", call_ids.execution_id, loop_id=call_ids.loop_id)
        assert rec is not None and rec.state == DONE and rec.args_digest == args_digest(b'{"tag": "a"}')
        # Another worker process (a restart, another replica): the record answers, nothing runs.
        async with worker(fast):
            again = await client.call("effect", b'{"tag": "a"}', ids=call_ids, timeout=5)
            assert text(again) == "did a" and RUNS == ["a"]
            # The same execution id with other arguments is refused, and does not run either.
            other = await client.call("effect", b'{"tag": "b"}', ids=call_ids, timeout=5)
            assert other.status == cl.REFUSED and "other arguments" in other.message and RUNS == ["a"]
            # A read-only tool is not marked started (re-running it is harmless), but its result is recorded.
            lookup_ids = ids()
            found = await client.call("lookup", b'{"tag": "c"}', ids=lookup_ids, timeout=5)
            assert text(found) == "found c" and SEEN_DURING_RUN == [STARTED, ""]
            # (written after the reply, without waiting for its ack: it lands in the store shortly after)
            store = ResultStore(nc, fast.names)
            with anyio.fail_after(5):
                while (rec := await store.call("lookup", lookup_ids.execution_id, loop_id=lookup_ids.loop_id)) is None:
                    await anyio.sleep(0.02)
            assert rec.state == DONE


async def _step(nc: NATS, settings: Settings, *names: str) -> tuple[str, list[str]]:
    """Run one step of calls (each with its own execution id) of a new loop through the batch
    executor; the loop's id and the calls' ids."""
    loop_id = str(uuid.uuid4())
    spec_of = {t.name: t.spec(settings) for t in TOOLS}.get
    plans = [
        PlannedCall.approved(RawToolUse(id=f"u{i}", name=n, input=f'{{"tag": "s{i}"}}'), str(uuid.uuid4()))
        for i, n in enumerate(names)
    ]

    async def publish(_e: Event) -> None:
        return None

    async with cl.ToolClient(nc, settings.names, heartbeat_seconds=0.3) as client:
        await run_batch(
            plans, loop_id=loop_id, turn_id="t", step_id="s", spec_of=spec_of, client=client, publish=publish
        )
    return loop_id, [pc.execution_id for pc in plans]


async def test_a_step_of_read_only_calls_writes_no_record_and_a_step_with_a_plan_records_each(
    nc: NATS, fast: Settings
) -> None:
    RUNS.clear()
    store = ResultStore(nc, fast.names)
    async with worker(fast):
        one, (alone,) = await _step(nc, fast, "lookup")  # no plan: running it again asks the model again
        mixed, (mixed_lookup, mixed_effect) = await _step(nc, fast, "lookup", "effect")  # a plan: records are read
        await anyio.sleep(0.5)  # a read-only call's record is written after its reply
    assert await store.call("lookup", alone, loop_id=one) is None
    for name, eid in (("lookup", mixed_lookup), ("effect", mixed_effect)):
        rec = await store.call(name, eid, loop_id=mixed)
        assert rec is not None and rec.state == DONE, name


async def test_a_planned_call_with_a_recorded_outcome_is_not_sent(nc: NATS, fast: Settings) -> None:
    RUNS.clear()
    events: list[Event] = []

    async def publish(e: Event) -> None:
        events.append(e)

    use = RawToolUse(id="u1", name="effect", input='{"tag": "r"}')
    recorded = cl.outcome_of("result", b'{"blocks": [{"type": "text", "text": "did r earlier"}]}')
    plan = PlannedCall.approved(use, str(uuid.uuid4()))
    plan.recorded = recorded
    async with worker(fast), cl.ToolClient(nc, fast.names) as client:
        results = await run_batch(
            [plan],
            loop_id=str(uuid.uuid4()),
            turn_id="t",
            step_id="s",
            spec_of=lambda name: ToolSpec(name=name),
            client=client,
            publish=publish,
        )
    assert [text_of(r) for r in results] == ["did r earlier"] and RUNS == []
    started = [e for e in events if isinstance(e, ToolCallStarted)]
    completed = [e for e in events if isinstance(e, ToolCallCompleted)]
    assert len(started) == len(completed) == 1 and started[0].replayed and completed[0].replayed


async def _run_one(nc: NATS, settings: Settings, name: str, tag: str, **kw: object) -> tuple[str, list[Event]]:
    events: list[Event] = []

    async def publish(e: Event) -> None:
        events.append(e)

    spec_of = {t.name: t.spec(settings) for t in TOOLS}.get
    use = RawToolUse(id="u1", name=name, input=msgspec.json.encode({"tag": tag}).decode())
    async with cl.ToolClient(nc, settings.names, heartbeat_seconds=0.3) as client:
        results = await run_batch(
            [PlannedCall.approved(use, str(uuid.uuid4()))],
            loop_id=str(uuid.uuid4()),
            turn_id="t",
            step_id="s",
            spec_of=spec_of,
            client=client,
            publish=publish,
            **kw,  # type: ignore[arg-type]
        )
    return text_of(results[0]), events


async def test_retry_policies_apply_to_idempotent_tools_only(nc: NATS, fast: Settings) -> None:
    FLAKY_SLOW.clear()
    async with worker(fast):
        # Idempotent: the first attempt times out, the default policy sends it again.
        out, events = await _run_one(nc, fast, "flaky", "x")
        assert out == "ok x" and FLAKY_SLOW["x"] == 2
        progress = [e.message for e in events if isinstance(e, ToolCallProgress)]
        assert any(m.startswith("attempt 1/4 failed (timeout") for m in progress), progress
        # The loop's override: one attempt only.
        out, _ = await _run_one(nc, fast, "flaky", "y", retries={"flaky": RetryPolicy(max_attempts=1)})
        assert out == "error: tool timed out after 0.5s" and FLAKY_SLOW["y"] == 1
        # Retried only on the outcomes the policy names.
        out, _ = await _run_one(
            nc, fast, "flaky", "w", retries={"flaky": RetryPolicy(max_attempts=3, retry_on=["crashed"])}
        )
        assert out == "error: tool timed out after 0.5s" and FLAKY_SLOW["w"] == 1
        # Not idempotent: never retried, whatever the override says.
        out, _ = await _run_one(nc, fast, "flaky_effect", "z", retries={"flaky_effect": RetryPolicy(max_attempts=5)})
        assert out == "error: tool timed out after 0.5s" and FLAKY_SLOW["z"] == 1


async def test_the_results_bucket_keeps_records_for_the_configured_ttl(nc: NATS, fast: Settings) -> None:
    settings = dataclasses.replace(fast, results_ttl_seconds=3600.0)
    async with worker(settings):
        info = await nc.jetstream().stream_info(f"KV_{settings.names.results_bucket}")
    assert info.config.max_age == 3600.0
    assert Settings.from_env({"LW_RESULTS_TTL_SECONDS": "86400"}).results_ttl_seconds == 86400.0


def test_sdk_refuses_inconsistent_annotations() -> None:
    async def f(args: Args) -> str:
        return ""

    with pytest.raises(ValueError, match="read_only and destructive"):
        tool(name="bad", read_only=True, destructive=True)(f)
    with pytest.raises(ValueError, match="only a read_only or idempotent tool may be retried"):
        tool(name="bad", retry=RetryPolicy(max_attempts=3))(f)
    spec = tool(name="good", idempotent=True, open_world=True)(f).spec()
    assert spec.idempotent and spec.open_world and not spec.read_only and spec.rerun_safe


async def test_unawaited_record_writes_are_acknowledged_or_handed_back(nc: NATS, fast: Settings) -> None:
    """``record_call_nowait``: an acknowledged write is readable; one nothing stores (no stream:
    "no responders") or that no ack answers in time goes to ``not_acked`` for an awaited write."""
    from shared.results import CallRecord
    from shared.streams import ensure_kv
    from shared.subjects import Names

    await ensure_kv(nc.jetstream(), fast.names.results_bucket, ttl=fast.results_ttl_seconds)
    handed: list[str] = []
    store = ResultStore(nc, fast.names)
    await store.open_acks(lambda loop_id, rec: handed.append(rec.execution_id))
    rec = CallRecord(tool="lookup", execution_id=str(uuid.uuid4()), args_digest="d", state=DONE, reply_kind="result")
    loop_id = str(uuid.uuid4())
    await store.record_call_nowait(rec, loop_id=loop_id)
    with anyio.fail_after(5):
        while store.unacked:
            await anyio.sleep(0.01)
    got = await store.call("lookup", rec.execution_id, loop_id=loop_id)
    assert got is not None and got.state == DONE and handed == []

    nowhere = ResultStore(nc, Names(prefix=fast.names.prefix + "x"))  # no such bucket
    await nowhere.open_acks(lambda loop_id, rec: handed.append(rec.execution_id))
    await nowhere.record_call_nowait(rec, loop_id=loop_id)
    with anyio.fail_after(5):
        while not handed:
            await anyio.sleep(0.01)
    assert handed == [rec.execution_id] and nowhere.unacked == 0

    handed.clear()
    silent = ResultStore(nc, Names(prefix=fast.names.prefix + "y"))
    sub = await nc.subscribe(f"$KV.{silent.bucket_of(loop_id)}.>")  # receives the write, never acknowledges it
    await silent.open_acks(lambda loop_id, rec: handed.append(rec.execution_id))
    await silent.record_call_nowait(rec, loop_id=loop_id)
    await sub.next_msg(timeout=5)
    silent.expire_unacked(time.monotonic())
    assert handed == [] and silent.unacked == 1, "not overdue yet"
    silent.expire_unacked(time.monotonic() + 10)
    assert handed == [rec.execution_id] and silent.unacked == 0
    await silent.close_acks()
    await nowhere.close_acks()
    await store.close_acks()
    await sub.unsubscribe()
