"""OpenTelemetry tracing for every service: off unless the standard ``OTEL_*`` variables ask for it.

:func:`configure` turns tracing on when an OTLP endpoint is set (``OTEL_EXPORTER_OTLP_ENDPOINT`` or
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) and ``OTEL_TRACES_EXPORTER`` is not ``none``; the SDK reads
``OTEL_SERVICE_NAME``, ``OTEL_TRACES_SAMPLER`` and the batch-processor variables itself. While it is
off every helper here returns at once on the module flag :data:`ENABLED`: no SDK object is made on
the hot path and the SDK is not even imported.

W3C trace context travels in NATS headers (``traceparent``/``tracestate``) on every message between
services; :func:`inject` adds it, :func:`extract`/:func:`attached` read it. Span names and attributes
follow the OpenTelemetry GenAI and messaging semantic conventions (docs/observability.md lists them).
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import os
import socket
import time
from collections.abc import Iterator, Mapping, MutableMapping, Sequence
from typing import Any, Final

ENABLED = False

# Attribute names (OpenTelemetry semantic conventions, GenAI and messaging).
GEN_AI_OPERATION: Final = "gen_ai.operation.name"
GEN_AI_PROVIDER: Final = "gen_ai.provider.name"
GEN_AI_AGENT_NAME: Final = "gen_ai.agent.name"
GEN_AI_CONVERSATION: Final = "gen_ai.conversation.id"
GEN_AI_REQUEST_MODEL: Final = "gen_ai.request.model"
GEN_AI_INPUT_TOKENS: Final = "gen_ai.usage.input_tokens"
GEN_AI_OUTPUT_TOKENS: Final = "gen_ai.usage.output_tokens"
GEN_AI_FINISH_REASONS: Final = "gen_ai.response.finish_reasons"
GEN_AI_TOOL_NAME: Final = "gen_ai.tool.name"
GEN_AI_TOOL_CALL_ID: Final = "gen_ai.tool.call.id"
GEN_AI_TOOL_TYPE: Final = "gen_ai.tool.type"
MESSAGING_SYSTEM: Final = "messaging.system"
MESSAGING_OPERATION: Final = "messaging.operation.name"
MESSAGING_DESTINATION: Final = "messaging.destination.name"
MESSAGING_BATCH_COUNT: Final = "messaging.batch.message_count"
ERROR_TYPE: Final = "error.type"
# loopwire's own coordinates.
LW_LOOP_ID: Final = "loopwire.loop_id"
LW_TURN_ID: Final = "loopwire.turn_id"
LW_STEP_ID: Final = "loopwire.step_id"
LW_EXECUTION_ID: Final = "loopwire.tool_execution_id"
LW_STREAM_SEQ: Final = "loopwire.stream_sequence"
LW_ERROR_KIND: Final = "loopwire.error.kind"
# The chat span's context management (docs/context.md): the request's counted input tokens, before
# the loop's context strategy and as sent, and the tool results it cleared.
LW_CONTEXT_TOKENS: Final = "loopwire.context.tokens"
LW_CONTEXT_FULL_TOKENS: Final = "loopwire.context.full_tokens"
LW_CONTEXT_CLEARED: Final = "loopwire.context.cleared_results"

_tracer: Any = None


def tracing_requested(env: Mapping[str, str] | None = None) -> bool:
    e = os.environ if env is None else env
    if e.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if e.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() == "none":
        return False
    return bool(
        e.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip() or e.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
    )


def configure(service: str) -> bool:
    """Install the SDK with a batching OTLP/HTTP exporter when the environment asks for it."""
    global ENABLED, _tracer
    if ENABLED or not tracing_requested():
        return ENABLED
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    name = os.environ.get("OTEL_SERVICE_NAME", "").strip() or f"loopwire-{service}"
    provider = make_provider(name, BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    _tracer = trace.get_tracer("loopwire")
    ENABLED = True
    return True


def make_provider(service_name: str, processor: Any) -> Any:
    """A tracer provider as the services have, its spans going to ``processor``: random ids, but for
    a span started with ids of its own (:func:`start_span`, a keyed :func:`span`)."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

    class ChosenIds(RandomIdGenerator):
        def generate_span_id(self) -> int:
            return _chosen.get()[1] or super().generate_span_id()

        def generate_trace_id(self) -> int:
            return _chosen.get()[0] or super().generate_trace_id()

    instance = f"{socket.gethostname()}-{os.getpid()}"
    provider = TracerProvider(
        resource=Resource.create({"service.name": service_name, "service.instance.id": instance}),
        id_generator=ChosenIds(),
    )
    provider.add_span_processor(processor)
    return provider


def shutdown() -> None:
    """Flush spans still queued (a graceful stop); a no-op when tracing is off."""
    if not ENABLED:
        return
    from opentelemetry import trace

    provider: Any = trace.get_tracer_provider()
    if hasattr(provider, "shutdown"):
        provider.shutdown()


