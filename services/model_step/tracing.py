"""Spans of a model-step drive: one ``invoke_agent`` span per turn (per drive of it), ``chat <model>``
per model request and ``commit <stream>`` per commit, plus the model metrics.

A turn's span context is recorded in its ``TurnStarted`` (``traceparent``), so a replica that
continues the turn later (after a gate, or after the first one crashed) opens its own
``invoke_agent`` span in the same trace, as a child of (and linked to) the recorded one. No span stays
open while a turn waits at a gate: the drive's span ends when the drive stops.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

from services.model_step.models.accumulator import StreamAccumulator
from services.model_step.models.base import FINISH_END_TURN, FINISH_TOOL_USE
from shared import logfmt, metrics, telemetry
from shared.content import ToolUseBlock
from shared.history import LoopHistory


class TurnTrace:
    """The ``invoke_agent`` span of the turn a drive is working on (at most one at a time)."""

    def __init__(self) -> None:
        self._span: Any = None
        self._traceparent = ""

    def advance(self, h: LoopHistory, starting_turn: bool) -> contextlib.AbstractContextManager[Any]:
        """Around one pass of the drive: make the turn's span current (starting it when needed)."""
        if not telemetry.ENABLED:
            t = h.open_turn
            return logfmt.bind(turn_id=t.turn_id) if t is not None else contextlib.nullcontext()
        return self._advance(h, starting_turn)

    @contextlib.contextmanager
    def _advance(self, h: LoopHistory, starting_turn: bool) -> Iterator[None]:
        from opentelemetry import context, trace

        t = h.open_turn
        if starting_turn:
            self.close()
            self._start(h, "", None)  # parent: the current context (the work signal's trace)
        elif t is None:
            self.close()
        elif t.traceparent != self._traceparent or self._span is None:
            self.close()
            self._start(h, t.turn_id, telemetry.context_of(t.traceparent), t.traceparent)
        if self._span is None:
            yield
            return
        token = context.attach(trace.set_span_in_context(self._span))
        try:
            with logfmt.bind(turn_id=t.turn_id if t is not None else ""):
                yield
        finally:
            context.detach(token)

    def _start(self, h: LoopHistory, turn_id: str, parent: Any, recorded: str = "") -> None:
        from opentelemetry import trace

        attributes = {
            telemetry.GEN_AI_OPERATION: "invoke_agent",
            telemetry.GEN_AI_CONVERSATION: h.loop_id,
            telemetry.LW_LOOP_ID: h.loop_id,
        }
        if turn_id:
            attributes[telemetry.LW_TURN_ID] = turn_id
        links = [trace.Link(trace.get_current_span(parent).get_span_context())] if parent is not None else []
        self._span = trace.get_tracer("loopwire").start_span(
            "invoke_agent", context=parent, kind=trace.SpanKind.INTERNAL, attributes=attributes, links=links
        )
        if recorded:
            self._span.add_event("turn.resumed", {"loopwire.recorded_traceparent": recorded})
        carrier: dict[str, str] = {}
        telemetry.inject_span(self._span, carrier)
        self._traceparent = recorded or carrier.get("traceparent", "")

    def close(self) -> None:
        if self._span is not None:
            self._span.end()
        self._span = None
        self._traceparent = ""


def chat(model: str, provider: str, h: LoopHistory, step_id: str) -> contextlib.AbstractContextManager[Any]:
    """The ``chat <model>`` span of one model request (and its latency metric)."""
    if not (telemetry.ENABLED or metrics.ENABLED):
        return telemetry.NULL
    return _chat(model, provider, h, step_id)


@contextlib.contextmanager
def _chat(model: str, provider: str, h: LoopHistory, step_id: str) -> Iterator[Any]:
    started = time.perf_counter()
    attributes = {
        telemetry.GEN_AI_OPERATION: "chat",
        telemetry.GEN_AI_PROVIDER: provider,
        telemetry.GEN_AI_REQUEST_MODEL: model,
        telemetry.GEN_AI_CONVERSATION: h.loop_id,
        telemetry.LW_STEP_ID: step_id,
    }
    with telemetry.span(f"chat {model}", kind="client", attributes=attributes) as span:
        yield span
        metrics.observe(metrics.MODEL_SECONDS, time.perf_counter() - started, model)


def chat_result(span: Any, model: str, acc: StreamAccumulator) -> None:
    """Record a model response's usage and finish reason on its span and in the token metrics."""
    if not (telemetry.ENABLED or metrics.ENABLED):
        return
    ai = acc.message()
    usage = ai.usage
    if usage is not None:
        metrics.inc(metrics.MODEL_TOKENS, model, "input", amount=usage.input_tokens)
        metrics.inc(metrics.MODEL_TOKENS, model, "output", amount=usage.output_tokens)
    if not telemetry.ENABLED:
        return
    if usage is not None:
        span.set_attribute(telemetry.GEN_AI_INPUT_TOKENS, usage.input_tokens)
        span.set_attribute(telemetry.GEN_AI_OUTPUT_TOKENS, usage.output_tokens)
    reason = acc.finish_reason
    if not reason:  # the model said none: what the response shows
        calls = any(isinstance(b, ToolUseBlock) for b in ai.blocks or [])
        reason = FINISH_TOOL_USE if calls else FINISH_END_TURN
    span.set_attribute(telemetry.GEN_AI_FINISH_REASONS, [reason])


def commit(stream: str, loop_id: str, count: int) -> contextlib.AbstractContextManager[Any]:
    """The model-step side of one commit attempt (and its latency metric)."""
    if not (telemetry.ENABLED or metrics.ENABLED):
        return telemetry.NULL
    return _commit(stream, loop_id, count)


@contextlib.contextmanager
def _commit(stream: str, loop_id: str, count: int) -> Iterator[Any]:
    started = time.perf_counter()
    attributes = {
        telemetry.MESSAGING_SYSTEM: "nats",
        telemetry.MESSAGING_OPERATION: "commit",
        telemetry.MESSAGING_DESTINATION: stream,
        telemetry.MESSAGING_BATCH_COUNT: count,
        telemetry.LW_LOOP_ID: loop_id,
    }
    with telemetry.span(f"commit {stream}", kind="client", attributes=attributes) as span:
        yield span
        metrics.observe(metrics.COMMIT_SECONDS, time.perf_counter() - started, "model-step")


def gate_event(name: str, gate_id: str, kind: str, tool: str, *, effect: str = "") -> None:
    """A gate wait, as an event on the turn's span (the wait itself holds no span open)."""
    if not telemetry.ENABLED:
        return
    attributes = {"loopwire.gate.id": gate_id, "loopwire.gate.kind": kind, telemetry.GEN_AI_TOOL_NAME: tool}
    if effect:
        attributes["loopwire.gate.effect"] = effect
    telemetry.add_event(name, attributes)
