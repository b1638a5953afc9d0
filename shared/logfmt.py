"""Structured logs: ``LW_LOG_FORMAT=json`` writes one JSON object per line.

Each line has ``time``, ``level``, ``service``, ``logger``, ``message`` and, where known, the
coordinates of the work being done (``loop_id``, ``turn_id``, ``step_id``, ``tool_execution_id``,
bound with :func:`bound`) and the current ``trace_id``/``span_id``: the current span's, else, for a
line about a loop whose turn is being driven in this process, that turn's span (:func:`turn_span`),
so a line written outside the drive (a work item's, a lease's) is found in the turn's trace too.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Final

import msgspec

from shared import telemetry

_IDS: Final = ("loop_id", "turn_id", "step_id", "tool_execution_id")
_bound: contextvars.ContextVar[dict[str, str] | None] = contextvars.ContextVar("loopwire_log_ids", default=None)
_encoder: Final = msgspec.json.Encoder()
# loop_id -> (trace id, span id) of the turn span a drive in this process is working in.
_turns: dict[str, tuple[str, str]] = {}


ENABLED = False  # set when services write JSON lines: only then are coordinates bound


_NOTHING: Final = contextlib.nullcontext()  # reusable: it holds no state


def bind(**ids: str) -> contextlib.AbstractContextManager[None]:
    """:func:`bound` while JSON logging is on, else nothing (the hot path pays no context switch)."""
    return bound(**ids) if ENABLED else _NOTHING


@contextlib.contextmanager
def bound(**ids: str) -> Iterator[None]:
    """Attach coordinates (non-empty ones) to every log line written inside the block (task-local)."""
    merged = {**(_bound.get() or {}), **{k: v for k, v in ids.items() if v}}
    token = _bound.set(merged)
    try:
        yield
    finally:
        _bound.reset(token)


def turn_span(loop_id: str, ids: tuple[str, str]) -> None:
    """Lines about ``loop_id`` with no current span carry ``ids`` (("", ""): no longer)."""
    if ids[0]:
        _turns[loop_id] = ids
    else:
        _turns.pop(loop_id, None)


class JsonFormatter(logging.Formatter):
    def __init__(self, service: str) -> None:
        super().__init__()
        self.service = service

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC)
            .isoformat(timespec="milliseconds")
            .replace("+00:00", "Z"),
            "level": record.levelname,
            "service": self.service,
            "logger": record.name,
            "message": record.getMessage(),
        }
        line.update(_bound.get() or {})
        for key in _IDS:
            value = getattr(record, key, None)
            if isinstance(value, str) and value:
                line[key] = value
        trace_id, span_id = telemetry.current_ids()
        if not trace_id and _turns:
            loop_id = line.get("loop_id")
            if isinstance(loop_id, str):
                trace_id, span_id = _turns.get(loop_id, ("", ""))
        if trace_id:
            line["trace_id"], line["span_id"] = trace_id, span_id
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return _encoder.encode(line).decode()
