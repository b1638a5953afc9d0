"""``execute_tool <tool>`` spans and tool-call metrics, on the caller (model-step) and on the worker.

The caller's span covers every attempt of one call; its context rides in the request's
``traceparent`` header, so the worker's span is its child in another process. An error result
(``is_error``) or a failed call (timeout, canceled, crashed, ...) gives the span error status.
The caller's span id is derived from the step's span and the execution id: a replica that
continues a step whose caller died (and waits for a call still running, or sends it again) has
the same span, so the worker's span of the first attempt keeps its parent.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping
from typing import Any, Final

import msgspec

from services.toolwire import protocol as p
from shared import metrics, telemetry

CALLER: Final = "caller"
WORKER: Final = "worker"


def call(
    tool: str, side: str, tool_use_id: str, execution_id: str, headers: Mapping[str, str] | None = None
) -> contextlib.AbstractContextManager[Any]:
    """The span (and in-flight gauge) of one tool call; ``headers``: the request's, on the worker."""
    if not (telemetry.ENABLED or metrics.ENABLED):
        return telemetry.NULL
    return _call(tool, side, tool_use_id, execution_id, headers)


@contextlib.contextmanager
def _call(
    tool: str, side: str, tool_use_id: str, execution_id: str, headers: Mapping[str, str] | None
) -> Iterator[Any]:
    attributes = {
        telemetry.GEN_AI_OPERATION: "execute_tool",
        telemetry.GEN_AI_TOOL_NAME: tool,
        telemetry.GEN_AI_TOOL_TYPE: "function",
        telemetry.GEN_AI_TOOL_CALL_ID: tool_use_id,
        telemetry.LW_EXECUTION_ID: execution_id,
    }
    parent = telemetry.extract(headers) if headers is not None else None
    kind, key = ("server", "") if side == WORKER else ("client", execution_id)
    metrics.gauge_add(metrics.TOOL_IN_FLIGHT, 1, tool, side)
    try:
        with telemetry.span(f"execute_tool {tool}", kind=kind, attributes=attributes, parent=parent, key=key) as span:
            yield span
    finally:
        metrics.gauge_add(metrics.TOOL_IN_FLIGHT, -1, tool, side)


def finished(span: Any, tool: str, side: str, outcome: str, seconds: float, message: str = "") -> None:
    """Record how a call ended: ``ok``, ``error`` (an error result) or a failure kind."""
    metrics.inc(metrics.TOOL_CALLS, tool, side, outcome)
    metrics.observe(metrics.TOOL_SECONDS, seconds, tool, side)
    if outcome != "ok":
        telemetry.set_error(span, "tool_error" if outcome == "error" else outcome, message)


def worker_outcome(kind: str, body: bytes) -> str:
    """The outcome label of a worker's final reply."""
    if not (telemetry.ENABLED or metrics.ENABLED):
        return ""
    try:
        if kind == p.REPLY_RESULT:
            return "error" if p.decode_result(body).is_error else "ok"
        return str(p.decode_error(body).kind)
    except msgspec.DecodeError:
        return "internal"


def now() -> float:
    return time.perf_counter()
