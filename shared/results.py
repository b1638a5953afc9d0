"""Durable step plans and tool-call records: what makes a re-run step never run a finished call again.

Both live in the KV bucket ``<prefix>_results`` of the loop's shard (replicated like the streams,
TTL ``LW_RESULTS_TTL_SECONDS``, longer than any step stays uncommitted), so every read and write
names its loop:

* ``step.<step_id>`` → :class:`StepPlan`, written by the model-step (and acknowledged by JetStream)
  before the first call of a step is sent. A step that runs again after its model-step died finds
  the plan and continues it instead of asking the model again — a model answers differently each
  time, and its tool-use ids name the calls (``tool_execution_id`` derives from them).
* ``tool.<tool>.<execution_id>`` → :class:`CallRecord`, written by the tool worker: ``started``
  before a tool that is neither read-only nor idempotent begins (so a call that may have run is
  known as such), then ``done`` with the tool's result before the worker sends it. A call cut by its
  deadline or canceled is never ``done``: whether it had its effect is unknown.

Reads are leader reads (``STREAM.MSG.GET`` by last subject), so a record acknowledged on one server
is seen from any other at once, also on a replicated bucket.

A record nobody waits for (a read-only tool's ``done``, written alongside its reply) can be written
with :meth:`ResultStore.record_call_nowait`: published with a reply subject on one inbox of the
store's, its ack checked in a callback — no task, future or timer per write. A write that is not
acknowledged (no responders, an error ack, no ack within the request timeout) is handed back to its
writer, which writes it again the awaited way (:meth:`ResultStore.record_call`, with its retries).
"""

from __future__ import annotations

import contextlib
import hashlib
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Final, TypeVar

import msgspec
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from shared.backoff import retry
from shared.events import SuspendedStep
from shared.jserrors import JetStreamError, JetStreamUnavailableError
from shared.publish import check_payload, js_publish, parse_ack
from shared.streamreads import get_msg
from shared.subjects import H_STATUS, Names, kv_stream

STARTED: Final = "started"
DONE: Final = "done"
# How long a record write or read retries while JetStream is unavailable (a leader election).
RETRY_SECONDS: Final = 10.0
_REQUEST_TIMEOUT: Final = 2.0

T = TypeVar("T")


