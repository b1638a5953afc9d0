"""The published contract, generated from the code: JSON Schemas of every wire type and an AsyncAPI 3 document.

``loopwire schema --out schemas --asyncapi docs/asyncapi.yaml`` writes both; ``--check`` compares
them with the files instead (the test suite does the same, so the checked-in contract never drifts
from the msgspec types). Everything here is deterministic: the same code gives the same bytes.
"""

from __future__ import annotations

import functools
import json
import operator
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Annotated, Any, Final

import msgspec

from services.toolwire import protocol as tool_protocol
from services.toolwire.spec import Registration, ToolSpec
from shared import protocol, subjects
from shared.errors import Rule
from shared.events import CLASSIFICATION, ENDURING_TYPES, EPHEMERAL_TYPES, EVENT_TYPES, Event
from shared.results import CallRecord, StepPlan

from . import schema_rules

# Hand-written test records under schemas/ (not generated; see tests/unit/test_conformance.py).
CONFORMANCE_DIR: Final = "conformance"
JSON_SCHEMA_DIALECT: Final = "https://json-schema.org/draft/2020-12/schema"
ASYNCAPI_VERSION: Final = "3.0.0"
CONTRACT_VERSION: Final = "1.0.0"  # envelope v1

# Every message type outside the events, by schema group (= folder under schemas/).
COMMIT_TYPES: Final[tuple[type[msgspec.Struct], ...]] = (protocol.CommitRequest, protocol.CommitReply)
API_TYPES: Final[tuple[type[msgspec.Struct], ...]] = (
    protocol.StartRequest,
    protocol.InputRequest,
    protocol.AnswerRequest,
    protocol.InterruptRequest,
    protocol.CloseRequest,
    protocol.ForkRequest,
    protocol.BudgetRequest,
    protocol.ApiReply,
)
TOOL_TYPES: Final[tuple[type[msgspec.Struct], ...]] = (
    ToolSpec,
    Registration,
    tool_protocol.ResultBody,
    tool_protocol.ProgressBody,
    tool_protocol.ToolErrorBody,
    CallRecord,
    StepPlan,
)
_FILE_NAME: Final = {"ToolErrorBody": "ErrorBody"}


def _union(classes: Iterable[type[Event]]) -> Any:
    return functools.reduce(operator.or_, classes)


ENDURING_UNION: Final = _union(c for c in CLASSIFICATION if c.__name__ in ENDURING_TYPES)
EPHEMERAL_UNION: Final = _union(c for c in CLASSIFICATION if c.__name__ in EPHEMERAL_TYPES)
LIVE_FRAME: Final = Annotated[list[EPHEMERAL_UNION], msgspec.Meta(min_length=1)]  # type: ignore[valid-type]
ANY_UNION: Final = _union(CLASSIFICATION)

