"""Verifiable histories: every record the committer stores is chained to the one before it
(``Lw-Chain-Index`` / ``Lw-Digest-Prev`` / ``Lw-Digest``), checked here with hashlib from the
documented rule alone, and ``loopwire verify`` finds what a tamperer did to a stream. Real
nats-server, in-process committers."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import AsyncIterator

import anyio
import pytest
from nats.aio.client import Client as NATS

from services.cli import main
from shared.client import CommitClient, LoopClient
from shared.codec import encode_event
from shared.connect import connect
from shared.settings import Settings
from shared.streamreads import StoredMsg, direct_get_batch
from shared.streams import ensure_all
from shared.verify import verify_all, verify_loop
from tests import natsfixtures
from tests.integration.committer_fixtures import (
    input_submitted,
    loop_started,
    new_id,
    running_committer,
    text_turn,
)

pytestmark = pytest.mark.anyio
T = 10.0
GENESIS = "0" * 64


def sha(index: int, prev: str, payload: bytes) -> str:
    """The documented digest (docs/protocol.md), spelled out without loopwire's code."""
    return hashlib.sha256(f"{index}\n{prev}\n".encode() + payload).hexdigest()


async def records(nc: NATS, settings: Settings, loop_id: str) -> list[StoredMsg]:
    from shared import shards

    home = await shards.home_of(nc, settings.names, loop_id)
    out: list[StoredMsg] = []
    start = 1
    while True:
        b = await direct_get_batch(nc, home.stream, home.subject, start_seq=start)
        out += b.messages
        if not b.messages or b.num_pending == 0:
            return out
        start = b.messages[-1].seq + 1


def assert_chained(msgs: list[StoredMsg], *, index: int = 0, prev: str = GENESIS) -> None:
    """Every record of ``msgs`` follows the one before it, after (``index``, ``prev``)."""
    assert msgs
    for m in msgs:
        index += 1
        assert m.headers["Lw-Chain-Index"] == str(index), m.seq
        assert m.headers["Lw-Digest-Prev"] == prev, m.seq
        assert m.headers["Lw-Digest"] == sha(index, prev, m.data), m.seq
        prev = m.headers["Lw-Digest"]


async def a_loop_with_turns(nc: NATS, settings: Settings, turns: int = 1) -> str:
    api, commits = LoopClient(nc, settings.names, T), CommitClient(nc, settings.names, T)
    loop_id = (await api.start()).loop_id
    for k in range(turns):
        res = await api.input(loop_id, f"question {k}")
        await commits.commit(loop_id, res.seq, text_turn(loop_id, k + 1, command_id=res.command_id))
    return loop_id


async def verify_cli(capsys: pytest.CaptureFixture[str], settings: Settings, *args: str) -> tuple[int, list[str]]:
    """``loopwire verify ARGS``: its exit status and output lines (the CLI runs its own event loop)."""
    capsys.readouterr()
    argv = ["--nats-url", settings.nats_urls[0], "--prefix", settings.prefix, "verify", *args]
    code = await anyio.to_thread.run_sync(main, argv)
    return code, capsys.readouterr().out.splitlines()


@pytest.fixture
async def committer(settings: Settings) -> AsyncIterator[Settings]:
    async with running_committer(settings):
        yield settings


async def test_every_record_is_chained_through_commands_steps_and_chains(committer: Settings, nc: NATS) -> None:
    """Loop API records, a step's atomic batch and a chain commit all continue one chain."""
    api, commits = LoopClient(nc, committer.names, T), CommitClient(nc, committer.names, T)
    loop_id = await a_loop_with_turns(nc, committer, turns=2)
    res = await api.input(loop_id, "one by one")
    chained = await commits.commit(loop_id, res.seq, text_turn(loop_id, 3, command_id=res.command_id), chain=True)
    assert len(chained.seqs) == 3
    await api.close(loop_id)
    msgs = await records(nc, committer, loop_id)
    assert len(msgs) == 1 + 2 * 4 + 4 + 1
    assert_chained(msgs)
    report = await verify_loop(nc, committer.names, loop_id)
    assert report.ok and report.loops[loop_id].chained == len(msgs) and report.summary()["unchained"] == 0


