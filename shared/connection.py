"""The NATS client loopwire connects with, and request/reply with one reply inbox per connection.

:class:`Connection` is nats-py's ``Client`` with a cheaper message-header block in both directions:
the same header lines on the wire and the same dict out of them, built and parsed with a few
string operations per header instead of nats-py's per-header regex match, strips, translations
and bytearray extends, and its per-character whitespace scan of every received name. A tool call
carries ten headers, which made header handling most of a message's client cost (docs/benchmarks.md).

:class:`Connection` also hands the replies of a reply inbox (:func:`subscribe_quick`) to their
waiting task straight from its read loop, instead of through a task of the subscription's own,
kicks its flusher without a new future per kick, and sends a flush's PING behind the commands
already waiting (nats-py writes it ahead of them, so a flush right after a subscribe could end
before the server had the subscription).

:func:`request` is ``Client.request`` without its per-request work that a busy service pays on
every commit: a NUID and random bytes for the reply token (here a counter), and ``asyncio.wait_for``
(here one timer). Replies come to one wildcard inbox subscription per connection, made on first
use. It raises what ``Client.request`` raises (``nats.errors.TimeoutError``,
``NoRespondersError``), so callers handle both alike; ``Connection.request`` is this function, so
nats-py's own JetStream and key-value calls on a connection take it too.
:func:`request_resending` sends an idempotent request again while no reply comes, so a queue-group
member that died holding it costs a resend pause, not the timeout.

A :class:`Connection` that closes wakes everything still waiting on it (a flush, a request) with
``ConnectionClosedError``: nats-py leaves them to their timeouts (10 s for a flush, 5 s for a
JetStream call), which a service stopping without its broker would otherwise wait out one by one.
:func:`live_connections` lists the process's connections, so a stop can close those whose server is
gone (:func:`services.lifecycle.let_go_of_silent`).
"""

from __future__ import annotations

import asyncio
import math
import re
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import nats.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.protocol import command

from shared.subjects import H_STATUS

_HDR_LINE: Final = b"NATS/1.0\r\n"
_CRLF: Final = b"\r\n"
# A header name nats-py accepts (an RFC 7230 token).
_NAME: Final = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
# What str.isspace() finds in an ASCII name: nats-py drops such a received header.
_SPACE_IN_NAME: Final = re.compile(rb"[\t\n\x0b\x0c\r\x1c-\x1f ]")
_NO_RESPONDERS: Final = "503"
_PING: Final = b"PING\r\n"
# The pause before another copy of a request whose every copy reached nobody (request_resending).
_LOST_BACKOFF_FIRST: Final = 0.02
_LOST_BACKOFF_CAP: Final = 0.25