class _NoSpan:
    """What span helpers yield while tracing is off: every method is a no-op."""

    def set_attribute(self, key: str, value: Any) -> None:
        pass

    def set_attributes(self, attributes: Mapping[str, Any]) -> None:
        pass

    def add_event(self, name: str, attributes: Mapping[str, Any] | None = None) -> None:
        pass

    def is_recording(self) -> bool:
        return False


NO_SPAN: Final = _NoSpan()
NULL: Final = contextlib.nullcontext(NO_SPAN)


# --- context propagation over NATS headers ---------------------------------------------------------


def inject(headers: MutableMapping[str, str]) -> MutableMapping[str, str]:
    """Add the current trace context (``traceparent``/``tracestate``) to ``headers``."""
    if ENABLED:
        from opentelemetry import propagate

        propagate.inject(headers)
    return headers


def inject_span(s: Any, headers: MutableMapping[str, str]) -> MutableMapping[str, str]:
    """Add the context of span ``s`` (not necessarily current) to ``headers``."""
    if ENABLED:
        from opentelemetry import propagate, trace

        propagate.inject(headers, context=trace.set_span_in_context(s))
    return headers


def headers_or_none(headers: dict[str, str] | None = None) -> dict[str, str] | None:
    """``headers`` plus the trace context, or None when both are empty (the cheapest publish)."""
    if not ENABLED:
        return headers or None
    out = inject(dict(headers or {}))
    return dict(out) or None


def extract(headers: Mapping[str, str] | None) -> Any:
    """The remote context in ``headers`` (None when tracing is off or there is none)."""
    if not ENABLED or not headers:
        return None
    from opentelemetry import propagate

    return propagate.extract(dict(headers))


def attached(headers: Mapping[str, str] | None) -> contextlib.AbstractContextManager[Any]:
    """Make the trace context carried by a message's headers current for the block."""
    if not ENABLED or not headers:
        return NULL
    return _attached(headers)


@contextlib.contextmanager
def _attached(headers: Mapping[str, str]) -> Iterator[None]:
    from opentelemetry import context

    token = context.attach(extract(headers))
    try:
        yield
    finally:
        context.detach(token)


def traceparent() -> str:
    """The current span's W3C ``traceparent`` ("" when tracing is off or no span is recording)."""
    if not ENABLED:
        return ""
    carrier: dict[str, str] = {}
    inject(carrier)
    return carrier.get("traceparent", "")


def context_of(tp: str) -> Any:
    """A context whose parent is the span a ``traceparent`` names (None when off or unreadable)."""
    if not ENABLED or not tp:
        return None
    from opentelemetry import propagate, trace

    ctx = propagate.extract({"traceparent": tp})
    return ctx if trace.get_current_span(ctx).get_span_context().is_valid else None


# --- spans ----------------------------------------------------------------------------------------

# (trace id, span id) for the next span started: set only around one start (see start_span).
_chosen: contextvars.ContextVar[tuple[int, int]] = contextvars.ContextVar("loopwire_chosen_ids", default=(0, 0))
# Where keyed spans left by a cancellation go (see span() and holding()); None: they end there.
_holder: contextvars.ContextVar[list[tuple[Any, int]] | None] = contextvars.ContextVar(
    "loopwire_span_holder", default=None
)


