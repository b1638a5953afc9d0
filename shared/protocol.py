"""Wire types of the commit protocol and the loop API (requests, replies, errors).

Commit (``lw.commit.<loop_id>``)::

    request  {"expected_last_seq": N, "events": [<v1 envelope object>, ...]}
    reply    {"ok": true, "seqs": [...], "last_seq": M}
           | {"ok": false, "error": {"kind", "message", "event"?, "field"?, "rule"?, "index"?, "last_seq"?}}

Loop API (``lw.api.<loop_id>.<verb>``): one request struct per verb, one reply shape::

    reply    {"ok": true, "seq": N, "loop_id"?: "..."} | {"ok": false, "error": {...}}

Every request body is strict JSON (UTF-8, no duplicate keys) and unknown fields are refused.
``RemoteError`` and its subclasses are what clients raise for an error reply.
"""

from __future__ import annotations

import re
from typing import Final, TypeVar

import msgspec

from shared import strictjson
from shared.content import UserMessage
from shared.errors import ErrorKind, LoopwireError, Rule
from shared.events import Budget, ContextPolicy, Limits, ParentRef, RetryPolicy
from shared.shaping import bounded_diagnostic
from shared.wiretypes import (
    AnswerAction,
    Count,
    OnUnknown,
    PolicyEffect,
    PolicyKey,
    Reexecution,
    Seq,
    ToolName,
    Uuid,
)

__all__ = [
    "AnswerRequest",
    "ApiReply",
    "BudgetRequest",
    "CloseRequest",
    "ClosedError",
    "CommitReply",
    "CommitRequest",
    "ConflictError",
    "ErrorBody",
    "InputRequest",
    "InterruptRequest",
    "InvalidRequestError",
    "NotFoundError",
    "RemoteError",
    "StartRequest",
    "TooLargeError",
    "UnavailableError",
    "WireError",
    "decode_request",
    "encode",
    "error_from_body",
]

RESOLVER_MAX_CHARS: Final = 64
# Longest error message / error field (event, field, rule) in a reply, in UTF-8 bytes.
ERROR_MESSAGE_MAX_BYTES: Final = 2048
ERROR_FIELD_MAX_BYTES: Final = 256


class _Wire(msgspec.Struct, omit_defaults=True, forbid_unknown_fields=True, kw_only=True):
    pass


# --- errors -----------------------------------------------------------------------------------


class ErrorBody(_Wire):
    """``error`` of a failed reply. ``kind`` is an :class:`shared.errors.ErrorKind` value.

    For ``invalid``: ``event`` (type name), ``field`` and ``rule`` when an event broke a validation
    rule, ``index`` = its position in ``events``. For ``conflict``: ``last_seq`` = the loop's
    current last sequence.
    """

    kind: ErrorKind
    message: str = ""
    event: str = ""
    field: str = ""
    rule: str = ""
    index: Count | None = None
    last_seq: Seq | None = None


class RemoteError(LoopwireError):
    """An error reply from the committer (``body`` holds every field of it)."""

    def __init__(self, body: ErrorBody) -> None:
        self.body = body
        super().__init__(f"{body.kind}: {body.message}")

    @property
    def last_seq(self) -> int | None:
        return self.body.last_seq


class InvalidRequestError(RemoteError):
    kind = ErrorKind.INVALID


class ConflictError(RemoteError):
    """The loop's last sequence is not the expected one (``last_seq`` is the current one)."""

    kind = ErrorKind.CONFLICT


class UnavailableError(RemoteError):
    """JetStream (or the committer) did not answer in time; retrying the same request is safe."""

    kind = ErrorKind.UNAVAILABLE


class TooLargeError(RemoteError):
    kind = ErrorKind.TOO_LARGE


class NotFoundError(RemoteError):
    kind = ErrorKind.NOT_FOUND


class ClosedError(RemoteError):
    kind = ErrorKind.CLOSED


_BY_KIND: Final[dict[str, type[RemoteError]]] = {
    ErrorKind.INVALID: InvalidRequestError,
    ErrorKind.CONFLICT: ConflictError,
    ErrorKind.UNAVAILABLE: UnavailableError,
    ErrorKind.TOO_LARGE: TooLargeError,
    ErrorKind.NOT_FOUND: NotFoundError,
    ErrorKind.CLOSED: ClosedError,
}


def error_from_body(body: ErrorBody) -> RemoteError:
    return _BY_KIND.get(body.kind, RemoteError)(body)


class WireError(LoopwireError):
    """Raised by request handling; becomes an error reply. ``kind`` decides the reply's kind."""

    def __init__(self, kind: ErrorKind, message: str, **fields: object) -> None:
        self.kind = kind
        self.fields = fields
        super().__init__(message)

    def body(self) -> ErrorBody:
        # Bounded: a message quoting the input (a 1 MB "type", a huge key) must still fit one reply.
        fields = {
            k: bounded_diagnostic(v, ERROR_FIELD_MAX_BYTES) if isinstance(v, str) else v for k, v in self.fields.items()
        }
        message = bounded_diagnostic(str(self), ERROR_MESSAGE_MAX_BYTES)
        return ErrorBody(kind=self.kind, message=message, **fields)  # type: ignore[arg-type]


# --- commit -----------------------------------------------------------------------------------


class CommitRequest(_Wire):
    expected_last_seq: Seq
    # Each element is one v1 envelope, embedded as a JSON object (kept raw: validated one by one).
    events: list[msgspec.Raw]
    # Stored one by one, each right after the one before it, instead of all or none; the storing
    # stops at the first whose expected sequence fails (docs/protocol.md, "Chained commits").
    chain: bool = False


