"""shared.connection against a real server: headers arrive as nats-py's own client sends them, and
request() answers, times out and reports no responders like Client.request."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import string
from collections.abc import Awaitable, Callable

import anyio
import nats
import nats.errors
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg

from services.lifecycle import let_go_of_silent
from shared.connect import connect
from shared.connection import Connection, request, request_many, request_resending
from shared.natsserver import NatsServer
from shared.settings import Settings
from tests import natsfixtures

pytestmark = pytest.mark.anyio

TRICKY: list[dict[str, str]] = [
    {},
    {"Lw-Loop-Id": "9b00269b-4ea3-4a9d-84e6-af3286effdf7", "Lw-Deadline": "1764748800000"},
    {" Padded ": "  value with spaces  ", "Tab": "\tx\t"},
    {"Multi": "line\r\nbreak\rand\nmore", "Only-Cr": "\r", "Empty": ""},
    {"Unicode": "héllo ✓ 日本", "": "skipped", "  ": "skipped too"},
    {"Colon": "a: b: c", "Dup-Case": "1", "dup-case": "2"},
]


def _random_headers(rng: random.Random) -> dict[str, str]:
    name_chars = string.ascii_letters + string.digits + "!#$%&'*+-.^_`|~"
    value_chars = string.printable + "é✓\x00"
    return {
        "".join(rng.choices(name_chars, k=rng.randint(1, 12))): "".join(rng.choices(value_chars, k=rng.randint(0, 30)))
        for _ in range(rng.randint(1, 6))
    }


async def test_headers_arrive_as_nats_py_sends_them(settings: Settings) -> None:
    plain = await nats.connect(settings.nats_urls[0])
    ours = await connect(settings)
    assert isinstance(ours, Connection)
    got: dict[str, list[dict[str, str] | None]] = {"plain": [], "ours": []}

    async def on(msg: Msg) -> None:
        got[msg.subject.rsplit(".", 1)[-1]].append(msg.headers)

    sub = await plain.subscribe(f"{settings.prefix}.hdr.*", cb=on)
    await plain.flush()  # the subscription is known to the server before the other connection publishes
    rng = random.Random(7)
    cases = TRICKY + [_random_headers(rng) for _ in range(200)]
    try:
        for h in cases:
            await plain.publish(f"{settings.prefix}.hdr.plain", b"x", headers=h or None)
            await ours.publish(f"{settings.prefix}.hdr.ours", b"x", headers=h or None)
        for bad in ({"Bad Name": "v"}, {"Bad:Name": "v"}, {"Bäd": "v"}):
            for client in (plain, ours):
                with pytest.raises(nats.errors.BadHeaderError):
                    await client.publish(f"{settings.prefix}.hdr.never", b"x", headers=bad)
        await plain.flush()
        await ours.flush()
        with anyio.fail_after(10):
            while len(got["ours"]) < len(cases) or len(got["plain"]) < len(cases):
                await anyio.sleep(0.02)
        assert got["ours"] == got["plain"]
    finally:
        await sub.unsubscribe()
        await plain.close()
        await ours.close()


@pytest.mark.parametrize("direct", [True, False], ids=["connection", "plain-nats-py"])
async def test_request_answers_times_out_and_reports_no_responders(settings: Settings, direct: bool) -> None:
    # Replies go straight from the read loop on a Connection, through a callback task on any
    # other nats-py client: the same answers either way.
    responder: Client = await connect(settings)
    caller: Client = await connect(settings) if direct else await nats.connect(settings.nats_urls[0])
    subject = f"{settings.prefix}.svc"

    async def echo(msg: Msg) -> None:
        if msg.data == b"silent":
            return
        await anyio.sleep(0.05 if msg.data.endswith(b"0") else 0)  # later requests overtake earlier ones
        await msg.respond(msg.data + b"!" + (msg.headers or {}).get("H", "").encode())

    await responder.subscribe(subject, cb=echo)
    await responder.flush()
    try:
        replies: dict[int, bytes] = {}

        async def one(i: int) -> None:
            replies[i] = (await request(caller, subject, str(i).encode(), timeout=5, headers={"H": f"h{i}"})).data

        async with anyio.create_task_group() as tg:
            for i in range(40):
                tg.start_soon(one, i)
        assert replies == {i: f"{i}!h{i}".encode() for i in range(40)}

        with pytest.raises(nats.errors.TimeoutError):
            await request(caller, subject, b"silent", timeout=0.2)
        with pytest.raises(nats.errors.NoRespondersError):
            await request(caller, f"{settings.prefix}.nobody", b"x", timeout=5)
        with anyio.move_on_after(0.1):  # a cancelled request leaves nothing waiting behind
            await request(caller, subject, b"silent", timeout=5)
        assert (await request(caller, subject, b"after", timeout=5)).data == b"after!"
    finally:
        await responder.close()
        await caller.close()


async def test_a_direct_subscription_takes_messages_in_order_until_unsubscribed(settings: Settings) -> None:
    conn = await connect(settings)
    assert isinstance(conn, Connection)
    got: list[bytes] = []
    sub = await conn.subscribe_direct(f"{settings.prefix}.direct", lambda m: got.append(m.data))
    other: list[bytes] = []

    async def on_other(msg: Msg) -> None:
        other.append(msg.data)

    await conn.subscribe(f"{settings.prefix}.other", cb=on_other)
    try:
        for i in range(100):
            await conn.publish(f"{settings.prefix}.direct", str(i).encode(), headers={"N": str(i)} if i % 2 else None)
            await conn.publish(f"{settings.prefix}.other", str(i).encode())
        await conn.flush()
        with anyio.fail_after(5):
            while len(got) < 100 or len(other) < 100:
                await anyio.sleep(0.01)
        assert got == [str(i).encode() for i in range(100)]
        await sub.unsubscribe()
        await conn.publish(f"{settings.prefix}.direct", b"late")
        await conn.flush()
        await anyio.sleep(0.1)
        assert got[-1] == b"99" and len(other) == 100
    finally:
        await conn.close()


@pytest.mark.parametrize("direct", [True, False], ids=["connection", "plain-nats-py"])
async def test_request_many_takes_replies_up_to_the_last_and_times_out_only_when_they_stop(
    settings: Settings, direct: bool
) -> None:
    responder: Client = await connect(settings)
    caller: Client = await connect(settings) if direct else await nats.connect(settings.nats_urls[0])
    subject = f"{settings.prefix}.many"

    async def stream(msg: Msg) -> None:
        n, gap, end = msg.data.split(b",")
        for i in range(int(n)):
            await responder.publish(msg.reply, b"%d" % i)
            await anyio.sleep(float(gap))
        if end == b"end":
            await responder.publish(msg.reply, b"end")

    await responder.subscribe(subject, cb=stream)
    await responder.flush()

    def last(m: Msg) -> bool:
        return m.data == b"end"

    try:
        got = await request_many(caller, subject, b"5,0,end", last=last, idle=2)
        assert [m.data for m in got] == [b"0", b"1", b"2", b"3", b"4", b"end"]
        # Replies 0.3 s apart with an idle limit of 0.5 s: slow, but never stopped.
        got = await request_many(caller, subject, b"4,0.3,end", last=last, idle=0.5)
        assert len(got) == 5
        with anyio.fail_after(5), pytest.raises(nats.errors.TimeoutError):
            await request_many(caller, subject, b"2,0,none", last=last, idle=0.3)
        # Two at once get each their own replies.
        a, b = await asyncio.gather(
            request_many(caller, subject, b"3,0.01,end", last=last, idle=2),
            request_many(caller, subject, b"2,0.01,end", last=last, idle=2),
        )
        assert (len(a), len(b)) == (4, 3)
    finally:
        await responder.close()
        await caller.close()


async def test_a_flush_after_subscribing_means_the_server_has_the_subscription(settings: Settings) -> None:
    # A request sent from another connection right after subscribe() + flush() finds the responder:
    # the flush's PING goes out behind the SUB, not ahead of it.
    responder = await connect(settings)
    caller = await nats.connect(settings.nats_urls[0])

    async def echo(msg: Msg) -> None:
        await msg.respond(b"ok")

    try:
        missed = 0
        for i in range(1000):
            sub = await responder.subscribe(f"{settings.prefix}.ready.{i}", cb=echo)
            await responder.flush()
            try:
                await caller.request(f"{settings.prefix}.ready.{i}", b"", timeout=5)
            except nats.errors.NoRespondersError:
                missed += 1
            await sub.unsubscribe()
        assert missed == 0
    finally:
        await responder.close()
        await caller.close()


async def test_a_resent_request_reaches_a_live_member_when_the_first_dies_holding_it(settings: Settings) -> None:
    # Two members of a queue group; the one that gets the first copy dies without answering (its
    # connection closes, as with a SIGKILL): the next copy is answered by the other, one resend later.
    caller = await connect(settings)
    subject = f"{settings.prefix}.svc"
    got: dict[str, list[float]] = {"doomed": [], "live": []}
    doomed = await connect(settings)
    live = await connect(settings)
    loop = asyncio.get_running_loop()

    async def swallow(msg: Msg) -> None:
        got["doomed"].append(loop.time())
        await doomed.close()

    async def answer(msg: Msg) -> None:
        got["live"].append(loop.time())
        await msg.respond(b"live:" + msg.data)

    await doomed.subscribe(subject, queue="q", cb=swallow)
    await live.subscribe(subject, queue="q", cb=answer)
    await doomed.flush()
    await live.flush()
    try:
        for i in range(40):  # until the doomed member has taken (and died holding) a first copy
            t0 = loop.time()
            reply = await request_resending(caller, subject, str(i).encode(), timeout=5, resend=(0.3, 5), grace=1)
            assert reply.data == f"live:{i}".encode()
            if got["doomed"]:
                assert 0.3 <= loop.time() - t0 < 1.5, "answered by the next copy, not after the timeout"
                break
        assert got["doomed"], "the queue group never routed a copy to the member that dies"
    finally:
        await live.close()
        await caller.close()


async def test_a_slow_reply_to_an_earlier_copy_is_the_answer_and_copies_stop_at_the_schedule(
    settings: Settings,
) -> None:
    caller = await connect(settings)
    responder = await connect(settings)
    subject = f"{settings.prefix}.slow"
    copies: list[bytes] = []

    async def slow_first(msg: Msg) -> None:
        copies.append(msg.data)
        if len(copies) == 1:
            await anyio.sleep(0.5)  # the first copy is answered after two more were sent
            await msg.respond(b"first")

    await responder.subscribe(subject, cb=slow_first)
    await responder.flush()
    try:
        reply = await request_resending(caller, subject, b"x", timeout=5, resend=(0.1, 0.2), grace=1)
        assert reply.data == b"first"
        assert copies == [b"x", b"x", b"x"], "one copy per pause of the schedule, then none"
        with pytest.raises(nats.errors.TimeoutError):  # nobody answers any copy
            await request_resending(caller, f"{settings.prefix}.slow", b"y", timeout=0.8, resend=(0.1,), grace=1)
        t0 = asyncio.get_running_loop().time()
        with pytest.raises(nats.errors.NoRespondersError):  # every copy reached nobody, for the grace
            await request_resending(caller, f"{settings.prefix}.nobody", b"z", timeout=5, resend=(1,), grace=0.5)
        assert 0.5 <= asyncio.get_running_loop().time() - t0 < 2
    finally:
        await responder.close()
        await caller.close()


async def test_a_stop_closes_a_connection_whose_server_is_silent_and_what_waited_on_it_ends(
    nats_server: NatsServer,
) -> None:
    # nats-py leaves a flush or a request on a closed connection to its timeout; closed, they end at
    # once, so a stop that closes a silent server's connection does not wait them out.
    settings = Settings.from_env({}, nats_urls=(nats_server.url,), prefix=natsfixtures.unique_prefix())
    nc = await connect(settings, name="silent")
    subject = f"{settings.prefix}.silent"
    await nc.subscribe(subject)  # an interest that never answers
    await nc.flush()
    assert nats_server.proc is not None
    os.kill(nats_server.proc.pid, signal.SIGSTOP)
    calls: dict[str, Callable[[], Awaitable[object]]] = {
        "flush": lambda: nc.flush(timeout=10),
        "request": lambda: request(nc, subject, b"", timeout=10),
        "request_many": lambda: request_many(nc, subject, b"", last=lambda _: False, idle=10),
        "request_resending": lambda: request_resending(nc, subject, b"", timeout=10, resend=(5,), grace=1),
    }
    outcomes: dict[str, str] = {}

    async def wait(name: str, call: Callable[[], Awaitable[object]]) -> None:
        try:
            await call()
        except nats.errors.ConnectionClosedError:
            outcomes[name] = "closed"
        except Exception as e:
            outcomes[name] = repr(e)

    try:
        started = anyio.current_time()
        with anyio.fail_after(5):
            async with anyio.create_task_group() as waiting:
                for name, call in calls.items():
                    waiting.start_soon(wait, name, call)
                async with anyio.create_task_group() as stopping:
                    stopping.start_soon(lambda: let_go_of_silent(within=0.5))
                    while not nc.is_closed:
                        await anyio.sleep(0.02)
                    stopping.cancel_scope.cancel()
        took = anyio.current_time() - started
        assert outcomes == dict.fromkeys(calls, "closed")
        assert took < 2, f"{took:.1f}s"
    finally:
        os.kill(nats_server.proc.pid, signal.SIGCONT)
        await nc.close()


async def test_a_stop_leaves_a_connection_whose_server_answers(settings: Settings) -> None:
    nc = await connect(settings, name="answered")
    try:
        with anyio.move_on_after(1.5):
            await let_go_of_silent(within=0.5)
        assert nc.is_connected
    finally:
        await nc.close()
