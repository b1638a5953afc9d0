"""Exactly-once appends to a loop's history subject: OCC, de-duplication, retries, resolution.

One record → one publish with ``Nats-Expected-Last-Subject-Sequence`` + ``Nats-Msg-Id``; several →
one atomic batch (OCC on the first message, a msg-id on every message). Transient failures
(no responders, timeouts, leader elections, in-flight proposals) are retried with the same headers
until ``commit_retry_seconds`` run out. A rejection that may mean "already stored" (10071 on R1,
10201 for batches) is resolved with leader reads: if the first record on the subject after the
expected sequence carries our first msg-id, the append had happened and its sequences are
returned; otherwise it is a real conflict.

Every record also gets its chain headers (:mod:`shared.chain`): chained to the stored record at
``expected_last_seq`` (:mod:`.chaintips`), or, for a fork's first record, to its source's record
at the fork point. A retry carries the same headers: they follow from the same stored record.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Final

import msgspec
from nats.aio.client import Client as NATS
from nats.aio.subscription import Subscription

from shared import metrics, shards
from shared.backoff import Backoff
from shared.chain import Link, chain_headers, link_after
from shared.errors import ErrorKind
from shared.jserrors import (
    ERR_BATCH_DUPLICATE_MSG_ID,
    ERR_MSG_TOO_LARGE,
    ERR_WRONG_LAST_SEQUENCE,
    JetStreamError,
    JetStreamUnavailableError,
    PayloadTooLargeError,
)
from shared.protocol import WireError
from shared.publish import js_publish, publish_batch
from shared.shards import Home
from shared.streamreads import StoredMsg, get_msg
from shared.subjects import H_EXPECTED_LAST_SUBJECT_SEQ, H_EXPECTED_STREAM, H_MSG_ID, Names

from .chaintips import ChainTips

log = logging.getLogger("loopwire.committer.append")

REQUEST_TIMEOUT: Final = 2.0
_BACKOFF_FIRST: Final = 0.05
_BACKOFF_MAX: Final = 0.5


class EventIdTaken(WireError):
    """An event id of the append is already stored with other content: a reused id, or a loop-API
    command repeated after it was stored (its derived ids are the same, its timestamp is not)."""

    def __init__(self, msg_id: str, seq: int, index: int | None = None) -> None:
        where = {} if index is None else {"index": index}
        super().__init__(
            ErrorKind.INVALID,
            f"event_id {msg_id} is already stored (seq {seq}) with different content",
            field="event_id",
            rule="is invalid",
            **where,
        )


class Appender:
    """Appends records to the loop's history subject in its shard's stream (OCC is the fence; the
    chain tips kept are only a speed-up)."""

    def __init__(self, nc: NATS, names: Names, *, retry_seconds: float) -> None:
        self._nc = nc
        self._names = names
        self._retry_seconds = retry_seconds
        self._tips = ChainTips(nc, names)

    async def listen(self) -> Subscription:
        """Hear the chain tips other committers tell (see :mod:`.chaintips`)."""
        return await self._tips.listen()

    async def link_at(self, loop_id: str, seq: int) -> Link:
        """The chain link of the loop's stored record at ``seq`` (a fork's point in its source)."""
        try:
            home = await shards.home_of(self._nc, self._names, loop_id)
            return await self._tips.link_at(loop_id, home, seq)
        except (JetStreamError, JetStreamUnavailableError) as e:
            raise WireError(ErrorKind.UNAVAILABLE, f"cannot read the loop's record at {seq}: {e}") from None

    @property
    def stream(self) -> str:
        """The history streams' name in spans: shard 0's, which names the family."""
        return self._names.history_stream_of(0)

    async def append(
        self,
        loop_id: str,
        expected_last_seq: int,
        payloads: Sequence[bytes],
        msg_ids: Sequence[str],
        *,
        chain_from: Link | None = None,
    ) -> list[int]:
        """Store ``payloads`` right after ``expected_last_seq``; return their stream sequences.

        ``chain_from``: the link a new loop's first record chains to (a fork's source at its point).

        Raises :class:`WireError` of kind ``conflict`` (with ``last_seq``), ``unavailable`` or
        ``too_large``. Never leaves part of a multi-record append in the stream.
        """
        try:
            home = await shards.home_of(self._nc, self._names, loop_id)
        except (JetStreamError, JetStreamUnavailableError) as e:
            raise WireError(ErrorKind.UNAVAILABLE, f"cannot find the loop's history stream: {e}") from None
        subject, stream = home.subject, home.stream
        headers: list[dict[str, str]] = []
        tip: Link | None = None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._retry_seconds
        backoff = Backoff(_BACKOFF_FIRST, _BACKOFF_MAX, deadline=deadline)
        last_problem = "no attempt made"
        while True:
            remaining = deadline - loop.time()
            timeout = max(0.2, min(REQUEST_TIMEOUT, remaining))
            try:
                if tip is None:
                    after = chain_from
                    if after is None or expected_last_seq:
                        after = await self._tips.link_at(loop_id, home, expected_last_seq, request_timeout=timeout)
                    headers, tip = _headers(after, expected_last_seq, stream, payloads, msg_ids)
                if len(payloads) == 1:
                    ack = await js_publish(self._nc, subject, payloads[0], headers[0], request_timeout=timeout)
                    if ack.duplicate:
                        await self._check_duplicate(loop_id, stream, ack.seq, payloads[0], msg_ids[0], timeout)
                    else:
                        _count(payloads)
                        await self._tips.stored(loop_id, ack.seq, tip)
                    return [ack.seq]
                ack = await publish_batch(self._nc, subject, payloads, headers, request_timeout=timeout)
                _count(payloads)
                await self._tips.stored(loop_id, ack.seq, tip)
                # An atomic batch is applied as one unit: its records have consecutive sequences.
                return list(range(ack.seq - len(payloads) + 1, ack.seq + 1))
            except JetStreamError as e:
                if e.err_code in (ERR_WRONG_LAST_SEQUENCE, ERR_BATCH_DUPLICATE_MSG_ID):
                    try:
                        return await self._resolve(loop_id, home, expected_last_seq, payloads, msg_ids, timeout)
                    except JetStreamUnavailableError as u:
                        last_problem = str(u)
                    except JetStreamError as r:
                        if not r.retryable:
                            raise WireError(ErrorKind.UNAVAILABLE, f"cannot read back the loop: {r}") from None
                        last_problem = str(r)
                elif e.err_code == ERR_MSG_TOO_LARGE:
                    raise WireError(ErrorKind.TOO_LARGE, e.description) from None
                elif e.retryable:
                    last_problem = str(e)
                else:
                    raise WireError(ErrorKind.UNAVAILABLE, f"JetStream refused the append: {e}") from None
            except JetStreamUnavailableError as e:
                last_problem = str(e)
            except PayloadTooLargeError as e:
                raise WireError(ErrorKind.TOO_LARGE, str(e)) from None
            if not backoff.fits():
                raise WireError(
                    ErrorKind.UNAVAILABLE,
                    f"history unavailable for {self._retry_seconds:g}s ({last_problem}); "
                    "retrying the same commit is safe",
                )
            log.debug("append to %s retried: %s", subject, last_problem)
            metrics.inc(metrics.APPENDS_RETRIED)
            await backoff.sleep()

    async def append_chain(
        self, loop_id: str, expected_last_seq: int, payloads: Sequence[bytes], msg_ids: Sequence[str]
    ) -> list[int]:
        """Store ``payloads`` one by one, each right after the one before it; their sequences.

        Every record is a single append of its own (so a retry finds each stored one as such). The
        storing stops at the first record whose expected sequence fails: the sequences of the ones
        stored before it are returned (a conflict on the first is raised, as for any append).
        """
        seqs: list[int] = []
        expected = expected_last_seq
        for payload, msg_id in zip(payloads, msg_ids, strict=True):
            try:
                [seq] = await self.append(loop_id, expected, [payload], [msg_id])
            except WireError as e:
                if seqs and e.kind is ErrorKind.CONFLICT:
                    break
                raise
            seqs.append(seq)
            expected = seq
        return seqs

    async def _check_duplicate(
        self, loop_id: str, stream: str, seq: int, payload: bytes, msg_id: str, request_timeout: float
    ) -> None:
        """A de-duplicated publish: make sure the stored record is this very event (not an id reuse)."""
        stored = await get_msg(self._nc, stream, seq=seq, request_timeout=request_timeout)
        if stored is not None and stored.msg_id == msg_id and stored.data != payload:
            raise EventIdTaken(msg_id, seq)
        if stored is not None:
            self._tips.put(loop_id, seq, link_after(stored.headers))  # the stored one's, wherever it was

    async def _resolve(
        self,
        loop_id: str,
        home: Home,
        expected_last_seq: int,
        payloads: Sequence[bytes],
        msg_ids: Sequence[str],
        request_timeout: float,
    ) -> list[int]:
        """Was this append already stored? Its sequences if so; a ``conflict`` WireError if not."""
        timeout = request_timeout
        stream, subject = home.stream, home.subject
        seqs: list[int] = []
        tip: StoredMsg | None = None
        at = expected_last_seq + 1
        for k, mid in enumerate(msg_ids):
            m = await get_msg(self._nc, stream, seq=at, next_by_subj=subject, request_timeout=timeout)
            if m is None or m.msg_id != mid:
                if k == 0:
                    break
                # A prefix of a batch cannot be stored alone; anything else is corruption.
                raise WireError(ErrorKind.UNAVAILABLE, f"history of {subject} holds a partial append at {at}")
            if m.data != payloads[k]:
                raise EventIdTaken(mid, m.seq, k)
            seqs.append(m.seq)
            tip = m
            at = m.seq + 1
        if tip is not None:
            self._tips.put(loop_id, tip.seq, link_after(tip.headers))
        if seqs:
            log.info("append to %s was already stored at %s (retry resolved)", subject, seqs)
            return seqs
        last = await get_msg(self._nc, stream, last_by_subj=subject, request_timeout=timeout)
        last_seq = last.seq if last is not None else 0
        raise WireError(
            ErrorKind.CONFLICT,
            f"expected last sequence {expected_last_seq}, the loop's last sequence is {last_seq}",
            last_seq=last_seq,
        )


def _headers(
    after: Link, expected_last_seq: int, stream: str, payloads: Sequence[bytes], msg_ids: Sequence[str]
) -> tuple[list[dict[str, str]], Link]:
    """Every record's headers (msg-id, chain; OCC on the first) and the last record's link."""
    headers, tip = chain_headers(after, payloads)
    for k, (h, mid) in enumerate(zip(headers, msg_ids, strict=True)):
        h[H_MSG_ID] = mid
        if k == 0:
            h[H_EXPECTED_LAST_SUBJECT_SEQ] = str(expected_last_seq)
            h[H_EXPECTED_STREAM] = stream
    return headers, tip


class _Type(msgspec.Struct):
    type: str = ""


_type_decoder: Final = msgspec.json.Decoder(_Type)


def _count(payloads: Sequence[bytes]) -> None:
    """Count appended records by type (a batch's duplicate is all-or-nothing: counted once)."""
    if metrics.ENABLED:
        metrics.committed(_type_decoder.decode(p).type for p in payloads)
