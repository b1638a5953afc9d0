"""Clients of the committer: ``CommitClient`` (model-step, tools of the trade) and ``LoopClient`` (CLI, UIs).

Both **raise** on an error reply: a :class:`shared.protocol.RemoteError` subclass per kind
(``ConflictError`` with ``last_seq``, ``InvalidRequestError``, ``UnavailableError``,
``TooLargeError``, ``NotFoundError``, ``ClosedError``). No answer in time (or no committer running)
raises ``UnavailableError`` too. Retrying a request unchanged is always safe: commits are
de-duplicated by event id and loop-API commands by command id; so the clients send a request again
themselves while no reply has come (``DEFAULT_RESEND``), which a committer's crash then costs.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from typing import Final

import msgspec
import nats.errors
from nats.aio.client import Client as NATS

from shared import telemetry
from shared.codec import DEFAULT_MAX_RECORD_BYTES, encode_event
from shared.connection import request_resending
from shared.content import UserMessage
from shared.errors import ErrorKind
from shared.events import Budget, ContextPolicy, Event, Limits, ParentRef, RetryPolicy
from shared.protocol import (
    AnswerRequest,
    ApiReply,
    BudgetRequest,
    CloseRequest,
    CommitReply,
    CommitRequest,
    ErrorBody,
    ForkRequest,
    InputRequest,
    InterruptRequest,
    InvalidRequestError,
    RemoteError,
    StartRequest,
    UnavailableError,
    encode,
    error_from_body,
)
from shared.subjects import Names, Verb
from shared.validate import is_uuid
from shared.wiretypes import AnswerAction, OnUnknown, PolicyEffect, Reexecution

__all__ = ["ApiResult", "CommitClient", "CommitResult", "LoopClient"]

# The committer retries an unavailable JetStream for LW_COMMIT_RETRY_SECONDS (10 s) before it
# answers; wait a little longer than that.
DEFAULT_TIMEOUT: Final = 15.0
# A request with no reply yet is sent again after these pauses (then no more): a committer that died
# holding it never answers, and the copy goes to a live one. Both are answered alike, since commits
# are de-duplicated by event id and commands by command id. The first pause is far above a commit's
# usual time (milliseconds), so a copy is rare without a fault; the growing ones bound the copies a
# committer that is slow for a reason of its own (JetStream electing a leader) gets to four.
DEFAULT_RESEND: Final = (1.0, 2.0, 4.0)


@dataclass(frozen=True, slots=True)
class CommitResult:
    seqs: list[int]
    last_seq: int


@dataclass(frozen=True, slots=True)
class ApiResult:
    seq: int
    loop_id: str
    command_id: str


_commit_reply = msgspec.json.Decoder(CommitReply)
_api_reply = msgspec.json.Decoder(ApiReply)


def _unavailable(message: str) -> UnavailableError:
    return UnavailableError(ErrorBody(kind=ErrorKind.UNAVAILABLE, message=message))


# "No responders" is retried this long: a committer that just started (or restarted in a rolling
# update) may not have its interest propagated through the cluster yet.
NO_RESPONDERS_GRACE: Final = 2.0


async def _request(nc: NATS, subject: str, payload: bytes, wait: float, resend: Sequence[float]) -> bytes:
    try:
        msg = await request_resending(
            nc,
            subject,
            payload,
            timeout=wait,
            resend=resend,
            grace=NO_RESPONDERS_GRACE,
            headers=telemetry.headers_or_none(),
        )
    except nats.errors.NoRespondersError:
        raise _unavailable(f"no committer is serving {subject}") from None
    except nats.errors.TimeoutError:
        raise _unavailable(f"no reply on {subject} within {wait:g}s") from None
    except (nats.errors.ConnectionClosedError, nats.errors.ConnectionReconnectingError) as e:
        raise _unavailable(f"connection unavailable: {e!r}") from None
    data: bytes = msg.data
    return data


def _bad_reply(e: Exception) -> RemoteError:
    return _unavailable(f"unreadable reply from the committer: {e}")


def _check_loop_id(loop_id: str) -> None:
    # The committer refuses it too; checking here keeps a malformed id out of the subject.
    if not is_uuid(loop_id):
        message = f"loop id {loop_id!r} is not a canonical UUID"
        raise InvalidRequestError(ErrorBody(kind=ErrorKind.INVALID, message=message, field="loop_id"))


class CommitClient:
    """Append events to a loop through the committer (``lw.commit.<loop_id>``)."""

    def __init__(
        self, nc: NATS, names: Names, timeout: float = DEFAULT_TIMEOUT, resend: Sequence[float] = DEFAULT_RESEND
    ) -> None:
        self._nc = nc
        self._names = names
        self._timeout = timeout
        self._resend = resend

    def commit(
        self,
        loop_id: str,
        expected_last_seq: int,
        events: Sequence[Event],
        *,
        max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
        validate: bool = True,
        chain: bool = False,
    ) -> Awaitable[CommitResult]:
        """Append ``events`` (all or none) right after ``expected_last_seq`` (0 for a new loop).

        Events are encoded (and so validated) here first: an invalid one raises
        :class:`shared.errors.InvalidEventError` before anything is sent. ``validate=False``: the
        committer's validation is the only one (it validates every event it stores), and an invalid
        event comes back as an :class:`~shared.protocol.InvalidRequestError` reply instead.
        ``chain``: stored one by one, each right after the one before, up to the first whose expected
        sequence fails (``seqs`` then holds fewer sequences than there are events); else all or none.
        """
        # Encoded now (a bad event raises at the call), sent by commit_raw's own coroutine.
        envelopes = [encode_event(e, max_bytes=max_record_bytes, validate=validate) for e in events]
        return self.commit_raw(loop_id, expected_last_seq, envelopes, chain=chain)

    async def commit_raw(
        self, loop_id: str, expected_last_seq: int, envelopes: Sequence[bytes], *, chain: bool = False
    ) -> CommitResult:
        """Like :meth:`commit` with already-encoded envelopes (each one JSON object), unchecked."""
        _check_loop_id(loop_id)
        events = [msgspec.Raw(e) for e in envelopes]
        body = encode(CommitRequest(expected_last_seq=expected_last_seq, events=events, chain=chain))
        return self.parse_reply(
            await _request(self._nc, self._names.commit(loop_id), body, self._timeout, self._resend)
        )

    @staticmethod
    def parse_reply(data: bytes) -> CommitResult:
        try:
            reply = _commit_reply.decode(data)
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            raise _bad_reply(e) from None
        if not reply.ok or not reply.seqs:
            raise error_from_body(reply.error or ErrorBody(kind=ErrorKind.UNAVAILABLE, message="empty reply"))
        return CommitResult(seqs=list(reply.seqs), last_seq=reply.last_seq or reply.seqs[-1])


def _new_id() -> str:
    return str(uuid.uuid4())


class LoopClient:
    """The loop API (``lw.api.<loop_id>.<verb>``). Command ids are minted when not given."""

    def __init__(
        self, nc: NATS, names: Names, timeout: float = DEFAULT_TIMEOUT, resend: Sequence[float] = DEFAULT_RESEND
    ) -> None:
        self._nc = nc
        self._names = names
        self._timeout = timeout
        self._resend = resend

    async def _call(self, loop_id: str, verb: Verb, req: msgspec.Struct, command_id: str) -> ApiResult:
        _check_loop_id(loop_id)
        data = await _request(self._nc, self._names.api(loop_id, verb), encode(req), self._timeout, self._resend)
        try:
            reply = _api_reply.decode(data)
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            raise _bad_reply(e) from None
        if not reply.ok or reply.seq is None:
            raise error_from_body(reply.error or ErrorBody(kind=ErrorKind.UNAVAILABLE, message="empty reply"))
        return ApiResult(seq=reply.seq, loop_id=reply.loop_id or loop_id, command_id=command_id)

    async def start(
        self,
        loop_id: str | None = None,
        *,
        model: str | None = None,
        system: str | None = None,
        tools: list[str] | None = None,
        policy: dict[str, PolicyEffect] | None = None,
        default_policy: PolicyEffect | None = None,
        limits: Limits | None = None,
        command_id: str | None = None,
        on_unknown: OnUnknown | None = None,
        retries: dict[str, RetryPolicy] | None = None,
        parent: ParentRef | None = None,
        budget: Budget | None = None,
        context: ContextPolicy | None = None,
    ) -> ApiResult:
        """Start a loop (a new UUID unless ``loop_id`` is given); ``model`` defaults to the committer's LW_MODEL.

        ``parent``: the loop is a sub-agent's child, run for that call of the parent loop.
        ``budget``: its tokens, cost, steps per turn and seconds per turn (docs/budgets.md).
        ``context``: how its model requests fit the model's context window (docs/context.md)."""
        loop_id = loop_id or _new_id()
        cid = command_id or _new_id()
        req = StartRequest(
            command_id=cid,
            model=model,
            system=system,
            tools=tools,
            policy=policy,
            default_policy=default_policy,
            limits=limits,
            on_unknown=on_unknown,
            retries=retries,
            parent=parent,
            budget=budget,
            context=context,
        )
        return await self._call(loop_id, "start", req, cid)

    async def budget(self, loop_id: str, budget: Budget, *, command_id: str | None = None) -> ApiResult:
        """Replace the loop's budget (committed as BudgetChanged; checked before its next model step)."""
        cid = command_id or _new_id()
        return await self._call(loop_id, "budget", BudgetRequest(command_id=cid, budget=budget), cid)

    async def input(
        self,
        loop_id: str,
        text: str | None = None,
        *,
        message: UserMessage | None = None,
        command_id: str | None = None,
    ) -> ApiResult:
        cid = command_id or _new_id()
        return await self._call(loop_id, "input", InputRequest(command_id=cid, text=text, message=message), cid)

    async def interrupt(self, loop_id: str, *, command_id: str | None = None) -> ApiResult:
        cid = command_id or _new_id()
        return await self._call(loop_id, "interrupt", InterruptRequest(command_id=cid), cid)

    async def answer(
        self,
        loop_id: str,
        gate_id: str,
        action: AnswerAction,
        *,
        text: str = "",
        reason: str = "",
        resolver: str = "",
        command_id: str | None = None,
    ) -> ApiResult:
        """Answer a gate; ``resolver`` names who answers (the history records ``operator`` when empty)."""
        cid = command_id or _new_id()
        req = AnswerRequest(command_id=cid, gate_id=gate_id, action=action, text=text, reason=reason, resolver=resolver)
        return await self._call(loop_id, "answer", req, cid)

    async def fork(
        self,
        source_loop_id: str,
        *,
        at: int | None = None,
        input: str | None = None,
        model: str | None = None,
        system: str | None = None,
        policy: dict[str, PolicyEffect] | None = None,
        reexecution: dict[str, Reexecution] | None = None,
        loop_id: str | None = None,
        command_id: str | None = None,
    ) -> ApiResult:
        """Fork ``source_loop_id`` after record ``at`` (default: its last fork point) into a new loop."""
        _check_loop_id(source_loop_id)
        loop_id = loop_id or _new_id()
        cid = command_id or _new_id()
        req = ForkRequest(
            command_id=cid,
            source_loop_id=source_loop_id,
            at=at,
            input=input,
            model=model,
            system=system,
            policy=policy,
            reexecution=reexecution,
        )
        return await self._call(loop_id, "fork", req, cid)

    async def close(self, loop_id: str, *, command_id: str | None = None) -> ApiResult:
        cid = command_id or _new_id()
        return await self._call(loop_id, "close", CloseRequest(command_id=cid), cid)