async def test_two_committers_at_once_and_a_restarted_one_keep_one_chain(nc: NATS, settings: Settings) -> None:
    """The link comes from the stored record the OCC check is against, never from memory alone."""
    api = LoopClient(nc, settings.names, T)
    async with running_committer(settings), running_committer(settings):
        loop_id = (await api.start()).loop_id
        for i in range(12):  # the queue group spreads them over both committers
            await api.input(loop_id, f"message {i}")
    async with running_committer(settings):  # a fresh one knows nothing: it reads the tip back
        await api.input(loop_id, "after the restart")
    assert_chained(await records(nc, settings, loop_id))


async def test_verify_finds_a_changed_record_a_gap_and_a_broken_chain(
    committer: Settings, nc: NATS, capsys: pytest.CaptureFixture[str]
) -> None:
    """Records published straight into the stream, bypassing the committer, are each found once.
    (History streams refuse message deletes, so a lost record is a record skipping chain indices.)"""
    clean = await a_loop_with_turns(nc, committer)
    loop_id = await a_loop_with_turns(nc, committer)
    js = nc.jetstream()
    subject = committer.names.hist(loop_id)
    last = (await records(nc, committer, loop_id))[-1]
    index, prev = int(last.headers["Lw-Chain-Index"]), last.headers["Lw-Digest"]
    real = encode_event(input_submitted(loop_id, "what was asked"))
    forged = real.replace(b"what was asked", b"something else")

    def stamp(i: int, p: str, d: str) -> dict[str, str]:
        return {"Lw-Chain-Index": str(i), "Lw-Digest-Prev": p, "Lw-Digest": d}

    # changed: the headers of the real record, with other content
    changed = await js.publish(subject, forged, headers=stamp(index + 1, prev, sha(index + 1, prev, real)))
    d1 = sha(index + 1, prev, real)
    # broken: a self-consistent record chained to a digest that is not its predecessor's
    other = encode_event(input_submitted(loop_id, "b"))
    broken = await js.publish(subject, other, headers=stamp(index + 2, GENESIS, sha(index + 2, GENESIS, other)))
    d2 = sha(index + 2, GENESIS, other)
    # gap: two records missing after it
    third = encode_event(input_submitted(loop_id, "c"))
    gap = await js.publish(subject, third, headers=stamp(index + 5, d2, sha(index + 5, d2, third)))
    assert d1 != d2

    code, lines = await verify_cli(capsys, committer, loop_id)
    assert code == 1
    problems = [ln for ln in lines if not ln.startswith(("ok", "FAILED"))]
    assert len(problems) == 3, lines
    assert problems[0].startswith("changed") and f"seq {changed.seq}:" in problems[0]
    assert problems[1].startswith("broken") and f"seq {broken.seq}:" in problems[1]
    assert problems[2].startswith("gap") and f"seq {gap.seq}:" in problems[2] and "2 record(s) missing" in problems[2]
    assert lines[-1].startswith("FAILED") and "3 problem(s) (1 gap, 1 changed, 1 broken)" in lines[-1]

    code, lines = await verify_cli(capsys, committer, "--all", "--json")
    assert code == 1
    docs = [json.loads(ln) for ln in lines]
    assert [(d["problem"], d["seq"]) for d in docs[:-1]] == [
        ("changed", changed.seq),
        ("broken", broken.seq),
        ("gap", gap.seq),
    ]
    assert docs[-1]["summary"]["loops"] == 2 and docs[-1]["summary"]["ok"] is False

    code, lines = await verify_cli(capsys, committer, clean)
    assert code == 0 and lines[-1].startswith("ok: 1 stream(s), 1 loop(s), 5 record(s) verified"), lines