class Connection(Client):
    """nats-py's client with a cheaper header block and direct reply delivery (module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        # "Name: " for every name sent so far (services send a handful of names, over and over).
        self._names: dict[str, bytes] = {}
        self._direct: dict[int, Callable[[Msg], None]] = {}
        self._kick: asyncio.Future[None] | None = None
        _live.add(self)

    async def _close(self, status: int, do_cbs: bool = True) -> None:
        try:
            await super()._close(status, do_cbs)
        finally:  # also when the close itself is cut short (a stalled server takes no bytes)
            if self.is_closed:
                self._wake_waiters()

    def _wake_waiters(self) -> None:
        # Nothing can answer them any more; nats-py would leave each to its own timeout.
        for pong in self._pongs:
            _fail(pong)
        self._pongs.clear()
        inbox = _inboxes.get(self)
        if inbox is not None:
            inbox.fail_all()

    async def subscribe_direct(self, subject: str, handler: Callable[[Msg], None], *, queue: str = "") -> Subscription:
        """A subscription whose messages ``handler`` takes in the read loop itself.

        For handlers that only hand the message on (a reply to its waiting task, a request to a task
        of its own): nats-py queues every message of a subscription for a task of the
        subscription's own, which then calls the callback, so each message woke one task more than
        it needs. ``handler`` must be quick and must not raise.
        """
        sub = await self.subscribe(subject, queue=queue)  # no callback: nats-py starts no task for it
        self._direct[sub._id] = handler
        return sub

    async def _process_msg(self, sid: int, subject: bytes, reply: bytes, data: bytes, headers: bytes) -> None:
        handler = self._direct.get(sid)
        if handler is None or sid not in self._subs:
            if handler is not None:
                del self._direct[sid]  # unsubscribed
            await super()._process_msg(sid, subject, reply, data, headers)
            return
        self.stats["in_msgs"] += 1
        self.stats["in_bytes"] += len(data)
        hdr = await self._process_headers(headers) if headers else None
        handler(self._build_message(sid, subject, reply, data, hdr))

    def _header_block(self, headers: Mapping[str, Any]) -> bytes:
        parts = [_HDR_LINE]
        for k, v in headers.items():
            prefix = self._names.get(k)
            if prefix is None:
                key = k.strip()
                if not key:
                    continue  # nats-py skips an empty name
                if not _NAME.fullmatch(key):
                    raise nats.errors.BadHeaderError(key)
                prefix = self._names[k] = key.encode() + b": "
            value = v.strip()
            if "\r" in value or "\n" in value:
                # A value can never end the header line: CR and LF become spaces, as nats-py does.
                value = value.replace("\r", " ").replace("\n", " ")
            parts.append(prefix + value.encode() + _CRLF)
        parts.append(_CRLF)
        return b"".join(parts)

    async def request(
        self,
        subject: str,
        payload: bytes = b"",
        timeout: float = 0.5,
        old_style: bool = False,
        headers: dict[str, Any] | None = None,
    ) -> Msg:
        """:func:`request` (nats-py's own JetStream and KV calls come through here too)."""
        if old_style:
            return await super().request(subject, payload, timeout, old_style, headers)
        return await request(self, subject, payload, timeout=timeout, headers=headers)

    async def _send_publish(
        self, subject: str, reply: str, payload: bytes, payload_size: int, headers: Mapping[str, Any] | None
    ) -> None:
        if headers is None:
            await super()._send_publish(subject, reply, payload, payload_size, None)
            return
        if subject == "":
            raise nats.errors.BadSubjectError
        self.stats["out_msgs"] += 1
        self.stats["out_bytes"] += payload_size
        await self._send_command(command.hpub_cmd(subject, reply, self._header_block(headers), payload))
        if self._flush_queue is not None and self._flush_queue.empty():
            await self._flush_pending()

    async def _send_ping(self, future: asyncio.Future[Any] | None = None) -> None:
        # nats-py writes a PING straight to the socket, ahead of commands still waiting for the
        # flusher (a SUB just made): the PONG that ends flush() could then come back before the
        # server had the subscription, and a request sent right after found no responders (3 to 5
        # in 300 subscribe-flush-request rounds). Queued behind them, the PONG means they arrived.
        self._pongs.append(future if future is not None else asyncio.get_running_loop().create_future())
        await self._send_command(_PING)
        await self._flush_pending()

    async def _flush_pending(self, force_flush: bool = False) -> Any:
        # The flusher task writes whatever is pending when it takes an item off its queue and sets
        # the item's result unless already set. nats-py queues a new future per kick (creating one
        # looks up the running loop, and its pid, every time); nothing awaits a kick's future, so
        # one that is already done serves every kick.
        queue, flusher = self._flush_queue, self._flusher_task
        plain = queue is not None and flusher is not None and not flusher.done() and queue.empty()
        if force_flush or not plain or not self.is_connected:
            return await super()._flush_pending(force_flush)
        kick = self._kick
        if kick is None:
            kick = self._kick = asyncio.get_running_loop().create_future()
            kick.set_result(None)
        assert queue is not None
        queue.put_nowait(kick)
        return None

    @staticmethod
    def _parse_header_lines(raw: bytes) -> dict[str, str]:
        # What nats-py's parser returns for the same lines: names stripped and ASCII without
        # whitespace (others are dropped), values stripped and decoded with replacement.
        out: dict[str, str] = {}
        for line in raw.split(_CRLF):
            name, sep, value = line.partition(b":")
            if not sep:
                continue
            name = name.strip()
            if not name.isascii() or _SPACE_IN_NAME.search(name):
                continue
            out[name.decode()] = value.strip().decode("utf-8", "replace")
        return out


class _Replies:
    """The replies of one :func:`request_many`, up to the one its ``last`` says ends them."""

    __slots__ = ("done", "last", "msgs")

    def __init__(self, last: Callable[[Msg], bool], done: asyncio.Future[None]) -> None:
        self.msgs: list[Msg] = []
        self.last = last
        self.done = done

    def add(self, msg: Msg) -> bool:
        """Take one reply; True once the last has come."""
        self.msgs.append(msg)
        if self.last(msg):
            if not self.done.done():
                self.done.set_result(None)
            return True
        return False


class _Copies:
    """The replies to the copies of one :func:`request_resending`: the first real reply, and how many
    copies were sent and answered "no responders" (reached nobody)."""

    __slots__ = ("lost", "reply", "sent", "wake")

    def __init__(self, wake: asyncio.Future[None]) -> None:
        self.reply: Msg | None = None
        self.sent = 0
        self.lost = 0
        self.wake = wake

    def add(self, msg: Msg) -> bool:
        if msg.headers and msg.headers.get(H_STATUS) == _NO_RESPONDERS:
            self.lost += 1
            if self.lost < self.sent:
                return True  # another copy may still be answered
        elif self.reply is None:
            self.reply = msg
        self.wake_up()
        return True

    def wake_up(self) -> None:
        if not self.wake.done():
            self.wake.set_result(None)


class _Inbox:
    """The replies of one connection's requests: one wildcard subscription, a future per request
    (or a list, for a request with several replies)."""

    def __init__(self, nc: Client) -> None:
        self.nc = nc
        self.prefix = nc.new_inbox() + "."
        self.waiting: dict[str, asyncio.Future[Msg] | _Replies | _Copies] = {}
        self.started = False
        self.count = 0
        self._lock = asyncio.Lock()

    async def start(self) -> None:
        async with self._lock:
            if not self.started:
                await subscribe_quick(self.nc, self.prefix + "*", self._on_reply)
                self.started = True

    def token(self) -> str:
        self.count += 1
        return str(self.count)

    def fail_all(self) -> None:
        """The connection closed: every waiting request raises ``ConnectionClosedError`` now."""
        for waiter in self.waiting.values():
            if isinstance(waiter, asyncio.Future):
                _fail(waiter)
            elif isinstance(waiter, _Replies):
                _fail(waiter.done)
            else:
                _fail(waiter.wake)

    def _on_reply(self, msg: Msg) -> None:
        token = msg.subject[len(self.prefix) :]
        waiter = self.waiting.get(token)
        if waiter is None:
            return
        if not isinstance(waiter, asyncio.Future):
            if waiter.add(msg):
                del self.waiting[token]
            return
        del self.waiting[token]
        if not waiter.done():
            waiter.set_result(msg)


async def subscribe_quick(nc: Client, subject: str, handler: Callable[[Msg], None], *, queue: str = "") -> Subscription:
    """Subscribe a handler that only hands each message on (a reply inbox, a request dispatcher):
    taken in the read loop itself on a :class:`Connection`, through a callback task on any other
    nats-py client. ``handler`` must be quick and must not raise."""
    if isinstance(nc, Connection):
        return await nc.subscribe_direct(subject, handler, queue=queue)

    async def cb(msg: Msg) -> None:
        handler(msg)

    return await nc.subscribe(subject, queue=queue, cb=cb)


_inboxes: weakref.WeakKeyDictionary[Client, _Inbox] = weakref.WeakKeyDictionary()
_live: weakref.WeakSet[Connection] = weakref.WeakSet()


def live_connections() -> list[Connection]:
    """This process's connections that are up or trying to get back up (never a closed one)."""
    return [nc for nc in list(_live) if nc.is_connected or nc.is_reconnecting]


def _fail(waiter: asyncio.Future[Any]) -> None:
    if not waiter.done():
        waiter.set_exception(nats.errors.ConnectionClosedError())
        # Marked as seen: a waiter nobody awaits any more (a ping's) would be logged at collection.
        waiter.exception()


def _expire(waiter: asyncio.Future[Msg]) -> None:
    if not waiter.done():
        waiter.set_exception(nats.errors.TimeoutError)


async def _inbox_of(nc: Client) -> _Inbox:
    inbox = _inboxes.get(nc)
    if inbox is None:
        inbox = _inboxes[nc] = _Inbox(nc)
    if not inbox.started:
        await inbox.start()
    return inbox


async def request(
    nc: Client, subject: str, payload: bytes, *, timeout: float, headers: Mapping[str, str] | None = None
) -> Msg:
    """One request and its first reply, like ``nc.request`` (see the module docstring)."""
    inbox = await _inbox_of(nc)
    token = inbox.token()
    loop = asyncio.get_running_loop()
    waiter: asyncio.Future[Msg] = loop.create_future()
    inbox.waiting[token] = waiter
    timer = loop.call_later(timeout, _expire, waiter)
    try:
        await nc.publish(subject, payload, reply=inbox.prefix + token, headers=dict(headers) if headers else None)
        msg = await waiter
    finally:
        timer.cancel()
        inbox.waiting.pop(token, None)
    if msg.headers and msg.headers.get(H_STATUS) == _NO_RESPONDERS:
        raise nats.errors.NoRespondersError
    return msg


async def request_resending(
    nc: Client,
    subject: str,
    payload: bytes,
    *,
    timeout: float,
    resend: Sequence[float],
    grace: float,
    headers: Mapping[str, str] | None = None,
) -> Msg:
    """A request for an idempotent service in a queue group, sent again unchanged while no reply comes:
    copy k+1 goes out ``resend[k]`` seconds after copy k, and the first reply to any copy is the answer.

    A member that died holding a copy never answers, and its interest left with its connection, so
    the next copy reaches a live member; a slow member's reply still counts when it comes. A copy
    answered "no responders" reached nobody: while every copy so far did, another is sent after a
    short backoff for up to ``grace`` seconds (a service that just started may not have its interest
    known to our server yet), then ``NoRespondersError``. ``nats.errors.TimeoutError`` when no reply
    came within ``timeout``. The first copy costs what :func:`request` does.
    """
    inbox = await _inbox_of(nc)
    loop = asyncio.get_running_loop()
    start = loop.time()
    deadline = start + timeout
    hdrs = dict(headers) if headers else None
    copies = _Copies(loop.create_future())
    gaps = iter(resend)
    gap = next(gaps, math.inf)
    backoff = _LOST_BACKOFF_FIRST
    tokens: list[str] = []
    try:
        while True:
            token = inbox.token()
            tokens.append(token)
            inbox.waiting[token] = copies
            copies.sent += 1
            await nc.publish(subject, payload, reply=inbox.prefix + token, headers=hdrs)
            sent_at = loop.time()
            while True:
                timer = loop.call_later(min(sent_at + gap, deadline) - loop.time(), copies.wake_up)
                try:
                    await copies.wake
                finally:
                    timer.cancel()
                if copies.reply is not None:
                    return copies.reply
                copies.wake = loop.create_future()
                now = loop.time()
                if copies.lost == copies.sent:  # every copy reached nobody
                    if now - start >= min(grace, timeout):
                        raise nats.errors.NoRespondersError
                    await asyncio.sleep(backoff)
                    backoff = min(_LOST_BACKOFF_CAP, 2 * backoff)
                    break
                if now >= deadline:
                    raise nats.errors.TimeoutError
                if now >= sent_at + gap:
                    gap = next(gaps, math.inf)
                    break
            if copies.reply is not None:
                return copies.reply
    finally:
        for token in tokens:
            inbox.waiting.pop(token, None)


async def request_many(
    nc: Client, subject: str, payload: bytes, *, last: Callable[[Msg], bool], idle: float
) -> list[Msg]:
    """One request and its replies, up to and including the one ``last`` says ends them (e.g. a
    Direct Get batch's end-of-batch status); ``nats.errors.TimeoutError`` when none comes for
    ``idle`` seconds. The connection's reply inbox takes them: no subscription of its own."""
    inbox = await _inbox_of(nc)
    token = inbox.token()
    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    replies = inbox.waiting[token] = _Replies(last, done)
    try:
        await nc.publish(subject, payload, reply=inbox.prefix + token)
        seen = -1
        while not done.done():
            if seen == len(replies.msgs):
                raise nats.errors.TimeoutError
            seen = len(replies.msgs)
            await asyncio.wait((done,), timeout=idle)
        done.result()  # ConnectionClosedError when the connection closed meanwhile
    finally:
        inbox.waiting.pop(token, None)
    return replies.msgs