def derived_span_id(*parts: str) -> int:
    """A span id made from what the span works on: the same work gets the same id in every process,
    so a process that continues work another one left (it died) continues its span too."""
    digest = hashlib.blake2b("/".join(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") or 1


def ids_of(tp: str) -> tuple[int, int]:
    """(trace id, span id) of a ``traceparent``; (0, 0) when it is not one."""
    parts = tp.split("-")
    if len(parts) != 4 or len(parts[1]) != 32 or len(parts[2]) != 16:
        return 0, 0
    try:
        return int(parts[1], 16), int(parts[2], 16)
    except ValueError:
        return 0, 0


def traceparent_of(trace_id: int, span_id: int) -> str:
    """The ``traceparent`` of a sampled span."""
    return f"00-{trace_id:032x}-{span_id:016x}-01"


def start_span(
    name: str,
    *,
    attributes: Mapping[str, Any] | None = None,
    parent: Any = None,
    links: Sequence[str] = (),
    span_id: int = 0,
    root_of: int = 0,
    start_ns: int = 0,
) -> Any:
    """An INTERNAL span the caller makes current (:func:`using`) and ends — or never ends, so it is
    never exported. ``parent``: a context (else the current one); ``span_id``: its id (else random);
    ``root_of``: a trace id: the span has no parent and begins that trace; ``start_ns``: its start
    (else now). None while tracing is off."""
    if not ENABLED:
        return None
    from opentelemetry.context import Context
    from opentelemetry.trace import SpanKind

    token = _chosen.set((root_of, span_id))
    try:
        return _tracer.start_span(
            name,
            context=Context() if root_of else parent,
            kind=SpanKind.INTERNAL,
            attributes=dict(attributes or {}),
            links=_links(links),
            start_time=start_ns or None,
            record_exception=False,
            set_status_on_exception=False,
        )
    finally:
        _chosen.reset(token)


def using(s: Any) -> contextlib.AbstractContextManager[Any]:
    """Make span ``s`` (from :func:`start_span`) current for the block without ending it."""
    if not ENABLED or s is None:
        return NULL
    from opentelemetry import trace

    return trace.use_span(s, end_on_exit=False, record_exception=False, set_status_on_exception=False)


def span_ids(s: Any) -> tuple[str, str]:
    """(trace id, span id) of span ``s`` in hex, or ("", "")."""
    if not ENABLED or s is None:
        return "", ""
    sc = s.get_span_context()
    if not sc.is_valid:
        return "", ""
    return format(sc.trace_id, "032x"), format(sc.span_id, "016x")


@contextlib.contextmanager
def holding(held: list[tuple[Any, int]]) -> Iterator[None]:
    """Keyed spans a cancellation cuts short inside the block are not ended but put in ``held``
    (with the time they were cut), for the owner of the block to end or drop."""
    token = _holder.set(held)
    try:
        yield
    finally:
        _holder.reset(token)


def span(
    name: str,
    *,
    kind: str = "internal",
    attributes: Mapping[str, Any] | None = None,
    parent: Any = None,
    links: Sequence[str] = (),
    key: str = "",
) -> contextlib.AbstractContextManager[Any]:
    """A span around a block (current inside it); ``parent`` a context, ``links`` traceparents.

    An exception leaving the block marks the span as an error (``error.type`` = its class name).
    ``key``: the span's id is derived from its parent's and the key, so work that another process
    takes up again under the same parent (a call of a step it continues) gets the same span; and a
    cancellation that cuts it short inside :func:`holding` leaves it to the holder.
    """
    if not ENABLED:
        return NULL
    return _span(name, kind, attributes, parent, links, key)


def _links(links: Sequence[str]) -> list[Any]:
    from opentelemetry import trace
    from opentelemetry.trace import Link

    out = []
    for tp in links:
        ctx = context_of(tp)
        if ctx is not None:
            out.append(Link(trace.get_current_span(ctx).get_span_context()))
    return out


@contextlib.contextmanager
def _span(
    name: str, kind: str, attributes: Mapping[str, Any] | None, parent: Any, links: Sequence[str], key: str
) -> Iterator[Any]:
    from opentelemetry import trace
    from opentelemetry.trace import SpanKind, Status, StatusCode

    span_id = 0
    if key:
        above = trace.get_current_span(parent).get_span_context()
        span_id = derived_span_id(format(above.span_id, "016x"), key) if above.is_valid else 0
    token = _chosen.set((0, span_id))
    try:
        s = _tracer.start_span(
            name,
            context=parent,
            kind=getattr(SpanKind, kind.upper()),
            attributes=dict(attributes or {}),
            links=_links(links),
            record_exception=False,
            set_status_on_exception=False,
        )
    finally:
        _chosen.reset(token)
    with trace.use_span(s, end_on_exit=False, record_exception=False, set_status_on_exception=False):
        try:
            yield s
        except BaseException as e:
            # Cancellation (an interrupt, a lost lease, a stop) is an end of work, not a failure.
            if isinstance(e, Exception):
                s.set_attribute(ERROR_TYPE, type(e).__name__)
                s.set_status(Status(StatusCode.ERROR, str(e)[:200]))
            else:
                held = _holder.get() if key else None
                if held is not None:
                    held.append((s, time.time_ns()))
                    raise
            s.end()
            raise
    s.end()


def set_error(s: Any, error_type: str, message: str = "") -> None:
    """Mark span ``s`` as failed (e.g. a tool's error result) with ``error.type``."""
    if not ENABLED or s is NO_SPAN:
        return
    from opentelemetry.trace import Status, StatusCode

    s.set_attribute(ERROR_TYPE, error_type)
    s.set_status(Status(StatusCode.ERROR, message[:200]))


def add_event(name: str, attributes: Mapping[str, Any] | None = None) -> None:
    """An event on the current span (e.g. a gate wait)."""
    if not ENABLED:
        return
    from opentelemetry import trace

    trace.get_current_span().add_event(name, dict(attributes or {}))


def current_span() -> Any:
    """The current span (``NO_SPAN`` while tracing is off), e.g. for a tool to add attributes."""
    if not ENABLED:
        return NO_SPAN
    from opentelemetry import trace

    return trace.get_current_span()


def current_ids() -> tuple[str, str]:
    """(trace id, span id) of the current span in hex, or ("", "")."""
    if not ENABLED:
        return "", ""
    from opentelemetry import trace

    sc = trace.get_current_span().get_span_context()
    if not sc.is_valid:
        return "", ""
    return format(sc.trace_id, "032x"), format(sc.span_id, "016x")