async def test_records_from_before_digests_are_unchained_and_the_chain_starts_after_them(
    committer: Settings, nc: NATS, capsys: pytest.CaptureFixture[str]
) -> None:
    """A deployment from before digests: its records carry none. They are reported as unchained
    (not corrupt), and the next record the committer stores starts the chain at index 1."""
    loop_id = new_id()
    old = [encode_event(loop_started(loop_id)), encode_event(input_submitted(loop_id, "old question"))]
    js = nc.jetstream()
    for payload in old:  # what the committer stored before this change: no chain headers
        await js.publish(committer.names.hist(loop_id), payload)
    await LoopClient(nc, committer.names, T).input(loop_id, "new question")
    msgs = await records(nc, committer, loop_id)
    assert all("Lw-Digest" not in m.headers for m in msgs[:2])
    assert_chained(msgs[2:])
    code, lines = await verify_cli(capsys, committer, loop_id)
    assert code == 0, lines
    assert lines[0].startswith("unchained") and "2 record(s)" in lines[0] and "written before digests" in lines[0]
    assert lines[-1].startswith("ok:") and "2 record(s) unchained (written before digests)" in lines[-1]
    # A record without digest after the chain began is not "old": it breaks the chain.
    tampered = await js.publish(committer.names.hist(loop_id), encode_event(input_submitted(loop_id, "x")))
    code, lines = await verify_cli(capsys, committer, loop_id)
    assert code == 1 and lines[0].startswith("broken") and f"seq {tampered.seq}:" in lines[0], lines


async def test_a_fork_continues_its_source_chain_at_the_fork_point(committer: Settings, nc: NATS) -> None:
    api = LoopClient(nc, committer.names, T)
    source = await a_loop_with_turns(nc, committer, turns=2)
    src = await records(nc, committer, source)
    point = src[4]  # the first turn's TurnDone: a fork point
    assert b'"TurnDone"' in point.data
    forked = await api.fork(source, at=point.seq, input="another question")
    msgs = await records(nc, committer, forked.loop_id)
    assert b'"LoopForked"' in msgs[0].data
    assert_chained(msgs, index=int(point.headers["Lw-Chain-Index"]), prev=point.headers["Lw-Digest"])
    again = await api.fork(forked.loop_id)  # a fork of a fork
    assert_chained(
        await records(nc, committer, again.loop_id),
        index=int(msgs[-1].headers["Lw-Chain-Index"]),
        prev=msgs[-1].headers["Lw-Digest"],
    )
    report = await verify_all(nc, committer.names)
    assert report.ok and len(report.loops) == 3, [p.line() for p in report.problems]
    # A fork's first record that does not continue its source is a broken chain.
    bad = await records(nc, committer, forked.loop_id)
    js = nc.jetstream()
    fake = dataclasses.replace(committer, prefix=committer.prefix + "x")
    await ensure_all(js, fake)
    first = bad[0]
    h = {"Lw-Chain-Index": "1", "Lw-Digest-Prev": GENESIS, "Lw-Digest": sha(1, GENESIS, first.data)}
    await js.publish(fake.names.hist(forked.loop_id), first.data, headers=h)
    report = await verify_all(nc, fake.names)
    assert [p.kind for p in report.problems] == ["broken"] and "source" in report.problems[0].detail


