"""Spans of a model-step drive: one ``invoke_agent`` span per turn (per drive of it), ``chat <model>``
per model request and ``commit <stream>`` per commit, plus the model metrics.

A turn's trace context is recorded in its ``TurnStarted`` (``traceparent``: the context its first
drive was started in, the work signal's), so whichever replica continues the turn later (after a
gate, or after the one driving it died) opens its ``invoke_agent`` span in the same trace. No span
stays open while a turn waits at a gate: the drive's span ends when the drive parks.

**Continued, not replaced.** A drive's span has an id derived from the turn and the point the drive
took the turn up from (its start, or the latest answered gate), and its parent and start are read
from the history, so a replica that continues a turn whose driver died mid-step (SIGKILL: nothing of
its open spans is exported) opens the *same* span: the dead drive's exported spans (its commits,
model requests, and through its calls' spans the workers') find their parent. So that the span is
exported once, a drive that stops before the turn rests (its lease lost, the service stopping) drops
its span instead of ending it, with the tool-call spans its stop cut short; the drive that continues
the turn ends them.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from datetime import datetime
from typing import Any

from services.model_step.models.accumulator import StreamAccumulator
from services.model_step.models.base import FINISH_END_TURN, FINISH_TOOL_USE
from shared import logfmt, metrics, telemetry
from shared.content import ToolUseBlock
from shared.history import LoopHistory, OpenTurn
from shared.pricing import price_of, step_cost_micro_usd, usd

_NO_IDS = ("", "")


def drive_span_id(turn_id: str, taken_up_at: str) -> int:
    """The id of the ``invoke_agent`` span of the drives of turn ``turn_id`` from one point: its start
    (``""``) or the answered gate ``taken_up_at``."""
    return telemetry.derived_span_id("invoke_agent", turn_id, taken_up_at)


def taken_up_at(h: LoopHistory, t: OpenTurn) -> tuple[str, int, str]:
    """Where the drives of the open turn take it up from: ("" or the latest answered gate's id, the
    sequence of that point's record, its created_at)."""
    gate, seq, at = "", t.started_seq, t.started_at
    for g in h.gates.values():
        if g.turn_id == t.turn_id and g.resolved is not None and g.resolved_seq > seq:
            gate, seq, at = g.gate.id, g.resolved_seq, g.resolved.created_at
    return gate, seq, at


def _unix_ns(rfc3339: str) -> int:
    try:
        return int(datetime.fromisoformat(rfc3339).timestamp() * 1_000_000_000)
    except ValueError:
        return 0


class TurnTrace:
    """The ``invoke_agent`` span of the turn a drive of ``loop_id`` is working on (at most one at a time)."""

    def __init__(self, loop_id: str) -> None:
        self.loop_id = loop_id
        self._span: Any = None
        self._key = _NO_IDS  # (turn id, the point it was taken up from) of the span
        self._held: list[tuple[Any, int]] = []  # tool-call spans cut short inside it
        # What the TurnStarted of the turn this drive starts records (see advance).
        self.recorded = ""

    def advance(self, h: LoopHistory, new_turn: str = "") -> contextlib.AbstractContextManager[Any]:
        """Around one pass of the drive: make the turn's span current (starting it when needed).
        ``new_turn``: the pass starts that turn (commits its TurnStarted, recording :attr:`recorded`)."""
        if not telemetry.ENABLED:
            t = h.open_turn
            return logfmt.bind(turn_id=t.turn_id) if t is not None else contextlib.nullcontext()
        return self._advance(h, new_turn)

    @contextlib.contextmanager
    def _advance(self, h: LoopHistory, new_turn: str) -> Iterator[None]:
        t = h.open_turn
        if new_turn:
            self.close()
            self._begin(h, new_turn)
        elif t is None:
            self.close()
        else:
            gate, seq, at = taken_up_at(h, t)
            if (t.turn_id, gate) != self._key:
                self.close()
                # A point inside a fork's copies is the source's: its time is not this drive's start.
                self._take_up(h, t, gate, _unix_ns(at) if seq > h.formed_seq else 0)
        if self._span is None:
            yield
            return
        turn_id = new_turn or (t.turn_id if t is not None else "")
        with telemetry.using(self._span), telemetry.holding(self._held), logfmt.bind(turn_id=turn_id):
            yield

    def _attributes(self, h: LoopHistory, turn_id: str) -> dict[str, str]:
        return {
            telemetry.GEN_AI_OPERATION: "invoke_agent",
            telemetry.GEN_AI_CONVERSATION: h.loop_id,
            telemetry.LW_LOOP_ID: h.loop_id,
            telemetry.LW_TURN_ID: turn_id,
        }

    def _begin(self, h: LoopHistory, turn_id: str) -> None:
        """The first drive of a new turn: its span is a child of the current context (the work
        signal's), which the turn records; with none, the span begins a trace and is recorded itself."""
        self.recorded = telemetry.traceparent()
        span_id = drive_span_id(turn_id, "")
        self._open(telemetry.start_span("invoke_agent", attributes=self._attributes(h, turn_id), span_id=span_id))
        if not self.recorded:
            trace_id, _ = telemetry.span_ids(self._span)
            self.recorded = telemetry.traceparent_of(int(trace_id, 16), span_id) if trace_id else ""
        self._key = (turn_id, "")

    def _take_up(self, h: LoopHistory, t: OpenTurn, gate: str, start_ns: int) -> None:
        """A drive of a turn begun before it: the span of the drives from the same point, with the
        parent the turn recorded (none when the recorded span is the turn's first drive's own: it
        began the trace), from that point's time on."""
        first = drive_span_id(t.turn_id, "")
        trace_id, recorded_span = telemetry.ids_of(t.traceparent)
        began_trace = bool(trace_id) and recorded_span == first
        links = [telemetry.traceparent_of(trace_id, first)] if gate and trace_id else []
        self._open(
            telemetry.start_span(
                "invoke_agent",
                attributes=self._attributes(h, t.turn_id),
                # (a turn not traced when it started: the current context, the work signal's)
                parent=None if began_trace else telemetry.context_of(t.traceparent),
                links=links,
                span_id=drive_span_id(t.turn_id, gate),
                root_of=trace_id if began_trace else 0,
                start_ns=start_ns,
            )
        )
        if gate:
            self._span.add_event("turn.resumed", {"loopwire.gate.id": gate})
        self._key = (t.turn_id, gate)

    def _open(self, span: Any) -> None:
        self._span = span
        logfmt.turn_span(self.loop_id, telemetry.span_ids(span))

    def leave(self, h: LoopHistory | None, *, rests: bool) -> None:
        """At the drive's end, ``h`` the latest fold it knows: end the span if the loop rests or its
        turn is over (nobody continues it), else drop it (the drive that continues the turn ends it)."""
        t = h.open_turn if h is not None else None
        if rests or t is None or t.turn_id != self._key[0]:
            self.close()
        else:
            self.drop()

    def close(self) -> None:
        """End the span (and the tool-call spans cut short in it): its work is over."""
        if self._span is not None:
            for s, cut in self._held:
                s.end(end_time=cut)
            self._span.end()
        self._forget()

    def drop(self) -> None:
        """Leave the span (and the tool-call spans cut short in it) unexported: the drive stopped
        before the turn rests, and the drive that continues it ends the same spans."""
        self._forget()

    def _forget(self) -> None:
        if self._span is not None:
            logfmt.turn_span(self.loop_id, _NO_IDS)
        self._span = None
        self._held = []
        self._key = _NO_IDS


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


def chat_context(span: Any, strategy: str, tokens: int, full_tokens: int, cleared: int) -> None:
    """Record what the loop's context strategy did to a request on its chat span (if any) and in the metrics."""
    if full_tokens > tokens:
        metrics.inc(metrics.CONTEXT_CLEARED_TOKENS, strategy, amount=full_tokens - tokens)
    if telemetry.ENABLED and span is not None:
        span.set_attribute(telemetry.LW_CONTEXT_TOKENS, tokens)
        span.set_attribute(telemetry.LW_CONTEXT_FULL_TOKENS, full_tokens)
        span.set_attribute(telemetry.LW_CONTEXT_CLEARED, cleared)


def chat_result(span: Any, model: str, acc: StreamAccumulator) -> None:
    """Record a model response's usage and finish reason on its span and in the token metrics."""
    if not (telemetry.ENABLED or metrics.ENABLED):
        return
    ai = acc.message()
    usage = ai.usage
    if usage is not None:
        metrics.inc(metrics.MODEL_TOKENS, model, "input", amount=usage.input_tokens)
        metrics.inc(metrics.MODEL_TOKENS, model, "output", amount=usage.output_tokens)
        metrics.inc(metrics.MODEL_COST, model, amount=usd(step_cost_micro_usd(price_of(model), usage)))
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
