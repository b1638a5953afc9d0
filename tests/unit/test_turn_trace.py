"""The spans of a turn's drives: one span per drive of a turn from one point, exported once, whoever
ends it; a drive that stops before the turn rests leaves its span (and its calls' spans cut short)
to the drive that continues the turn, which has the same ids — so no exported span loses its parent.

The services' tracer provider, exporting to memory, stands in for OTLP (tests/system/test_observability.py
checks the same across processes with a SIGKILL).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from services.model_step import tracing
from shared import events as ev
from shared import logfmt, telemetry
from shared.events import new_id
from shared.history import GateState, LoopHistory, OpenTurn

LOOP = "7b0f1c56-3f7e-4c2b-9a51-0d2f3e4a5b6c"
STARTED_AT = "2026-12-04T01:00:00.000000Z"
ANSWERED_AT = "2026-12-04T01:05:00.000000Z"


@pytest.fixture
def exported(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    memory = InMemorySpanExporter()
    provider = telemetry.make_provider("loopwire-test", SimpleSpanProcessor(memory))
    monkeypatch.setattr(telemetry, "ENABLED", True)
    monkeypatch.setattr(telemetry, "_tracer", provider.get_tracer("loopwire"))
    yield memory
    provider.shutdown()


def open_turn(turn_id: str, recorded: str, gate: str = "") -> LoopHistory:
    h = LoopHistory(
        loop_id=LOOP,
        last_seq=9,
        open_turn=OpenTurn(turn_id=turn_id, turn_index=1, started_seq=3, traceparent=recorded, started_at=STARTED_AT),
    )
    if gate:
        h.gates[gate] = GateState(
            gate=ev.Gate(id=gate, kind="permission"),
            turn_id=turn_id,
            step_id=new_id(),
            tool_execution_id="",
            opened_seq=5,
            resolved=ev.GateResolved(gate_id=gate, action="approve", created_at=ANSWERED_AT),
            resolved_seq=6,
        )
    return h


def cut_call(execution_id: str) -> None:
    """A tool call's span (the caller's) that a cancellation cuts short."""
    try:
        with telemetry.span("execute_tool t", kind="client", key=execution_id):
            raise asyncio.CancelledError
    except asyncio.CancelledError:
        pass


def hex_id(span_id: int) -> str:
    return format(span_id, "016x")


def by_name(spans: tuple[ReadableSpan, ...], name: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name == name]


def parent_of(s: ReadableSpan) -> str:
    return hex_id(s.parent.span_id) if s.parent is not None else ""


def ids(s: ReadableSpan) -> tuple[str, str]:
    return format(s.context.trace_id, "032x"), hex_id(s.context.span_id)


def test_a_drive_stopped_mid_turn_leaves_its_spans_to_the_drive_that_continues_it(
    exported: InMemorySpanExporter,
) -> None:
    turn_id, execution_id = new_id(), new_id()
    with telemetry.span("input lw.api", kind="server") as signal:  # the work signal's context
        first = tracing.TurnTrace(LOOP)
        with first.advance(LoopHistory(loop_id=LOOP), turn_id):
            with telemetry.span("chat m", kind="client"):
                pass
            cut_call(execution_id)
            assert logfmt._turns[LOOP][0] == format(signal.get_span_context().trace_id, "032x")
        recorded = first.recorded
        first.drop()  # its lease was lost, or its process stopped: nothing more of it is exported
    assert LOOP not in logfmt._turns
    assert telemetry.ids_of(recorded) == (signal.get_span_context().trace_id, signal.get_span_context().span_id)
    assert {s.name for s in exported.get_finished_spans()} == {"input lw.api", "chat m"}

    later = tracing.TurnTrace(LOOP)  # another process, after the first one's lease is gone
    with later.advance(open_turn(turn_id, recorded)), telemetry.span("execute_tool t", kind="client", key=execution_id):
        pass
    later.close()  # the turn rests

    spans = exported.get_finished_spans()
    (agent,) = by_name(spans, "invoke_agent")
    (chat,) = by_name(spans, "chat m")
    (call,) = by_name(spans, "execute_tool t")  # the cut one was left, the continued one exported
    assert ids(agent)[1] == hex_id(tracing.drive_span_id(turn_id, ""))
    assert parent_of(agent) == hex_id(signal.get_span_context().span_id)
    assert parent_of(chat) == parent_of(call) == ids(agent)[1]
    assert agent.start_time == 1_796_346_000_000_000_000  # from the turn's start, not the take-over
    assert {ids(s)[0] for s in spans} == {ids(agent)[0]}
    assert dict(agent.attributes or {})[telemetry.LW_TURN_ID] == turn_id


def test_calls_cut_short_in_a_drive_that_ends_are_ended_where_they_were_cut(exported: InMemorySpanExporter) -> None:
    turn_id = new_id()
    trace = tracing.TurnTrace(LOOP)
    with trace.advance(LoopHistory(loop_id=LOOP), turn_id):
        cut_call(new_id())  # e.g. an interrupt: the turn is over, nobody continues the call
    assert by_name(exported.get_finished_spans(), "execute_tool t") == []
    trace.close()
    (call,) = by_name(exported.get_finished_spans(), "execute_tool t")
    (agent,) = by_name(exported.get_finished_spans(), "invoke_agent")
    assert parent_of(call) == ids(agent)[1] and call.end_time is not None and call.end_time <= (agent.end_time or 0)


def test_a_drive_after_an_answered_gate_has_a_span_of_its_own_linked_to_the_first(
    exported: InMemorySpanExporter,
) -> None:
    turn_id, gate = new_id(), new_id()
    with telemetry.span("input lw.api", kind="server") as signal:
        first = tracing.TurnTrace(LOOP)
        with first.advance(LoopHistory(loop_id=LOOP), turn_id):
            pass
        first.close()  # parked at the gate
    resumed = tracing.TurnTrace(LOOP)
    with resumed.advance(open_turn(turn_id, first.recorded, gate)):
        pass
    resumed.close()
    agents = {ids(s)[1]: s for s in by_name(exported.get_finished_spans(), "invoke_agent")}
    before = agents.pop(hex_id(tracing.drive_span_id(turn_id, "")))
    after = agents.pop(hex_id(tracing.drive_span_id(turn_id, gate)))
    assert not agents
    assert parent_of(before) == parent_of(after) == hex_id(signal.get_span_context().span_id)
    assert [hex_id(link.context.span_id) for link in after.links] == [ids(before)[1]]
    assert [e.name for e in after.events] == ["turn.resumed"]
    assert after.start_time == 1_796_346_300_000_000_000  # the answer's time


def test_a_turn_started_without_a_trace_begins_one_that_a_continuing_drive_joins(
    exported: InMemorySpanExporter,
) -> None:
    turn_id = new_id()
    first = tracing.TurnTrace(LOOP)
    with first.advance(LoopHistory(loop_id=LOOP), turn_id):  # e.g. a signal sent again: no context
        pass
    first.drop()
    trace_id, span_id = telemetry.ids_of(first.recorded)
    assert span_id == tracing.drive_span_id(turn_id, "")  # it records its own span: the trace's root
    later = tracing.TurnTrace(LOOP)
    with later.advance(open_turn(turn_id, first.recorded)):
        pass
    later.close()
    (agent,) = exported.get_finished_spans()
    assert agent.parent is None and (agent.context.trace_id, agent.context.span_id) == (trace_id, span_id)


@pytest.mark.parametrize(
    ("parts", "same"),
    [
        ((("t1", ""), ("t1", "")), True),
        ((("t1", ""), ("t1", "g1")), False),
        ((("t1", ""), ("t2", "")), False),
    ],
    ids=["same turn, same point", "after a gate", "another turn"],
)
def test_drive_span_ids_follow_the_turn_and_the_point_it_is_taken_up_from(
    parts: tuple[tuple[str, str], tuple[str, str]], same: bool
) -> None:
    a, b = (tracing.drive_span_id(*p) for p in parts)
    assert (a == b) is same and a != 0


@pytest.mark.parametrize(
    ("rests", "still_open", "ended"),
    [
        (True, True, True),  # parked at a gate: the drive after the answer has a span of its own
        (False, False, True),  # stopped after the turn's end was stored: nobody continues it
        (False, True, False),  # stopped mid-turn: the drive that continues the turn ends this span
    ],
    ids=["rests", "stopped-after-the-turn-ended", "stopped-mid-turn"],
)
def test_a_drive_ends_its_span_unless_another_drive_continues_the_turn(
    rests: bool, still_open: bool, ended: bool, exported: InMemorySpanExporter
) -> None:
    turn_id = new_id()
    trace = tracing.TurnTrace(LOOP)
    with trace.advance(LoopHistory(loop_id=LOOP), turn_id):
        pass
    latest = open_turn(turn_id, trace.recorded) if still_open else LoopHistory(loop_id=LOOP)
    trace.leave(latest, rests=rests)
    assert len(by_name(exported.get_finished_spans(), "invoke_agent")) == int(ended)
