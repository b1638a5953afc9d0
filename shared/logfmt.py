"""Structured logs: ``LW_LOG_FORMAT=json`` writes one JSON object per line.

Each line has ``time``, ``level``, ``service``, ``logger``, ``message`` and, where known, the
coordinates of the work being done (``loop_id``, ``turn_id``, ``step_id``, ``tool_execution_id``,
bound with :func:`bound`) and the current ``trace_id``/``span_id``.
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
        if trace_id:
            line["trace_id"], line["span_id"] = trace_id, span_id
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return _encoder.encode(line).decode()