class CommitReply(_Wire):
    ok: bool
    seqs: list[Seq] | None = None
    last_seq: Seq | None = None
    error: ErrorBody | None = None


# --- loop API ---------------------------------------------------------------------------------


class StartRequest(_Wire):
    command_id: Uuid
    model: str | None = None
    system: str | None = None
    tools: list[ToolName] | None = None
    policy: dict[PolicyKey, PolicyEffect] | None = None
    default_policy: PolicyEffect | None = None
    limits: Limits | None = None
    on_unknown: OnUnknown | None = None
    retries: dict[ToolName, RetryPolicy] | None = None
    parent: ParentRef | None = None  # a sub-agent's child loop: the parent's call
    budget: Budget | None = None
    context: ContextPolicy | None = None


class InputRequest(_Wire):
    """Exactly one of ``text`` and ``message``."""

    command_id: Uuid
    text: str | None = None
    message: UserMessage | None = None


class AnswerRequest(_Wire):
    command_id: Uuid
    gate_id: Uuid
    action: AnswerAction
    text: str = ""
    reason: str = ""
    # Who answers (recorded as GateResolved.resolver; "" = "operator"), at most RESOLVER_MAX_CHARS.
    resolver: str = ""


class InterruptRequest(_Wire):
    command_id: Uuid


class CloseRequest(_Wire):
    command_id: Uuid


class BudgetRequest(_Wire):
    """The loop's whole budget from now on (committed as BudgetChanged; limits left out are 0 = unlimited)."""

    command_id: Uuid
    budget: Budget


class ForkRequest(_Wire):
    """Sent on the NEW loop's subject (``lw.api.<new_loop>.fork``), like ``start``."""

    command_id: Uuid
    source_loop_id: Uuid
    at: Seq | None = None  # a valid fork point of the source (default: its last one)
    input: str | None = None  # replaces the input the fork point ends with (else: a new input)
    model: str | None = None
    system: str | None = None
    policy: dict[PolicyKey, PolicyEffect] | None = None
    reexecution: dict[PolicyKey, Reexecution] | None = None


REQUEST_TYPES: Final[dict[str, type[_Wire]]] = {
    "start": StartRequest,
    "input": InputRequest,
    "answer": AnswerRequest,
    "interrupt": InterruptRequest,
    "close": CloseRequest,
    "fork": ForkRequest,
    "budget": BudgetRequest,
}


class ApiReply(_Wire):
    ok: bool
    seq: Seq | None = None
    loop_id: Uuid | None = None
    error: ErrorBody | None = None


# --- coding -----------------------------------------------------------------------------------

_encoder = msgspec.json.Encoder()
_FIELD_RE: Final = re.compile(r"(?:at|in) `\$\.([A-Za-z0-9_]+)")
_MISSING_RE: Final = re.compile(r"^Object missing required field `([A-Za-z0-9_]+)`$")
_UNKNOWN_RE: Final = re.compile(r"^Object contains unknown field `([A-Za-z0-9_]+)`$")
T = TypeVar("T", bound=_Wire)
_decoders: dict[type[_Wire], msgspec.json.Decoder[_Wire]] = {}


def encode(value: msgspec.Struct) -> bytes:
    return _encoder.encode(value)


def decode_request(data: bytes, cls: type[T], *, check_duplicates: bool = True) -> T:
    """Decode a request body strictly, or raise :class:`WireError` (kind ``invalid``) saying why.

    A commit request that is exactly msgspec's encoding of what it decodes to (what every loopwire
    client sends) has no duplicate key and no text the strict parser would refuse, so it skips the
    pure-Python strict pass; any other body takes it. Its events (``msgspec.Raw``) are re-encoded
    byte for byte, and the committer checks each of them strictly on its own. Only commit requests:
    a request with free-form maps (a start's policy) could still hide keys that differ only in case.
    """
    dec = _decoders.get(cls)
    if dec is None:
        dec = _decoders[cls] = msgspec.json.Decoder(cls)
    if check_duplicates and cls is CommitRequest:
        try:
            fast = dec.decode(data)
            if _encoder.encode(fast) == data:
                return fast  # type: ignore[return-value]
        except (msgspec.ValidationError, msgspec.DecodeError, msgspec.EncodeError, RecursionError, TypeError):
            pass  # the strict path below says what is wrong, as it always did
        try:
            doc = strictjson.loads(data)
        except strictjson.StrictJSONError as e:
            raise WireError(ErrorKind.INVALID, f"request is not strict JSON ({e})") from None
        if not isinstance(doc, dict):
            raise WireError(ErrorKind.INVALID, "request must be a JSON object")
    try:
        return dec.decode(data)  # type: ignore[return-value]
    except msgspec.ValidationError as e:
        text = str(e)
        extra: dict[str, object] = {}
        if m := _MISSING_RE.search(text):
            extra = {"field": m.group(1), "rule": Rule.REQUIRED.value}
        elif m := (_FIELD_RE.search(text) or _UNKNOWN_RE.search(text)):
            extra = {"field": m.group(1), "rule": Rule.INVALID.value}
        raise WireError(ErrorKind.INVALID, f"request has the wrong shape: {text}", **extra) from None
    except (msgspec.DecodeError, RecursionError) as e:  # msgspec raises RecursionError for very deep nesting
        raise WireError(ErrorKind.INVALID, f"request is not valid JSON: {e}") from None
