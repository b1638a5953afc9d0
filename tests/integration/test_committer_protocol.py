"""The commit protocol over NATS against an in-process committer on the shared (R1) server.

Bad input of every kind gets a structured error reply and leaves the stream unchanged, and the
committer keeps serving; racing writers get exactly one append per expected sequence; retries of a
stored commit answer the original sequences; multi-event commits are all-or-nothing.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import anyio
import msgspec
import pytest
from nats.aio.client import Client as NATS

from shared.client import CommitClient
from shared.codec import encode_event, encode_live
from shared.content import ai_text
from shared.events import StepDone, ToolCallStarted, make
from shared.protocol import CommitReply, ConflictError, ErrorBody, InvalidRequestError, TooLargeError
from shared.settings import Settings
from tests.integration.committer_fixtures import loop_started, new_id, running_committer, step, stored, text_turn
from tests.unit.test_validate import DECODABLE_BAD_GROUPS, header_for

pytestmark = pytest.mark.anyio
T = 10.0


@pytest.fixture
async def committer(settings: Settings) -> AsyncIterator[Settings]:
    async with running_committer(settings):
        yield settings


async def request(nc: NATS, subject: str, body: bytes) -> CommitReply:
    msg = await nc.request(subject, body, timeout=T)
    return msgspec.json.decode(msg.data, type=CommitReply)


def body(expected: int, *envelopes: bytes) -> bytes:
    return b'{"expected_last_seq":%d,"events":[%s]}' % (expected, b",".join(envelopes))


async def started_loop(nc: NATS, settings: Settings) -> tuple[str, int]:
    loop_id = new_id()
    res = await CommitClient(nc, settings.names, T).commit(loop_id, 0, [loop_started(loop_id)])
    return loop_id, res.last_seq


async def assert_serving(nc: NATS, settings: Settings, loop_id: str) -> None:
    """The committer still answers a valid commit (it survived whatever came before)."""
    records = await stored(nc, settings, loop_id)
    last = records[-1][0] if records else 0
    t = new_id()
    res = await CommitClient(nc, settings.names, T).commit(loop_id, last, [step(loop_id, t)])
    assert res.seqs and res.seqs[0] > last


def invalid_step_json(loop_id: str, messages: Any) -> bytes:
    doc = {"type": "StepDone", "v": 1, **header_for(StepDone), "messages": messages}
    doc.update(loop_id=loop_id, event_id=new_id())
    return json.dumps(doc).encode()


async def test_every_invalid_step_group_gets_a_structured_error(committer: Settings, nc: NATS) -> None:
    loop_id, last = await started_loop(nc, committer)
    before = await stored(nc, committer, loop_id)
    for label, doc in DECODABLE_BAD_GROUPS:
        reply = await request(nc, committer.names.commit(loop_id), body(last, invalid_step_json(loop_id, doc)))
        assert not reply.ok, label
        assert reply.error is not None
        assert (reply.error.kind, reply.error.event, reply.error.field, reply.error.rule, reply.error.index) == (
            "invalid",
            "StepDone",
            "messages",
            "is invalid",
            0,
        ), label
    assert await stored(nc, committer, loop_id) == before
    await assert_serving(nc, committer, loop_id)


async def test_ephemeral_unknown_and_malformed_events_are_refused(committer: Settings, nc: NATS) -> None:
    loop_id, last = await started_loop(nc, committer)
    subject = committer.names.commit(loop_id)
    started = make(
        ToolCallStarted,
        loop_id=loop_id,
        turn_id=new_id(),
        step_id=new_id(),
        tool_execution_id=new_id(),
        tool_name="calc",
        tool_use_id="t1",
    )
    valid = json.loads(encode_event(step(loop_id, new_id())))

    def variant(**fields: object) -> bytes:
        return json.dumps({**valid, **fields}).encode()

    unknown = ("invalid", "Nope", "type", "is not a known event type")
    cases: list[tuple[str, bytes, tuple[str, str, str, str]]] = [
        ("ephemeral", encode_live(started), ("invalid", "ToolCallStarted", "type", "is invalid")),
        ("unknown type", variant(type="Nope"), unknown),
        ("v2", variant(v=2), ("invalid", "", "v", "is invalid")),
        ("unknown field", variant(extra=1), ("invalid", "", "", "")),
        ("no event_id", variant(event_id=""), ("invalid", "StepDone", "event_id", "must be set")),
        ("bad loop id", variant(loop_id="nope"), ("invalid", "StepDone", "loop_id", "is invalid")),
        ("other loop", variant(loop_id=new_id()), ("invalid", "StepDone", "loop_id", "is invalid")),
        ("duplicate keys", b'{"type":"StepDone","type":"StepDone"}', ("invalid", "", "", "")),
        ("not an object", b"[1,2]", ("invalid", "", "", "")),
        ("a string", b'"StepDone"', ("invalid", "", "", "")),
    ]
    for label, envelope, (kind, event, field, rule) in cases:
        reply = await request(nc, subject, body(last, envelope))
        assert not reply.ok and reply.error is not None, label
        e = reply.error
        assert e.kind == kind, (label, e)
        if event:
            assert e.event == event, (label, e)
        if field:
            assert (e.field, e.rule) == (field, rule), (label, e)
        assert e.index == 0 and e.message, (label, e)
    assert len(await stored(nc, committer, loop_id)) == 1
    await assert_serving(nc, committer, loop_id)


async def test_garbage_requests_get_an_error_reply(committer: Settings, nc: NATS) -> None:
    loop_id, _ = await started_loop(nc, committer)
    subject = committer.names.commit(loop_id)
    envelope = encode_event(step(loop_id, new_id()))
    garbage = [
        b"",
        b"garbage",
        b"\xff\xfe",
        b"[]",
        b"null",
        b"{}",
        b'{"expected_last_seq": 1}',
        b'{"events": []}',
        b'{"expected_last_seq": "1", "events": []}',
        b'{"expected_last_seq": -1, "events": [%s]}' % envelope,
        b'{"expected_last_seq": 1, "events": []}',
        b'{"expected_last_seq": 1, "events": {}}',
        b'{"expected_last_seq": 1, "events": [%s], "extra": true}' % envelope,
        b'{"expected_last_seq": 1, "expected_last_seq": 2, "events": [%s]}' % envelope,
        b'{"expected_last_seq": 1, "events": [%s' % envelope,
    ]
    for data in garbage:
        reply = await request(nc, subject, data)
        assert not reply.ok and reply.error is not None, data
        assert reply.error.kind == "invalid" and reply.error.message, data
    # a subject whose loop id is not a UUID
    reply = await request(nc, committer.names.commit("not-a-uuid"), body(0, envelope))
    assert reply.error is not None and (reply.error.kind, reply.error.field) == ("invalid", "loop_id")
    # a request without a reply subject is dropped without harm
    await nc.publish(subject, b"garbage")
    assert len(await stored(nc, committer, loop_id)) == 1
    await assert_serving(nc, committer, loop_id)


async def test_oversized_event_is_too_large(nc: NATS, settings: Settings) -> None:
    small = Settings.from_env({}, nats_urls=settings.nats_urls, prefix=settings.prefix, max_record_bytes=4096)
    async with running_committer(small):
        client = CommitClient(nc, small.names, T)
        loop_id, last = await started_loop(nc, small)
        t = new_id()
        fits = make(StepDone, loop_id=loop_id, turn_id=t, step_id=new_id(), messages=[ai_text("x" * 3500)])
        res = await client.commit(loop_id, last, [fits])
        big = make(StepDone, loop_id=loop_id, turn_id=t, step_id=new_id(), messages=[ai_text("x" * 5000)])
        with pytest.raises(TooLargeError) as err:
            await client.commit(loop_id, res.last_seq, [step(loop_id, t), big], max_record_bytes=1 << 20)
        assert err.value.body.index == 1
        assert len(await stored(nc, small, loop_id)) == 2


async def test_racing_writers_exactly_one_wins(committer: Settings, nc: NATS) -> None:
    loop_id, last = await started_loop(nc, committer)
    client = CommitClient(nc, committer.names, T)
    t = new_id()
    wins: list[int] = []
    conflicts: list[ErrorBody] = []

    async def writer(i: int) -> None:
        try:
            wins.append((await client.commit(loop_id, last, [step(loop_id, t, f"writer {i}")])).last_seq)
        except ConflictError as e:
            conflicts.append(e.body)

    async with anyio.create_task_group() as tg:
        for i in range(8):
            tg.start_soon(writer, i)
    assert len(wins) == 1 and len(conflicts) == 7
    assert all(c.last_seq == wins[0] for c in conflicts)
    assert [s for s, _, _ in await stored(nc, committer, loop_id)] == [last, wins[0]]


async def test_retry_of_a_stored_commit_answers_the_original_seqs(committer: Settings, nc: NATS) -> None:
    loop_id, last = await started_loop(nc, committer)
    client = CommitClient(nc, committer.names, T)
    one = [step(loop_id, new_id())]
    first = await client.commit(loop_id, last, one)
    assert await client.commit(loop_id, last, one) == first
    batch = text_turn(loop_id)
    res = await client.commit(loop_id, first.last_seq, batch)
    assert len(res.seqs) == 3 and res.seqs == list(range(res.seqs[0], res.seqs[0] + 3))
    # retried twice, also after the loop moved on: the original sequences, nothing stored again
    assert await client.commit(loop_id, first.last_seq, batch) == res
    after = await client.commit(loop_id, res.last_seq, [step(loop_id, new_id())])
    assert await client.commit(loop_id, first.last_seq, batch) == res
    assert await client.commit(loop_id, last, one) == first
    records = await stored(nc, committer, loop_id)
    assert [s for s, _, _ in records] == [last, *first.seqs, *res.seqs, after.last_seq]
    assert len({mid for _, _, mid in records}) == len(records)


async def test_reused_event_id_with_other_content_is_refused(committer: Settings, nc: NATS) -> None:
    loop_id, last = await started_loop(nc, committer)
    client = CommitClient(nc, committer.names, T)
    original = step(loop_id, new_id(), "original")
    await client.commit(loop_id, last, [original])
    forged = msgspec.structs.replace(original, messages=[ai_text("forged")])
    with pytest.raises(InvalidRequestError) as err:
        await client.commit(loop_id, last, [forged])
    assert err.value.body.field == "event_id"
    assert len(await stored(nc, committer, loop_id)) == 2


async def test_multi_event_commit_is_all_or_nothing(committer: Settings, nc: NATS) -> None:
    loop_id, last = await started_loop(nc, committer)
    subject = committer.names.commit(loop_id)
    turn = [encode_event(e) for e in text_turn(loop_id)]
    bad = invalid_step_json(loop_id, [])
    reply = await request(nc, subject, body(last, turn[0], bad, turn[2]))
    assert reply.error is not None and (reply.error.kind, reply.error.index) == ("invalid", 1)
    # the same event twice in one commit
    reply = await request(nc, subject, body(last, turn[0], turn[0]))
    assert reply.error is not None and (reply.error.field, reply.error.index) == ("event_id", 1)
    # a stale expected sequence refuses the whole batch
    reply = await request(nc, subject, body(last - 1 if last > 1 else last + 100, *turn))
    assert reply.error is not None and reply.error.kind == "conflict" and reply.error.last_seq == last
    assert len(await stored(nc, committer, loop_id)) == 1
    ok = await request(nc, subject, body(last, *turn))
    assert ok.ok and ok.seqs is not None and len(ok.seqs) == 3
    assert [s for s, _, _ in await stored(nc, committer, loop_id)] == [last, *ok.seqs]


async def test_events_are_stored_canonically(committer: Settings, nc: NATS) -> None:
    """Whitespace or key order in the request does not matter: the stored record is the canonical encoding."""
    loop_id, last = await started_loop(nc, committer)
    e = step(loop_id, new_id())
    canonical = encode_event(e)
    spaced = json.dumps(dict(reversed(list(json.loads(canonical).items()))), indent=2).encode()
    reply = await request(nc, committer.names.commit(loop_id), body(last, spaced))
    assert reply.ok
    assert (await stored(nc, committer, loop_id))[-1][1:] == (canonical, e.event_id)


async def test_a_chained_commit_stores_one_by_one_and_stops_where_another_writer_came_between(
    committer: Settings, nc: NATS
) -> None:
    loop_id, last = await started_loop(nc, committer)
    client = CommitClient(nc, committer.names, T)
    turn = text_turn(loop_id)
    res = await client.commit(loop_id, last, turn, chain=True)
    assert len(res.seqs) == 3 and res.last_seq == res.seqs[-1]
    # A retry (the reply was lost) finds every record stored, the loop having moved on or not.
    assert await client.commit(loop_id, last, turn, chain=True) == res
    # Stored in part (the committer stopped after the first) and retried: the rest is stored.
    second = text_turn(loop_id, index=2)
    first = await client.commit(loop_id, res.last_seq, second[:1])
    rest = await client.commit(loop_id, res.last_seq, second, chain=True)
    assert rest.seqs[0] == first.last_seq and len(rest.seqs) == 3
    # Another writer got in after the first record: the chain stops there, what was stored answers.
    third = text_turn(loop_id, index=3)
    head = await client.commit(loop_id, rest.last_seq, third[:1])
    other = await client.commit(loop_id, head.last_seq, [step(loop_id, third[0].turn_id, "another writer")])
    cut = await client.commit(loop_id, rest.last_seq, third, chain=True)
    assert cut.seqs == head.seqs and cut.last_seq == head.last_seq
    # A conflict on the first record is a conflict, as for any commit.
    with pytest.raises(ConflictError) as err:
        await client.commit(loop_id, rest.last_seq, text_turn(loop_id, index=4), chain=True)
    assert err.value.body.last_seq == other.last_seq
    seqs = [s for s, _, _ in await stored(nc, committer, loop_id)]
    assert seqs == [last, *res.seqs, *rest.seqs, head.last_seq, other.last_seq]