class StepPlan(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A step's model decision, recorded before any of its calls is sent."""

    v: int = 1
    loop_id: str
    turn_id: str
    step_id: str
    step: SuspendedStep


class CallRecord(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One tool call's durable state. ``reply`` is the worker's final reply body (JSON) once done."""

    v: int = 1
    tool: str
    execution_id: str
    args_digest: str
    state: str  # started | done
    worker_id: str = ""
    started_ms: int = 0
    reply_kind: str = ""  # result | error
    reply: msgspec.Raw = msgspec.field(default_factory=lambda: msgspec.Raw(b"null"))


def args_digest(args: bytes) -> str:
    """The argument digest a record is keyed with: BLAKE2b-128 of the argument bytes, hex."""
    return hashlib.blake2b(args, digest_size=16).hexdigest()


def now_ms() -> int:
    return int(time.time() * 1000)


_plan_decoder = msgspec.json.Decoder(StepPlan)
_record_decoder = msgspec.json.Decoder(CallRecord)
_encoder = msgspec.json.Encoder()


NotAcked = Callable[[str, CallRecord], None]
"""Takes an unawaited write that was not acknowledged: (its loop id, the record)."""


class ResultStore:
    """Reads and writes of each shard's ``<prefix>_results`` over raw JetStream requests."""

    def __init__(self, nc: NATS, names: Names, *, retry_seconds: float = RETRY_SECONDS) -> None:
        self.nc = nc
        self.names = names
        self.retry_seconds = retry_seconds
        # Unawaited writes (record_call_nowait): ack token -> (give up at, loop id, record), oldest first.
        self._unacked: OrderedDict[str, tuple[float, str, CallRecord]] = OrderedDict()
        self._acks: Subscription | None = None
        self._ack_prefix = ""
        self._ack_seq = 0
        self._not_acked: NotAcked = lambda loop_id, record: None

    def bucket_of(self, loop_id: str) -> str:
        """The results bucket of the loop's shard."""
        return self.names.results_bucket_of(self.names.shard_of(loop_id))

    def _subject(self, loop_id: str, key: str) -> str:
        return f"$KV.{self.bucket_of(loop_id)}.{key}"

    @staticmethod
    def plan_key(step_id: str) -> str:
        return f"step.{step_id}"

    @staticmethod
    def call_key(tool: str, execution_id: str) -> str:
        return f"tool.{tool}.{execution_id}"

    async def _retrying(self, request: Callable[[], Awaitable[T]]) -> T:
        """``request()``, retried while JetStream is unavailable for up to ``retry_seconds``."""
        return await retry(request, on=JetStreamUnavailableError, first=0.05, cap=0.5, within=self.retry_seconds)

    async def _get(self, loop_id: str, key: str) -> bytes | None:
        stream, subject = kv_stream(self.bucket_of(loop_id)), self._subject(loop_id, key)
        m = await self._retrying(
            lambda: get_msg(self.nc, stream, last_by_subj=subject, request_timeout=_REQUEST_TIMEOUT)
        )
        return m.data if m is not None and m.data else None

    async def _put(self, loop_id: str, key: str, value: bytes) -> None:
        subject = self._subject(loop_id, key)
        await self._retrying(lambda: js_publish(self.nc, subject, value, {}, request_timeout=_REQUEST_TIMEOUT))

    async def plan(self, step_id: str, *, loop_id: str) -> StepPlan | None:
        data = await self._get(loop_id, self.plan_key(step_id))
        return _plan_decoder.decode(data) if data else None

    async def record_plan(self, plan: StepPlan) -> None:
        await self._put(plan.loop_id, self.plan_key(plan.step_id), _encoder.encode(plan))

    async def call(self, tool: str, execution_id: str, *, loop_id: str) -> CallRecord | None:
        """The record of a call the loop ``loop_id`` made (its ``Lw-Loop-Id``)."""
        data = await self._get(loop_id, self.call_key(tool, execution_id))
        return _record_decoder.decode(data) if data else None

    async def record_call(self, record: CallRecord, *, loop_id: str) -> None:
        await self._put(loop_id, self.call_key(record.tool, record.execution_id), _encoder.encode(record))

    # --- unawaited writes ------------------------------------------------------------------------

    async def open_acks(self, not_acked: NotAcked) -> None:
        """Make :meth:`record_call_nowait` usable; ``not_acked`` gets each write that was not
        acknowledged (called on the event loop, from a callback: it must not block)."""
        self._not_acked = not_acked
        if self._acks is None:
            self._ack_prefix = self.nc.new_inbox() + "."
            self._acks = await self.nc.subscribe(self._ack_prefix + "*", cb=self._on_ack)

    async def close_acks(self) -> None:
        """Stop following acks; writes still unacknowledged are handed to ``not_acked``."""
        sub, self._acks = self._acks, None
        if sub is not None:
            with contextlib.suppress(Exception):  # a closed connection: nothing more can arrive anyway
                await sub.unsubscribe()
        self.expire_unacked(float("inf"))

    @property
    def unacked(self) -> int:
        """Unawaited writes whose ack has not come yet."""
        return len(self._unacked)

    async def record_call_nowait(self, record: CallRecord, *, loop_id: str) -> None:
        """Publish ``record`` without waiting for its ack (see the module's docstring).

        Never raises: a write that cannot be published goes to ``not_acked`` at once. Does not
        suspend unless the connection's outgoing buffer is full.
        """
        if self._acks is None:
            self._not_acked(loop_id, record)
            return
        self._ack_seq += 1
        token = str(self._ack_seq)
        data = _encoder.encode(record)
        self._unacked[token] = (time.monotonic() + _REQUEST_TIMEOUT, loop_id, record)
        try:
            check_payload(self.nc, data, {})
            subject = self._subject(loop_id, self.call_key(record.tool, record.execution_id))
            await self.nc.publish(subject, data, reply=self._ack_prefix + token)
        except Exception:  # closed, reconnecting with a full buffer, too large: the awaited way decides
            self._unacked.pop(token, None)
            self._not_acked(loop_id, record)

    def expire_unacked(self, now: float) -> None:
        """Hand every write whose ack is overdue at ``now`` (monotonic) to ``not_acked``."""
        while self._unacked:
            token, (give_up, loop_id, record) = next(iter(self._unacked.items()))
            if give_up > now:
                return
            del self._unacked[token]
            self._not_acked(loop_id, record)

    async def _on_ack(self, msg: Msg) -> None:
        entry = self._unacked.pop(msg.subject[len(self._ack_prefix) :], None)
        if entry is None:  # overdue and handed on already
            return
        try:
            if (msg.headers or {}).get(H_STATUS):  # "no responders": nothing stored it
                raise JetStreamUnavailableError("no responders")
            parse_ack(msg.data)
        except (JetStreamError, JetStreamUnavailableError):
            self._not_acked(entry[1], entry[2])