async def test_verify_all_covers_every_shard_and_a_missing_stream(
    nats_url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LW_SHARDS", "3")  # the CLI's
    settings = Settings.from_env({}, nats_urls=(nats_url,), prefix=natsfixtures.unique_prefix(), shards=3)
    nc = await connect(settings, name="test")
    try:
        async with running_committer(settings):
            loops: dict[int, str] = {}
            while len(loops) < 3:
                loop_id = await a_loop_with_turns(nc, settings)
                loops.setdefault(settings.names.shard_of(loop_id), loop_id)
            code, lines = await verify_cli(capsys, settings, "--all")
            assert code == 0 and lines[-1].startswith("ok: 3 stream(s)"), lines
            report = await verify_all(nc, settings.names)
            assert {c.stream for c in report.loops.values()} == {settings.names.history_stream_of(k) for k in range(3)}
            # Shard 2: a changed record.
            target = loops[2]
            last = (await records(nc, settings, target))[-1]
            await nc.jetstream().publish(
                settings.names.hist_in(2, target),
                b'{"type":"InputSubmitted"}',
                headers={
                    "Lw-Chain-Index": str(int(last.headers["Lw-Chain-Index"]) + 1),
                    "Lw-Digest-Prev": last.headers["Lw-Digest"],
                    "Lw-Digest": GENESIS,
                },
            )
        await nc.jetstream().delete_stream(settings.names.history_stream_of(1))  # a stream that did not recover
        code, lines = await verify_cli(capsys, settings, "--all")
        assert code == 1
        assert any(ln.startswith("changed") and target in ln for ln in lines), lines
        missing = settings.names.history_stream_of(1)
        assert any(ln.startswith("stream") and missing in ln and "missing" in ln for ln in lines), lines
        assert "3 stream(s)" in lines[-1] and "2 problem(s)" in lines[-1]
    finally:
        await nc.close()


async def test_a_commit_reads_nothing_back_when_a_committer_stored_the_record_before(
    nc: NATS, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The previous link is known where the last sequence is known: no stream read per commit, also
    with two committers taking a loop's commits in turn (each tells the other the links it stored);
    one read (of the record the OCC check names) after a restart."""
    from services.committer import chaintips
    from shared import streamreads

    reads: list[int] = []
    real_get = streamreads.get_msg

    async def counted(*args: object, **kwargs: object) -> object:
        reads.append(int(kwargs["seq"]))  # type: ignore[call-overload]
        return await real_get(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(chaintips, "get_msg", counted)
    api, commits = LoopClient(nc, settings.names, T), CommitClient(nc, settings.names, T)
    async with running_committer(settings), running_committer(settings):
        loop_id = (await api.start()).loop_id
        last = 0
        for k in range(10):
            res = await api.input(loop_id, f"q{k}")
            last = res.seq
            for event in text_turn(loop_id, k + 1, command_id=res.command_id):  # one commit per record
                last = (await commits.commit(loop_id, last, [event])).last_seq
        # (a tip can lose the race with the next request: then that commit reads the record)
        assert len(reads) <= 3, f"{len(reads)} reads for 40 records over two committers"
    reads.clear()
    async with running_committer(settings):  # restarted: one read of the loop's last record, then none
        more = await api.input(loop_id, "again")
        await commits.commit(loop_id, more.seq, text_turn(loop_id, 11, command_id=more.command_id)[:1])
        assert reads == [last]
    assert_chained(await records(nc, settings, loop_id))


async def test_a_message_deleted_from_a_history_stream_is_a_gap(nc: NATS, settings: Settings) -> None:
    """History streams refuse deletes (deny_delete), so this stream is made without it, as a store
    that lost a message would look: the loop's chain skips an index, and the stream counts a deletion."""
    from shared.chain import START, chain_headers
    from shared.streams import history_stream_config

    config = history_stream_config(settings)
    config.deny_delete = False
    js = nc.jetstream()
    await js.add_stream(config)
    loop_id = new_id()
    payloads = [encode_event(loop_started(loop_id)), *(encode_event(input_submitted(loop_id, t)) for t in "abc")]
    headers, _ = chain_headers(START, payloads)
    acks = [
        await js.publish(settings.names.hist(loop_id), p, headers=h) for p, h in zip(payloads, headers, strict=True)
    ]
    assert (await verify_loop(nc, settings.names, loop_id)).ok
    await js.delete_msg(config.name, acks[2].seq)  # JetStream's message delete
    report = await verify_all(nc, settings.names)
    assert [(p.kind, p.loop_id, p.seq) for p in report.problems] == [("gap", "", 0), ("gap", loop_id, acks[3].seq)]
    assert "1 message(s) deleted" in report.problems[0].detail
    assert "1 record(s) missing" in report.problems[1].detail
