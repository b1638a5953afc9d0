"""The tool-call wire protocol on ``<prefix>.tool.<name>`` (core request/reply, one queue group per tool).

Request: headers ``Lw-Loop-Id``, ``Lw-Turn-Id``, ``Lw-Step-Id``, ``Lw-Tool-Use-Id``,
``Lw-Execution-Id``, ``Lw-Idempotency-Key`` (``<loop>:<step>:<tool_use_id>``), ``Lw-Deadline`` (unix ms),
``traceparent``; body = the raw argument JSON bytes.

Replies (several, to the request's reply subject), told apart by the ``Lw-Reply`` header:

* ``progress`` — :class:`ProgressBody`; heartbeats every ``heartbeat_seconds`` while the call runs,
  and the tool's own progress messages;
* ``result`` — :class:`ResultBody`, the final outcome of a call that ran (tool errors included);
* ``error`` — :class:`ToolErrorBody`, the final outcome of a call that did not complete on the worker
  (``timeout``, ``canceled``, ``internal``, ``not_started``, ``unavailable``, ``crashed``).

Cancel: any message on ``<prefix>.toolctl.<execution_id>`` cancels that call wherever it runs.
"""

from __future__ import annotations

import time
from typing import Final

import msgspec

from shared.content import Block
from shared.subjects import (
    H_DEADLINE,
    H_EXECUTION_ID,
    H_FIRST_SEND,
    H_IDEMPOTENCY_KEY,
    H_LOOP_ID,
    H_NO_RECORD,
    H_START_BY,
    H_STEP_ID,
    H_TOOL_USE_ID,
    H_TRACEPARENT,
    H_TURN_ID,
)
from shared.wiretypes import ToolErrorKind

REPLY_PROGRESS: Final = "progress"
REPLY_RESULT: Final = "result"
REPLY_ERROR: Final = "error"

ERROR_TIMEOUT: Final[ToolErrorKind] = "timeout"
ERROR_CANCELED: Final[ToolErrorKind] = "canceled"
ERROR_INTERNAL: Final[ToolErrorKind] = "internal"
# Arrived after its Lw-Start-By (e.g. the worker was stopped while it waited): never started. The
# caller sends it again if it still holds its lease.
ERROR_NOT_STARTED: Final[ToolErrorKind] = "not_started"
# The execution id has a recorded call with other arguments: never run (a caller bug or a forged id).
ERROR_REFUSED: Final[ToolErrorKind] = "refused"
# The tool's backend is down (e.g. a bridged MCP server restarting): answered at once, never run.
ERROR_UNAVAILABLE: Final[ToolErrorKind] = "unavailable"
# The tool's backend died while the call ran (e.g. its MCP server process was killed).
ERROR_CRASHED: Final[ToolErrorKind] = "crashed"


class ResultBody(msgspec.Struct, kw_only=True):
    blocks: list[Block] = msgspec.field(default_factory=list)
    is_error: bool = False


class ProgressBody(msgspec.Struct, kw_only=True, omit_defaults=True):
    message: str = ""
    # The worker's heartbeat interval, so a caller configured differently adapts its loss timeout.
    heartbeat_seconds: float = 0.0


class ToolErrorBody(msgspec.Struct, kw_only=True):
    kind: ToolErrorKind
    message: str = ""


class CallIds(msgspec.Struct, kw_only=True, frozen=True):
    """The coordinates of one call, carried as request headers."""

    loop_id: str = ""
    turn_id: str = ""
    step_id: str = ""
    tool_use_id: str = ""
    execution_id: str = ""
    traceparent: str = ""

    @property
    def idempotency_key(self) -> str:
        return f"{self.loop_id}:{self.step_id}:{self.tool_use_id}"


def request_headers(
    ids: CallIds,
    deadline_ms: int,
    start_by_ms: int | None = None,
    *,
    first_send: bool = False,
    no_record: bool = False,
) -> dict[str, str]:
    headers = {
        H_LOOP_ID: ids.loop_id,
        H_TURN_ID: ids.turn_id,
        H_STEP_ID: ids.step_id,
        H_TOOL_USE_ID: ids.tool_use_id,
        H_EXECUTION_ID: ids.execution_id,
        H_IDEMPOTENCY_KEY: ids.idempotency_key,
        H_DEADLINE: str(deadline_ms),
    }
    if ids.traceparent:
        headers[H_TRACEPARENT] = ids.traceparent
    if start_by_ms is not None:
        headers[H_START_BY] = str(start_by_ms)
    if first_send:
        headers[H_FIRST_SEND] = "1"
    if no_record:
        headers[H_NO_RECORD] = "1"
    # Never send empty header values (and never CR/LF: nats-py 2.16 refuses them anyway).
    return {k: v for k, v in headers.items() if v and "\r" not in v and "\n" not in v}


def ids_from_headers(headers: dict[str, str] | None) -> tuple[CallIds, str, int | None]:
    """(ids, idempotency key, deadline in unix ms or None) from a request's headers."""
    h = headers or {}
    ids = CallIds(
        loop_id=h.get(H_LOOP_ID, ""),
        turn_id=h.get(H_TURN_ID, ""),
        step_id=h.get(H_STEP_ID, ""),
        tool_use_id=h.get(H_TOOL_USE_ID, ""),
        execution_id=h.get(H_EXECUTION_ID, ""),
        traceparent=h.get(H_TRACEPARENT, ""),
    )
    deadline: int | None
    try:
        deadline = int(h.get(H_DEADLINE, ""))
    except ValueError:
        deadline = None
    return ids, h.get(H_IDEMPOTENCY_KEY, ""), deadline


def first_send(headers: dict[str, str] | None) -> bool:
    return (headers or {}).get(H_FIRST_SEND) == "1"


def no_record(headers: dict[str, str] | None) -> bool:
    return (headers or {}).get(H_NO_RECORD) == "1"


def start_by_from_headers(headers: dict[str, str] | None) -> int | None:
    """``Lw-Start-By`` in unix ms, or None when absent or unreadable."""
    try:
        return int((headers or {})[H_START_BY])
    except (KeyError, ValueError):
        return None


def now_ms() -> int:
    return int(time.time() * 1000)


_result_encoder = msgspec.json.Encoder()
_result_decoder = msgspec.json.Decoder(ResultBody)
_progress_decoder = msgspec.json.Decoder(ProgressBody)
_error_decoder = msgspec.json.Decoder(ToolErrorBody)


def encode(body: msgspec.Struct) -> bytes:
    return _result_encoder.encode(body)


def decode_result(data: bytes) -> ResultBody:
    return _result_decoder.decode(data)


def decode_progress(data: bytes) -> ProgressBody:
    return _progress_decoder.decode(data)


def decode_error(data: bytes) -> ToolErrorBody:
    return _error_decoder.decode(data)
