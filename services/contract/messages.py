"""The AsyncAPI document's messages (components.messages) and the NATS headers they carry."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from services.contract import chainheaders
from services.contract.catalog import API_TYPES, COMMIT_TYPES, CONTROL_NAMES, DESCRIPTIONS
from shared import subjects
from shared.events import CLASSIFICATION, ENDURING_TYPES, EVENT_TYPES


def _header_schema(props: Mapping[str, tuple[str, str]], required: Iterable[str] = ()) -> dict[str, Any]:
    schema: dict[str, Any] = {
        "type": "object",
        "properties": {k: {"type": t, "description": d} for k, (t, d) in props.items()},
    }
    req = list(required)
    if req:
        schema["required"] = req
    return schema


def history_headers() -> dict[str, Any]:
    """Headers of an event appended to the history stream (the chain's are on every stored record)."""
    schema = _header_schema(
        {
            subjects.H_MSG_ID: ("string", "the event_id (JetStream de-duplication key)"),
            subjects.H_EXPECTED_LAST_SUBJECT_SEQ: ("string", "optimistic concurrency: the loop's last sequence"),
            subjects.H_EXPECTED_STREAM: ("string", "the history stream's name (a misrouted append fails)"),
            subjects.H_BATCH_ID: ("string", "atomic batch id (several events in one commit)"),
            subjects.H_BATCH_SEQ: ("string", "position in the atomic batch, from 1"),
            subjects.H_BATCH_COMMIT: ("string", "1 on the last message of an atomic batch"),
            **chainheaders.PROPERTIES,
        },
        [subjects.H_MSG_ID, *chainheaders.PROPERTIES],
    )
    schema["description"] = chainheaders.RULE
    return schema


def call_headers() -> dict[str, Any]:
    """Headers of a tool call."""
    return _header_schema(
        {
            subjects.H_LOOP_ID: ("string", "loop id"),
            subjects.H_TURN_ID: ("string", "turn id"),
            subjects.H_STEP_ID: ("string", "step id"),
            subjects.H_TOOL_USE_ID: ("string", "the model's tool_use id"),
            subjects.H_EXECUTION_ID: ("string", "tool_execution_id (cancel it on {prefix}.toolctl.<id>)"),
            subjects.H_IDEMPOTENCY_KEY: ("string", "<loop_id>:<step_id>:<tool_use_id>"),
            subjects.H_DEADLINE: ("string", "deadline, unix milliseconds"),
            subjects.H_START_BY: ("string", "unix milliseconds after which the call must not start (caller's lease)"),
            subjects.H_FIRST_SEND: (
                "string",
                '"1": no earlier attempt of this execution id exists (the worker skips reading its record)',
            ),
            subjects.H_NO_RECORD: (
                "string",
                '"1": the caller never reads this call\'s record (a step with no plan): a read-only tool writes none',
            ),
            subjects.H_TRACEPARENT: ("string", "W3C trace context"),
        },
        [subjects.H_LOOP_ID, subjects.H_EXECUTION_ID, subjects.H_DEADLINE],
    )


def reply_headers() -> dict[str, Any]:
    """Headers of a tool call's reply."""
    return _header_schema(
        {
            subjects.H_REPLY_KIND: ("string", "progress | result | error (ToolReplyKind)"),
            subjects.H_WORKER_ID: ("string", "the answering worker"),
        },
        [subjects.H_REPLY_KIND],
    )


def _schema_ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _event_messages() -> dict[str, Any]:
    """One message per event type; an enduring one carries the history headers."""
    headers = history_headers()
    messages: dict[str, Any] = {}
    for name, cls in EVENT_TYPES.items():
        klass, _scope, profile, ends = CLASSIFICATION[cls]
        summary = f"{klass.value} event, identity profile {profile.value}" + (", ends a turn" if ends else "")
        msg: dict[str, Any] = {
            "name": name,
            "title": name,
            "summary": summary,
            "contentType": "application/json",
            "payload": _schema_ref(name),
        }
        if name in ENDURING_TYPES:
            msg["headers"] = headers
        messages[name] = msg
    return messages


def _plain(name: str, summary: str, payload: dict[str, Any], headers: dict[str, Any] | None = None) -> dict[str, Any]:
    m: dict[str, Any] = {"name": name, "title": name, "summary": summary, "contentType": "application/json"}
    if headers is not None:
        m["headers"] = headers
    m["payload"] = payload
    return m


def _protocol_messages() -> list[dict[str, Any]]:
    """Commit and loop-API requests and replies, the live frame and the work signal."""
    out = [_plain(t.__name__, DESCRIPTIONS[t.__name__], _schema_ref(t.__name__)) for t in (*COMMIT_TYPES, *API_TYPES)]
    out.append(
        _plain(
            "LiveFrame",
            DESCRIPTIONS["LiveFrame"],
            {"type": "array", "minItems": 1, "items": _schema_ref("EphemeralEvent")},
        )
    )
    out.append(
        _plain(
            "ControlRecord",
            DESCRIPTIONS["ControlRecord"],
            {"anyOf": [_schema_ref(name) for name in CONTROL_NAMES]},
        )
    )
    out.append(_plain("WorkSignal", "Empty JetStream message: the loop has work (at most one pending per loop).", {}))
    tip = _plain(
        "ChainTip",
        "Core NATS, from a committer to the others: '<seq> <index> <digest>' (ASCII), the chain link of the "
        "loop's record it just stored at stream sequence seq. Only a speed-up: an append after that record "
        "needs no read of it.",
        {"type": "string", "pattern": "^[0-9]+ [1-9][0-9]* [0-9a-f]{64}$"},
    )
    tip["contentType"] = "text/plain"
    out.append(tip)
    out.append(_plain("PresenceRequest", "Empty core NATS request: which services are running?", {}))
    out.append(
        _plain(
            "Presence",
            "A running service's answer: its name, the shard count it runs with, its process id and host.",
            {
                "type": "object",
                "properties": {
                    "service": {"type": "string"},
                    "shards": {"type": "integer", "minimum": 1},
                    "pid": {"type": "integer"},
                    "host": {"type": "string"},
                },
                "required": ["service", "shards", "pid", "host"],
            },
        )
    )
    return out


def _tool_messages() -> list[dict[str, Any]]:
    """A tool call, its replies and its cancel."""
    replies = reply_headers()
    return [
        _plain(
            "ToolCall",
            "A tool call: the body is the raw argument JSON (validated against the tool's input_schema).",
            {"type": "object", "description": "the tool's arguments"},
            call_headers(),
        ),
        _plain("ToolProgress", DESCRIPTIONS["ProgressBody"], _schema_ref("ProgressBody"), replies),
        _plain("ToolResult", DESCRIPTIONS["ResultBody"], _schema_ref("ResultBody"), replies),
        _plain("ToolError", DESCRIPTIONS["ToolErrorBody"], _schema_ref("ToolErrorBody"), replies),
        _plain(
            "ToolCancel",
            "Cancels the call with that execution id, wherever it runs. The body is the attempt to cancel "
            "(the caller's reply subject); an empty body cancels any attempt.",
            {},
        ),
    ]


def _record_messages() -> list[dict[str, Any]]:
    """KV values (registrations, leases, call records, step plans) and the liveness pings."""
    return [
        _plain("ToolRegistration", DESCRIPTIONS["Registration"], _schema_ref("Registration")),
        _plain(
            "LoopLease",
            "KV value: the holder of a loop's lease, '<liveness token> <host>:<pid>'; created with the bucket's TTL.",
            {"type": "string"},
        ),
        _plain("ToolCallRecord", DESCRIPTIONS["CallRecord"], _schema_ref("CallRecord")),
        _plain("StepPlanRecord", DESCRIPTIONS["StepPlan"], _schema_ref("StepPlan")),
        _plain("MemoryNote", "KV value: a kv_memory note (UTF-8 text).", {"type": "string"}),
        _plain("WorkerPing", "Empty request: does this tool worker still exist? (empty reply)", {}),
        _plain("LeaseHolderPing", "Empty request: is this lease holder's connection alive? (empty reply)", {}),
    ]


def messages() -> dict[str, Any]:
    """components.messages: every event, then every other message, by name."""
    out = _event_messages()
    for m in (*_protocol_messages(), *_tool_messages(), *_record_messages()):
        out[m["name"]] = m
    return out
