"""Prometheus metrics of every service, served on ``/metrics`` when ``LW_METRICS_PORT`` is set.

Off by default: until :func:`serve` runs, :data:`ENABLED` is false and the recording helpers return
at once. Histograms carry the current trace as an OpenMetrics exemplar when tracing is on.
Names follow Prometheus conventions (``loopwire_..._total``, ``_seconds``, base units);
docs/observability.md lists them all.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from shared import telemetry

log = logging.getLogger("loopwire.metrics")

ENABLED = False
REGISTRY: Final = CollectorRegistry(auto_describe=True)

_LATENCY_BUCKETS: Final = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

STEPS_COMMITTED: Final = Counter(
    "loopwire_steps_committed", "StepDone records appended to history by the committer", registry=REGISTRY
)
EVENTS_COMMITTED: Final = Counter(
    "loopwire_events_committed", "Records appended to history, by event type", ["type"], registry=REGISTRY
)
COMMIT_SECONDS: Final = Histogram(
    "loopwire_commit_duration_seconds",
    "Time to validate and append one commit request (committer) or to get it acknowledged (model-step)",
    ["service"],
    buckets=_LATENCY_BUCKETS,
    registry=REGISTRY,
)
COMMIT_ERRORS: Final = Counter(
    "loopwire_commit_errors", "Commit requests answered with an error, by error kind", ["kind"], registry=REGISTRY
)
APPENDS_RETRIED: Final = Counter(
    "loopwire_appends_retried", "JetStream appends the committer retried (unavailable, elections)", registry=REGISTRY
)
TURNS: Final = Counter(
    "loopwire_turns", "Turns ended, by outcome (done, failed, interrupted)", ["outcome"], registry=REGISTRY
)
GATES_OPENED: Final = Counter("loopwire_gates_opened", "Gates opened (permission, user input)", registry=REGISTRY)
GATES_RESOLVED: Final = Counter("loopwire_gates_resolved", "Gates resolved by an operator", registry=REGISTRY)
MODEL_SECONDS: Final = Histogram(
    "loopwire_model_request_duration_seconds",
    "One model request, first byte sent to last chunk received",
    ["model"],
    buckets=_LATENCY_BUCKETS,
    registry=REGISTRY,
)
MODEL_TOKENS: Final = Counter(
    "loopwire_model_tokens",
    "Tokens reported by the model, by direction (input, output)",
    ["model", "direction"],
    registry=REGISTRY,
)
MODEL_COST: Final = Counter(
    "loopwire_model_cost_usd",
    "Cost of model responses in USD, from the price table (docs/budgets.md); unpriced models count 0",
    ["model"],
    registry=REGISTRY,
)
BUDGET_STOPS: Final = Counter(
    "loopwire_budget_stops",
    "Model steps a loop's budget stopped, by exhausted limit and outcome (fail, ask)",
    ["limit", "outcome"],
    registry=REGISTRY,
)
CONTEXT_CLEARED_TOKENS: Final = Counter(
    "loopwire_context_cleared_tokens",
    "Input tokens a loop's context strategy kept out of model requests (docs/context.md), by strategy",
    ["strategy"],
    registry=REGISTRY,
)
TOOL_SECONDS: Final = Histogram(
    "loopwire_tool_call_duration_seconds",
    "One tool call, on the caller (model-step) and on the worker",
    ["tool", "side"],
    buckets=_LATENCY_BUCKETS,
    registry=REGISTRY,
)
TOOL_CALLS: Final = Counter(
    "loopwire_tool_calls",
    "Tool calls finished, by outcome (ok, error, or the failure kind)",
    ["tool", "side", "outcome"],
    registry=REGISTRY,
)
TOOL_IN_FLIGHT: Final = Gauge(
    "loopwire_tool_calls_in_flight", "Tool calls running now", ["tool", "side"], registry=REGISTRY
)
GATES_OPEN: Final = Gauge(
    "loopwire_gates_open", "Gates this committer saw opened minus resolved since it started", registry=REGISTRY
)
WORK_PENDING: Final = Gauge(
    "loopwire_work_signals_pending", "Work signals waiting in the work stream's consumer", registry=REGISTRY
)
# 1 once the service serves (READY printed); what compose.yaml's health checks ask for.
READY: Final = Gauge("loopwire_ready", "1 once the service has started and serves", registry=REGISTRY)
LOOPS_DRIVEN: Final = Gauge("loopwire_loops_driven", "Loops this model-step replica drives now", registry=REGISTRY)
LOOPS_WAITING: Final = Gauge(
    "loopwire_loops_waiting",
    "Loops of this model-step replica waiting on long tool calls with their drive slot given back",
    registry=REGISTRY,
)
LEASE_TAKEOVERS: Final = Counter(
    "loopwire_lease_takeovers", "Loop leases taken over from a replica that is gone", registry=REGISTRY
)

_TURN_OUTCOMES: Final = {"TurnDone": "done", "TurnFailed": "failed", "TurnInterrupted": "interrupted"}


def serve(port: int, addr: str = "0.0.0.0") -> bool:
    """Serve ``/metrics`` on ``port`` (0 = off) and start recording."""
    global ENABLED
    if port <= 0:
        return False
    try:
        start_http_server(port, addr=addr, registry=REGISTRY)
    except OSError as e:  # metrics are an aid: a taken port must not stop the service's real work
        log.error("cannot serve metrics on port %d (%s); metrics are off", port, e)
        return False
    ENABLED = True
    log.info("metrics on http://%s:%d/metrics", addr, port)
    return True


def _exemplar() -> dict[str, str] | None:
    trace_id, span_id = telemetry.current_ids()
    return {"trace_id": trace_id, "span_id": span_id} if trace_id else None


def observe(h: Histogram, seconds: float, *labels: str) -> None:
    if not ENABLED:
        return
    (h.labels(*labels) if labels else h).observe(seconds, exemplar=_exemplar())


def committed(types: Iterable[str]) -> None:
    """Count the records of one successful append (by the committer)."""
    if not ENABLED:
        return
    for t in types:
        EVENTS_COMMITTED.labels(t).inc()
        if t == "StepDone":
            STEPS_COMMITTED.inc()
        elif t in _TURN_OUTCOMES:
            TURNS.labels(_TURN_OUTCOMES[t]).inc()
        elif t == "GateOpened":
            GATES_OPENED.inc()
            GATES_OPEN.inc()
        elif t == "GateResolved":
            GATES_RESOLVED.inc()
            GATES_OPEN.dec()


def inc(c: Counter, *labels: str, amount: float = 1.0) -> None:
    if ENABLED:
        (c.labels(*labels) if labels else c).inc(amount)


def gauge_add(g: Gauge, amount: float, *labels: str) -> None:
    if ENABLED:
        (g.labels(*labels) if labels else g).inc(amount)


def gauge_set(g: Gauge, value: float) -> None:
    if ENABLED:
        g.set(value)