DESCRIPTIONS: Final[dict[str, str]] = {
    "EnduringEvent": "Any enduring event as stored in the history stream: the durable envelope "
    '(the event\'s fields plus "type" and "v": 1).',
    "EphemeralEvent": "Any ephemeral event, as one element of a live frame (may be dropped).",
    "LiveFrame": "A message on {prefix}.live.{loop_id}: one or more ephemeral events of the loop, oldest first "
    "(a frame holds at most ~50 ms of the loop's events, and a step's events go out before the step is committed).",
    "AnyEvent": "Any event of either class.",
    "CommitRequest": "Request on {prefix}.commit.{loop_id}: append events (all or none) after expected_last_seq "
    "(0 for a new loop). Each element of events is one durable envelope.",
    "CommitReply": "Reply to a commit: ok with the stored sequences, or an error.",
    "StartRequest": "Request on {prefix}.api.{loop_id}.start.",
    "InputRequest": "Request on {prefix}.api.{loop_id}.input: exactly one of text and message.",
    "AnswerRequest": "Request on {prefix}.api.{loop_id}.answer: answer an open gate.",
    "InterruptRequest": "Request on {prefix}.api.{loop_id}.interrupt: end the running turn.",
    "CloseRequest": "Request on {prefix}.api.{loop_id}.close: close the loop.",
    "ForkRequest": "Request on {prefix}.api.{loop_id}.fork, where loop_id is the NEW loop's id: a loop made of "
    "source_loop_id's records up to the fork point at (a valid point; default the last), with the overrides.",
    "BudgetRequest": "Request on {prefix}.api.{loop_id}.budget: replace the loop's budget (committed as "
    "BudgetChanged; checked before its next model step).",
    "ApiReply": "Reply to every loop-API request.",
    "ErrorBody": "The error of a failed reply; kind is one of ErrorKind.",
    "ToolSpec": "What a tool declares about itself (registered in KV {prefix}_tools, shown to the model).",
    "Registration": "KV value under {prefix}_tools key <tool_name>.<worker_id> while a worker serves the tool.",
    "ResultBody": "Final reply of a tool call that ran (Lw-Reply: result).",
    "ProgressBody": "Heartbeat or progress reply of a running tool call (Lw-Reply: progress).",
    "ToolErrorBody": "Final reply of a tool call that did not complete on the worker (Lw-Reply: error).",
    "CallRecord": "KV value under {prefix}_results key tool.<tool_name>.<execution_id>: state started (written "
    "before a tool that is neither read-only nor idempotent begins) or done (with the final reply kind and body, "
    "written before the reply is sent); args_digest = hex BLAKE2b-128 of the argument bytes.",
    "StepPlan": "KV value under {prefix}_results key step.<step_id>: a step's model decision, written before "
    "any of its calls is sent; a re-run of the step continues it instead of asking the model again.",
}


# --- JSON Schemas -------------------------------------------------------------------------------


