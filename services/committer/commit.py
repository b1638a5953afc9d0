"""The commit protocol: ``lw.commit.<loop_id>`` → validate every event, append, reply.

Nothing is written unless every event of the request is a valid, enduring, v1 event of this loop
that fits the size limit; then they are appended as one unit (see :mod:`.appender`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Final

from services.reconcile import CommitterReconciler
from shared import metrics, telemetry
from shared.codec import decode_event_to_store
from shared.errors import (
    EphemeralNotPersistableError,
    ErrorKind,
    InvalidEventError,
    LoopwireError,
    RecordTooLargeError,
    Rule,
    UnknownEventTypeError,
    UnsupportedSchemaError,
)
from shared.events import Event
from shared.protocol import CommitReply, CommitRequest, WireError, decode_request, encode
from shared.validate import is_uuid

from .appender import Appender

MAX_EVENTS_PER_COMMIT: Final = 1000  # the server's atomic-batch limit
MAX_SEQ: Final = 2**63 - 1  # largest expected_last_seq accepted (stream sequences are far below it)


@dataclass(frozen=True, slots=True)
class Prepared:
    """Validated events of one commit and their canonical envelopes (what gets stored)."""

    events: list[Event]
    payloads: list[bytes]
    event_ids: list[str]


def event_error(e: LoopwireError, index: int) -> WireError:
    """The structured error of one event that failed to decode, validate or encode."""
    if isinstance(e, InvalidEventError):
        return WireError(ErrorKind.INVALID, str(e), event=e.event, field=e.field, rule=e.rule, index=index)
    if isinstance(e, EphemeralNotPersistableError):
        return WireError(
            ErrorKind.INVALID, str(e), event=e.type_name, field="type", rule=Rule.INVALID.value, index=index
        )
    if isinstance(e, UnknownEventTypeError):
        return WireError(
            ErrorKind.INVALID, str(e), event=e.type_name, field="type", rule=Rule.UNKNOWN_TYPE.value, index=index
        )
    if isinstance(e, UnsupportedSchemaError):
        return WireError(ErrorKind.INVALID, str(e), field="v", rule=Rule.INVALID.value, index=index)
    if isinstance(e, RecordTooLargeError):
        return WireError(ErrorKind.TOO_LARGE, str(e), index=index)
    return WireError(ErrorKind.INVALID, f"event {index}: {e}", index=index)


def prepare(loop_id: str, raws: list[bytes], *, max_input_bytes: int, max_record_bytes: int) -> Prepared:
    """Decode, validate and canonically re-encode every event; raise :class:`WireError` on the first bad one."""
    if not raws:
        raise WireError(ErrorKind.INVALID, "events must not be empty", field="events", rule=Rule.REQUIRED.value)
    if len(raws) > MAX_EVENTS_PER_COMMIT:
        raise WireError(
            ErrorKind.TOO_LARGE, f"{len(raws)} events in one commit; at most {MAX_EVENTS_PER_COMMIT}", field="events"
        )
    events: list[Event] = []
    payloads: list[bytes] = []
    ids: list[str] = []
    seen: set[str] = set()
    for i, raw in enumerate(raws):
        try:
            # Store the canonical encoding: a retried commit compares equal byte for byte. (Decoding
            # found every tool_use input strict JSON: that is this commit's one check of them.)
            event, payload = decode_event_to_store(raw, max_bytes=max_input_bytes, max_record_bytes=max_record_bytes)
            if event.loop_id != loop_id:
                raise InvalidEventError(type(event).__name__, "loop_id", Rule.INVALID.value)
        except LoopwireError as e:
            raise event_error(e, i) from None
        if event.event_id in seen:
            raise WireError(
                ErrorKind.INVALID,
                f"event_id {event.event_id} appears twice in one commit",
                event=type(event).__name__,
                field="event_id",
                rule=Rule.INVALID.value,
                index=i,
            )
        seen.add(event.event_id)
        events.append(event)
        payloads.append(payload)
        ids.append(event.event_id)
    return Prepared(events=events, payloads=payloads, event_ids=ids)


class CommitHandler:
    def __init__(
        self,
        appender: Appender,
        *,
        max_input_bytes: int,
        max_record_bytes: int,
        work: CommitterReconciler | None = None,
    ) -> None:
        self._appender = appender
        self._work = work
        self._max_input = max_input_bytes
        self._max_record = max_record_bytes
        self._span_name = f"append {appender.stream}"
        self._span_attributes = {
            telemetry.MESSAGING_SYSTEM: "nats",
            telemetry.MESSAGING_OPERATION: "append",
            telemetry.MESSAGING_DESTINATION: appender.stream,
        }

    async def handle(self, subject: str, data: bytes) -> bytes:
        """The reply to one commit request (never raises for bad input)."""
        started = time.perf_counter()
        with telemetry.span(self._span_name, kind="server", attributes=self._span_attributes) as span:
            try:
                seqs = await self._commit(subject, data)
            except WireError as e:
                metrics.inc(metrics.COMMIT_ERRORS, str(e.kind))
                telemetry.set_error(span, str(e.kind), str(e))
                return encode(CommitReply(ok=False, error=e.body()))
            span.set_attribute(telemetry.MESSAGING_BATCH_COUNT, len(seqs))
            span.set_attribute(telemetry.LW_STREAM_SEQ, seqs[-1])
            metrics.observe(metrics.COMMIT_SECONDS, time.perf_counter() - started, "committer")
        return encode(CommitReply(ok=True, seqs=seqs, last_seq=seqs[-1]))

    async def _commit(self, subject: str, data: bytes) -> list[int]:
        loop_id = subject.rsplit(".", 1)[-1]
        if not is_uuid(loop_id):
            raise WireError(ErrorKind.INVALID, f"loop id {loop_id!r} in the subject is not a UUID", field="loop_id")
        try:
            req = decode_request(data, CommitRequest)
        except WireError as outer:
            # Not strict JSON: name the offending event when it is inside one, else the request.
            try:
                lax = decode_request(data, CommitRequest, check_duplicates=False)
            except WireError:
                raise outer from None
            self._prepare(loop_id, lax)
            raise outer from None
        if not 0 <= req.expected_last_seq <= MAX_SEQ:
            # (a sequence past JetStream's uint64 range would otherwise fail the read-back as "unavailable")
            raise WireError(
                ErrorKind.INVALID, f"expected_last_seq must be between 0 and {MAX_SEQ}", field="expected_last_seq"
            )
        prepared = self._prepare(loop_id, req)
        if req.chain:
            seqs = await self._appender.append_chain(
                loop_id, req.expected_last_seq, prepared.payloads, prepared.event_ids
            )
        else:
            seqs = await self._appender.append(loop_id, req.expected_last_seq, prepared.payloads, prepared.event_ids)
        if self._work is not None and seqs:
            self._work.stored(loop_id, seqs[-1], prepared.events[len(seqs) - 1])
        return seqs

    def _prepare(self, loop_id: str, req: CommitRequest) -> Prepared:
        return prepare(
            loop_id,
            [bytes(r) for r in req.events],
            max_input_bytes=self._max_input,
            max_record_bytes=self._max_record,
        )