def _components(types: Iterable[Any], ref_template: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """msgspec's schemas of ``types`` and their definitions, refined by :mod:`services.cli.schema_rules`."""
    tops, defs = msgspec.json.schema_components(list(types), ref_template=ref_template)
    defs = schema_rules.refine(defs, lambda name: ref_template.format(name=name))
    return schema_rules.strip_discriminators(list(tops)), defs


def _commit_events_items(defs: dict[str, Any], union_schema: dict[str, Any]) -> None:
    """CommitRequest.events is raw JSON in the code (validated one by one): document it as envelopes."""
    props = defs["CommitRequest"]["properties"]["events"]
    props["items"] = union_schema
    props["description"] = "Durable envelopes of enduring events, in order."
    defs["CommitRequest"]["properties"]["chain"]["description"] = (
        "Store the events one by one, each right after the one before, up to the first whose expected "
        "sequence fails (the reply's seqs are the stored ones), instead of all or none."
    )


def standalone_schema(name: str, type_: Any) -> dict[str, Any]:
    """One self-contained JSON Schema (draft 2020-12) for ``type_``."""
    extra = [ENDURING_UNION] if type_ is protocol.CommitRequest else []
    tops, defs = _components([type_, *extra], "#/$defs/{name}")
    if extra:
        _commit_events_items(defs, tops[1])
    doc: dict[str, Any] = {"$schema": JSON_SCHEMA_DIALECT, "title": name}
    if name in DESCRIPTIONS:
        doc["description"] = DESCRIPTIONS[name]
    doc.update(tops[0])
    doc["$defs"] = schema_rules.reachable([tops[0]], defs, lambda n: f"#/$defs/{n}")
    return doc


def schema_files() -> dict[str, dict[str, Any]]:
    """Relative path under schemas/ → schema, for every event and protocol message."""
    files: dict[str, dict[str, Any]] = {}
    for name, cls in EVENT_TYPES.items():
        files[f"events/{name}.json"] = standalone_schema(name, cls)
    files["events/EnduringEvent.json"] = standalone_schema("EnduringEvent", ENDURING_UNION)
    files["events/EphemeralEvent.json"] = standalone_schema("EphemeralEvent", EPHEMERAL_UNION)
    files["events/LiveFrame.json"] = standalone_schema("LiveFrame", LIVE_FRAME)
    files["events/AnyEvent.json"] = standalone_schema("AnyEvent", ANY_UNION)
    for group, types in (("commit", COMMIT_TYPES), ("api", API_TYPES), ("tools", TOOL_TYPES)):
        for t in types:
            name = t.__name__
            files[f"{group}/{_FILE_NAME.get(name, name)}.json"] = standalone_schema(name, t)
    return dict(sorted(files.items()))


def dumps_json(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False) + "\n"


def render_schemas() -> dict[str, str]:
    """Relative path → file text (schemas plus an index.json listing them)."""
    files = schema_files()
    index = {
        "description": "JSON Schemas of loopwire's wire types, generated from the msgspec types "
        "(loopwire schema --out schemas). See docs/asyncapi.yaml for subjects and headers.",
        "envelope_version": 1,
        "files": sorted(files),
        "conformance": f"{CONFORMANCE_DIR}/valid and {CONFORMANCE_DIR}/invalid: records every implementation must "
        "accept / refuse (hand-written; see docs/protocol.md, Conformance corpus).",
    }
    out = {path: dumps_json(doc) for path, doc in files.items()}
    out["index.json"] = dumps_json(index)
    return out


# --- AsyncAPI -----------------------------------------------------------------------------------


def _enum(values: Iterable[str], description: str) -> dict[str, Any]:
    return {"type": "string", "enum": list(values), "description": description}


def _described(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {**schema, "description": description}


def _header_schema(props: Mapping[str, tuple[str, str]], required: Iterable[str] = ()) -> dict[str, Any]:
    schema: dict[str, Any] = {
        "type": "object",
        "properties": {k: {"type": t, "description": d} for k, (t, d) in props.items()},
    }
    req = list(required)
    if req:
        schema["required"] = req
    return schema


def _param(description: str, default: str | None = None) -> dict[str, Any]:
    p: dict[str, Any] = {"description": description}
    if default is not None:
        p["default"] = default
    return p


def _msg_ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/messages/{name}"}


def _chan_msg(channel: str, name: str) -> dict[str, str]:
    return {"$ref": f"#/channels/{channel}/messages/{name}"}


def _chan(channel: str) -> dict[str, str]:
    return {"$ref": f"#/channels/{channel}"}


def asyncapi_document() -> dict[str, Any]:
    """The AsyncAPI 3 document of every subject, message, header and error (generated)."""
    n = subjects.Names("{prefix}")  # addresses with the prefix as a parameter
    d = subjects.DEFAULT_NAMES  # stream and bucket names of the default prefix
    event_names = list(EVENT_TYPES)
    enduring = [e for e in event_names if e in ENDURING_TYPES]

    all_types: list[Any] = [*EVENT_TYPES.values(), *COMMIT_TYPES, *API_TYPES, *TOOL_TYPES]
    tops, defs = _components([*all_types, ENDURING_UNION, EPHEMERAL_UNION], "#/components/schemas/{name}")
    _commit_events_items(defs, tops[-2])
    schemas: dict[str, Any] = dict(sorted(defs.items()))
    schemas["EnduringEvent"] = {"description": DESCRIPTIONS["EnduringEvent"], **tops[-2]}
    schemas["EphemeralEvent"] = {"description": DESCRIPTIONS["EphemeralEvent"], **tops[-1]}
    for name, desc in DESCRIPTIONS.items():
        if name in schemas and "description" not in schemas[name]:
            schemas[name] = {"description": desc, **schemas[name]}
    schemas["ErrorKind"] = _described(
        schemas["ErrorKind"],
        "error.kind of a failed commit or loop-API reply: invalid (bad request or event; event/field/rule/index "
        "say which), conflict (expected_last_seq is stale; last_seq is the current one), unavailable (JetStream "
        "did not answer in time; retrying the same request is safe), too_large (over the record size limit), "
        "not_found (unknown loop or gate), closed (closed loop or gate).",
    )
    schemas["Rule"] = _enum(
        [r.value for r in Rule], "error.rule of an invalid event (with error.event and error.field)."
    )
    schemas["ToolReplyKind"] = _enum(
        [tool_protocol.REPLY_PROGRESS, tool_protocol.REPLY_RESULT, tool_protocol.REPLY_ERROR],
        f"{subjects.H_REPLY_KIND} header of a tool-call reply",
    )

    history_headers = _header_schema(
        {
            subjects.H_MSG_ID: ("string", "the event_id (JetStream de-duplication key)"),
            subjects.H_EXPECTED_LAST_SUBJECT_SEQ: ("string", "optimistic concurrency: the loop's last sequence"),
            subjects.H_EXPECTED_STREAM: ("string", "the history stream's name (a misrouted append fails)"),
            subjects.H_BATCH_ID: ("string", "atomic batch id (several events in one commit)"),
            subjects.H_BATCH_SEQ: ("string", "position in the atomic batch, from 1"),
            subjects.H_BATCH_COMMIT: ("string", "1 on the last message of an atomic batch"),
        },
        [subjects.H_MSG_ID],
    )
    call_headers = _header_schema(
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
    reply_headers = _header_schema(
        {
            subjects.H_REPLY_KIND: ("string", "progress | result | error (ToolReplyKind)"),
            subjects.H_WORKER_ID: ("string", "the answering worker"),
        },
        [subjects.H_REPLY_KIND],
    )

    messages: dict[str, Any] = {}
    for name in event_names:
        cls = EVENT_TYPES[name]
        klass, _scope, profile, ends = CLASSIFICATION[cls]
        summary = f"{klass.value} event, identity profile {profile.value}" + (", ends a turn" if ends else "")
        msg: dict[str, Any] = {
            "name": name,
            "title": name,
            "summary": summary,
            "contentType": "application/json",
            "payload": {"$ref": f"#/components/schemas/{name}"},
        }
        if name in ENDURING_TYPES:
            msg["headers"] = history_headers
        messages[name] = msg

    def plain(name: str, summary: str, payload: dict[str, Any], headers: dict[str, Any] | None = None) -> None:
        m: dict[str, Any] = {"name": name, "title": name, "summary": summary, "contentType": "application/json"}
        if headers is not None:
            m["headers"] = headers
        m["payload"] = payload
        messages[name] = m

    for t in (*COMMIT_TYPES, *API_TYPES):
        plain(t.__name__, DESCRIPTIONS[t.__name__], {"$ref": f"#/components/schemas/{t.__name__}"})
    plain(
        "LiveFrame",
        DESCRIPTIONS["LiveFrame"],
        {"type": "array", "minItems": 1, "items": {"$ref": "#/components/schemas/EphemeralEvent"}},
    )
    plain("WorkSignal", "Empty JetStream message: the loop has work (at most one pending per loop).", {})
    plain(
        "ToolCall",
        "A tool call: the body is the raw argument JSON (validated against the tool's input_schema).",
        {"type": "object", "description": "the tool's arguments"},
        call_headers,
    )
    plain("ToolProgress", DESCRIPTIONS["ProgressBody"], {"$ref": "#/components/schemas/ProgressBody"}, reply_headers)
    plain("ToolResult", DESCRIPTIONS["ResultBody"], {"$ref": "#/components/schemas/ResultBody"}, reply_headers)
    plain("ToolError", DESCRIPTIONS["ToolErrorBody"], {"$ref": "#/components/schemas/ToolErrorBody"}, reply_headers)
    plain(
        "ToolCancel",
        "Cancels the call with that execution id, wherever it runs. The body is the attempt to cancel "
        "(the caller's reply subject); an empty body cancels any attempt.",
        {},
    )
    plain("ToolRegistration", DESCRIPTIONS["Registration"], {"$ref": "#/components/schemas/Registration"})
    plain(
        "LoopLease",
        "KV value: the holder of a loop's lease, '<liveness token> <host>:<pid>'; created with the bucket's TTL.",
        {"type": "string"},
    )
    plain("ToolCallRecord", DESCRIPTIONS["CallRecord"], {"$ref": "#/components/schemas/CallRecord"})
    plain("StepPlanRecord", DESCRIPTIONS["StepPlan"], {"$ref": "#/components/schemas/StepPlan"})
    plain("WorkerPing", "Empty request: does this tool worker still exist? (empty reply)", {})
    plain("LeaseHolderPing", "Empty request: is this lease holder's connection alive? (empty reply)", {})

    loop_p = _param("loop id (canonical lowercase UUID)")
    prefix_p = _param("deployment prefix (LW_PREFIX)", "lw")
    channels: dict[str, Any] = {
        "history": {
            "address": n.hist("{loop_id}"),
            "title": "loop history",
            "description": f"JetStream stream {d.history_stream} (<PREFIX>_HISTORY): every enduring event of a loop, "
            "in order. Only the committer publishes here (enforced by NATS permissions). Read it with Direct Get "
            "or an ordered consumer (shared.history.replay).",
            "parameters": {"prefix": prefix_p, "loop_id": loop_p},
            "messages": {e: _msg_ref(e) for e in enduring},
        },
        "live": {
            "address": n.live("{loop_id}"),
            "title": "live events",
            "description": "Core NATS: a loop's ephemeral events while they happen, in live frames (may be dropped).",
            "parameters": {"prefix": prefix_p, "loop_id": loop_p},
            "messages": {"LiveFrame": _msg_ref("LiveFrame")},
        },
        "commit": {
            "address": n.commit("{loop_id}"),
            "title": "commit",
            "description": f"Core request/reply to the committer (queue group {subjects.COMMITTER_QUEUE}).",
            "parameters": {"prefix": prefix_p, "loop_id": loop_p},
            "messages": {"CommitRequest": _msg_ref("CommitRequest")},
        },
        "commitReply": {
            "address": None,
            "description": "The requester's inbox.",
            "messages": {"CommitReply": _msg_ref("CommitReply")},
        },
        "apiReply": {
            "address": None,
            "description": "The requester's inbox.",
            "messages": {"ApiReply": _msg_ref("ApiReply")},
        },
        "work": {
            "address": n.work("{loop_id}"),
            "title": "work signals",
            "description": f"JetStream work queue {d.work_stream} (<PREFIX>_WORK; one pending message per loop), "
            f"pulled by model-step replicas through the durable consumer {d.work_consumer} (<prefix>_model_step).",
            "parameters": {"prefix": prefix_p, "loop_id": loop_p},
            "messages": {"WorkSignal": _msg_ref("WorkSignal")},
        },
        "tool": {
            "address": n.tool("{tool_name}"),
            "title": "tool calls",
            "description": "Core request/reply to the tool's workers, queue group tool_<tool_name>. Several replies "
            "per call: progress heartbeats, then one result or error.",
            "parameters": {"prefix": prefix_p, "tool_name": _param("tool name, ^[A-Za-z0-9_-]{1,64}$")},
            "messages": {"ToolCall": _msg_ref("ToolCall")},
        },
        "toolReply": {
            "address": None,
            "description": "The caller's inbox.",
            "messages": {k: _msg_ref(k) for k in ("ToolProgress", "ToolResult", "ToolError")},
        },
        "toolControl": {
            "address": n.toolctl("{execution_id}"),
            "title": "tool-call cancel",
            "parameters": {"prefix": prefix_p, "execution_id": _param("tool_execution_id of the call")},
            "messages": {"ToolCancel": _msg_ref("ToolCancel")},
        },
        "toolRegistry": {
            "address": f"$KV.{n.tools_bucket}.{{tool_name}}.{{worker_id}}",
            "title": "tool registry",
            "description": f"JetStream KV bucket {d.tools_bucket} (<prefix>_tools): a worker's registration, "
            "refreshed while it serves, deleted on a graceful stop, expired by TTL otherwise.",
            "parameters": {
                "prefix": prefix_p,
                "tool_name": _param("tool name"),
                "worker_id": _param("worker id"),
            },
            "messages": {"ToolRegistration": _msg_ref("ToolRegistration")},
        },
        "leases": {
            "address": f"$KV.{n.leases_bucket}.{{loop_id}}",
            "title": "loop leases",
            "description": f"JetStream KV bucket {d.leases_bucket} (<prefix>_leases): which model-step replica "
            "drives a loop. It guards side effects (a drive acts only while it holds it); the commit's "
            "expected sequence is the fence.",
            "parameters": {"prefix": prefix_p, "loop_id": loop_p},
            "messages": {"LoopLease": _msg_ref("LoopLease")},
        },
        "callRecords": {
            "address": f"$KV.{n.results_bucket}.tool.{{tool_name}}.{{execution_id}}",
            "title": "tool-call records",
            "description": f"JetStream KV bucket {d.results_bucket} (<prefix>_results): a call whose record is done "
            "is answered from it and never runs again; one recorded with another argument digest is refused.",
            "parameters": {
                "prefix": prefix_p,
                "tool_name": _param("tool name"),
                "execution_id": _param("tool_execution_id of the call"),
            },
            "messages": {"ToolCallRecord": _msg_ref("ToolCallRecord")},
        },
        "stepPlans": {
            "address": f"$KV.{n.results_bucket}.step.{{step_id}}",
            "title": "step plans",
            "description": f"JetStream KV bucket {d.results_bucket} (<prefix>_results): written by model-step "
            "before a step's first tool call is sent.",
            "parameters": {"prefix": prefix_p, "step_id": _param("step id")},
            "messages": {"StepPlanRecord": _msg_ref("StepPlanRecord")},
        },
        "toolWorker": {
            "address": n.tool_worker("{worker_id}"),
            "title": "tool-worker liveness",
            "description": "Each tool worker answers here (empty reply); no responders means the worker process "
            "is gone, so a call it recorded as started and never finished has an unknown outcome.",
            "parameters": {"prefix": prefix_p, "worker_id": _param("worker id (as in its registration)")},
            "messages": {"WorkerPing": _msg_ref("WorkerPing")},
        },
        "leaseHolder": {
            "address": n.lease_holder("{token}"),
            "title": "lease-holder liveness",
            "description": "Each model-step replica answers here; no responders means its process or "
            "connection is gone, so its leases may be taken at once.",
            "parameters": {"prefix": prefix_p, "token": _param("the holder's liveness token (lease value)")},
            "messages": {"LeaseHolderPing": _msg_ref("LeaseHolderPing")},
        },
    }
    for verb in subjects.VERBS:
        req = protocol.REQUEST_TYPES[verb].__name__
        channels[f"api_{verb}"] = {
            "address": n.api("{loop_id}", verb),
            "title": f"loop API: {verb}",
            "description": f"Core request/reply to the committer (queue group {subjects.COMMITTER_QUEUE}). "
            "command_id makes the command idempotent.",
            "parameters": {"prefix": prefix_p, "loop_id": loop_p},
            "messages": {req: _msg_ref(req)},
        }

    queue = {"nats": {"queue": subjects.COMMITTER_QUEUE}}
    operations: dict[str, Any] = {
        "appendHistory": {
            "action": "send",
            "channel": _chan("history"),
            "summary": "The committer appends validated events (OCC + de-duplication; several = one atomic batch).",
            "messages": [_chan_msg("history", e) for e in enduring],
        },
        "followHistory": {
            "action": "receive",
            "channel": _chan("history"),
            "summary": "Consumers replay and follow a loop's committed history.",
            "messages": [_chan_msg("history", e) for e in enduring],
        },
        "publishLive": {
            "action": "send",
            "channel": _chan("live"),
            "summary": "The model-step publishes token deltas and tool-call progress.",
            "messages": [_chan_msg("live", "LiveFrame")],
        },
        "followLive": {
            "action": "receive",
            "channel": _chan("live"),
            "summary": "Consumers watch a loop live.",
            "messages": [_chan_msg("live", "LiveFrame")],
        },
        "commit": {
            "action": "receive",
            "channel": _chan("commit"),
            "summary": "The committer validates and appends a group of events.",
            "bindings": queue,
            "messages": [_chan_msg("commit", "CommitRequest")],
            "reply": {"channel": _chan("commitReply"), "messages": [_chan_msg("commitReply", "CommitReply")]},
        },
        "signalWork": {
            "action": "send",
            "channel": _chan("work"),
            "summary": "The committer signals work after LoopStarted, InputSubmitted, GateResolved, an interrupt "
            "or a fork.",
            "messages": [_chan_msg("work", "WorkSignal")],
        },
        "pullWork": {
            "action": "receive",
            "channel": _chan("work"),
            "summary": "Model-step replicas pull work, lease the loop, drive it and ack.",
            "messages": [_chan_msg("work", "WorkSignal")],
        },
        "callTool": {
            "action": "send",
            "channel": _chan("tool"),
            "summary": "The model-step calls a tool.",
            "messages": [_chan_msg("tool", "ToolCall")],
            "reply": {
                "channel": _chan("toolReply"),
                "messages": [_chan_msg("toolReply", k) for k in ("ToolProgress", "ToolResult", "ToolError")],
            },
        },
        "serveTool": {
            "action": "receive",
            "channel": _chan("tool"),
            "summary": "Tool workers serve calls in the tool's queue group.",
            "bindings": {"nats": {"queue": n.tool_queue("{tool_name}")}},
            "messages": [_chan_msg("tool", "ToolCall")],
        },
        "cancelToolCall": {
            "action": "send",
            "channel": _chan("toolControl"),
            "summary": "Cancel a running tool call.",
            "messages": [_chan_msg("toolControl", "ToolCancel")],
        },
        "registerTool": {
            "action": "send",
            "channel": _chan("toolRegistry"),
            "summary": "A tool worker registers what it serves.",
            "messages": [_chan_msg("toolRegistry", "ToolRegistration")],
        },
        "leaseLoop": {
            "action": "send",
            "channel": _chan("leases"),
            "summary": "A model-step replica takes and refreshes a loop's lease.",
            "messages": [_chan_msg("leases", "LoopLease")],
        },
        "pingLeaseHolder": {
            "action": "receive",
            "channel": _chan("leaseHolder"),
            "summary": "A model-step replica answers liveness pings for the leases it holds.",
            "messages": [_chan_msg("leaseHolder", "LeaseHolderPing")],
        },
    }
    for verb in subjects.VERBS:
        req = protocol.REQUEST_TYPES[verb].__name__
        operations[f"api_{verb}"] = {
            "action": "receive",
            "channel": _chan(f"api_{verb}"),
            "summary": f"Loop API {verb} (clients → committer).",
            "bindings": queue,
            "messages": [_chan_msg(f"api_{verb}", req)],
            "reply": {"channel": _chan("apiReply"), "messages": [_chan_msg("apiReply", "ApiReply")]},
        }

    return {
        "asyncapi": ASYNCAPI_VERSION,
        "info": {
            "title": "loopwire",
            "version": CONTRACT_VERSION,
            "description": "LLM agent loops on NATS. Generated from the code by `loopwire schema --asyncapi "
            "docs/asyncapi.yaml`; do not edit by hand. Every subject starts with the deployment prefix "
            "(LW_PREFIX, default lw); stream and bucket names follow it. Enduring events are stored as the "
            'durable envelope: the event\'s JSON plus "type" (its name) and "v": 1. Decoding refuses invalid '
            "UTF-8, duplicate keys, unknown or ephemeral types, v > 1, unknown fields and records over "
            "LW_MAX_RECORD_BYTES. Failed replies carry error.kind (ErrorKind) and, for invalid events, "
            "error.event / error.field / error.rule (Rule).",
        },
        "defaultContentType": "application/json",
        "servers": {
            "local": {
                "host": "127.0.0.1:4222",
                "protocol": "nats",
                "description": "loopwire up (or LW_NATS_URL)",
            }
        },
        "channels": channels,
        "operations": operations,
        "components": {"schemas": schema_rules.for_asyncapi(schemas), "messages": messages},
    }


# --- YAML (a small emitter: block style, every string double-quoted) -----------------------------

_PLAIN_KEY: Final = re.compile(r"^[A-Za-z_$][A-Za-z0-9_$.-]*$")
_RESERVED: Final = frozenset({"true", "false", "null", "yes", "no", "on", "off", "y", "n", "~"})


def _scalar(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return json.dumps(value)
    return json.dumps(str(value), ensure_ascii=False)


def _key(key: str) -> str:
    return key if _PLAIN_KEY.match(key) and key.lower() not in _RESERVED else json.dumps(key, ensure_ascii=False)


def _yaml_lines(value: Any, indent: int) -> list[str]:
    pad = " " * indent
    lines: list[str] = []
    if isinstance(value, dict):
        for k, v in value.items():
            if isinstance(v, dict | list) and v:
                lines.append(f"{pad}{_key(str(k))}:")
                lines.extend(_yaml_lines(v, indent + 2))
            else:
                lines.append(f"{pad}{_key(str(k))}: {_inline(v)}")
    elif isinstance(value, list):
        for item in value:
            if isinstance(item, dict | list) and item:
                sub = _yaml_lines(item, indent + 2)
                lines.append(f"{pad}- {sub[0].lstrip()}")
                lines.extend(sub[1:])
            else:
                lines.append(f"{pad}- {_inline(item)}")
    else:
        lines.append(f"{pad}{_inline(value)}")
    return lines


def _inline(value: Any) -> str:
    if isinstance(value, dict):
        return "{}"
    if isinstance(value, list):
        return "[]"
    return _scalar(value)


def to_yaml(value: Any, header: str = "") -> str:
    """Block-style YAML that any YAML 1.2 parser reads back as ``value`` (strings are JSON-quoted)."""
    head = "".join(f"# {line}\n" for line in header.splitlines())
    return head + "\n".join(_yaml_lines(value, 0)) + "\n"


def render_asyncapi() -> str:
    return to_yaml(asyncapi_document(), "Generated by `loopwire schema --asyncapi docs/asyncapi.yaml`: do not edit.")


# --- writing and checking -----------------------------------------------------------------------


def write_schemas(directory: Path) -> list[Path]:
    written = []
    for rel, text in render_schemas().items():
        path = directory / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written


def schema_drift(directory: Path) -> list[str]:
    """What differs between ``directory`` and the generated schemas (empty = in sync)."""
    want = render_schemas()
    problems = []
    for rel, text in want.items():
        path = directory / rel
        if not path.is_file():
            problems.append(f"missing {path}")
        elif path.read_text(encoding="utf-8") != text:
            problems.append(f"differs: {path}")
    if directory.is_dir():
        for path in sorted(directory.rglob("*.json")):
            rel = path.relative_to(directory).as_posix()
            if rel not in want and not rel.startswith(CONFORMANCE_DIR + "/"):
                problems.append(f"not generated (stale?): {path}")
    return problems


def asyncapi_drift(path: Path) -> list[str]:
    if not path.is_file():
        return [f"missing {path}"]
    return [] if path.read_text(encoding="utf-8") == render_asyncapi() else [f"differs: {path}"]
