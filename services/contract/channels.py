"""The AsyncAPI document's channels: every subject and KV key loopwire uses, with the messages sent there."""

from __future__ import annotations

from typing import Any, Final

from services.contract.catalog import ENDURING_NAMES
from shared import protocol, subjects

_N: Final = subjects.Names("{prefix}")  # addresses with the prefix as a parameter
_D: Final = subjects.DEFAULT_NAMES  # stream and bucket names of the default prefix


def _param(description: str, default: str | None = None) -> dict[str, Any]:
    p: dict[str, Any] = {"description": description}
    if default is not None:
        p["default"] = default
    return p


def _msg_ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/messages/{name}"}


_LOOP: Final = _param("loop id (canonical lowercase UUID)")
_PREFIX: Final = _param("deployment prefix (LW_PREFIX)", "lw")


def _per_shard(names: str) -> str:
    """The sentence on a sharded deployment's copies of a stream or bucket (``names``: shard k's)."""
    return (
        f" A sharded deployment (LW_SHARDS > 1) has one per shard: shard 0 keeps these names, shard k >= 1 "
        f"adds the _<k> suffix ({names}); a loop's is in shard crc32(loop_id) mod LW_SHARDS."
    )


def _loop_channels() -> dict[str, Any]:
    """History, live events, commits, replies and work signals."""
    return {
        "history": {
            "address": _N.hist("{loop_id}"),
            "title": "loop history",
            "description": f"JetStream stream {_D.history_stream} (<PREFIX>_HISTORY): every enduring event of a "
            "loop, in order. Only the committer publishes here (enforced by NATS permissions). Read it with Direct "
            "Get or an ordered consumer (shared.replay.replay)."
            + _per_shard("<PREFIX>_HISTORY_<k>, subjects <prefix>.hist_<k>.<loop_id>")
            + " A deployment grown from one shard keeps its older loops in shard 0's.",
            "parameters": {"prefix": _PREFIX, "loop_id": _LOOP},
            "messages": {e: _msg_ref(e) for e in ENDURING_NAMES},
        },
        "control": {
            "address": _N.ctl("{loop_id}"),
            "title": "loop control",
            "description": "Core NATS: each record a loop-API command stored for a started loop, republished by "
            "the committer after storing it, byte for byte as in the history (a durable envelope), so the "
            "model-step driving the loop learns at once of an input, an answer, an interrupt, a close or a budget. "
            "Best effort: a lost one only delays the driver until its next commit's expected sequence fails.",
            "parameters": {"prefix": _PREFIX, "loop_id": _LOOP},
            "messages": {"ControlRecord": _msg_ref("ControlRecord")},
        },
        "live": {
            "address": _N.live("{loop_id}"),
            "title": "live events",
            "description": "Core NATS: a loop's ephemeral events while they happen, in live frames (may be dropped).",
            "parameters": {"prefix": _PREFIX, "loop_id": _LOOP},
            "messages": {"LiveFrame": _msg_ref("LiveFrame")},
        },
        "commit": {
            "address": _N.commit("{loop_id}"),
            "title": "commit",
            "description": f"Core request/reply to the committer (queue group {subjects.COMMITTER_QUEUE}).",
            "parameters": {"prefix": _PREFIX, "loop_id": _LOOP},
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
        "chainTip": {
            "address": _N.chain_tip("{loop_id}"),
            "title": "chain tips",
            "description": "Core NATS among committers: each tells the others the digest-chain link of every "
            "record it stored (see the history headers), so whichever committer appends next needs no read.",
            "parameters": {"prefix": _PREFIX, "loop_id": _LOOP},
            "messages": {"ChainTip": _msg_ref("ChainTip")},
        },
        "presence": {
            "address": _N.presence,
            "title": "running services",
            "description": "Core request/reply: every running service answers a request here with what it is "
            "(`loopwire shards grow` asks, and refuses while any service answers).",
            "parameters": {"prefix": _PREFIX},
            "messages": {"PresenceRequest": _msg_ref("PresenceRequest")},
        },
        "presenceReply": {
            "address": None,
            "description": "The asker's inbox: one reply per running service.",
            "messages": {"Presence": _msg_ref("Presence")},
        },
        "work": {
            "address": _N.work("{loop_id}"),
            "title": "work signals",
            "description": f"JetStream work queue {_D.work_stream} (<PREFIX>_WORK; one pending message per loop), "
            f"pulled by model-step replicas through the durable consumer {_D.work_consumer} (<prefix>_model_step)."
            + _per_shard("<PREFIX>_WORK_<k>, subjects <prefix>.work_<k>.<loop_id>, the same consumer name in each"),
            "parameters": {"prefix": _PREFIX, "loop_id": _LOOP},
            "messages": {"WorkSignal": _msg_ref("WorkSignal")},
        },
    }


def _tool_channels() -> dict[str, Any]:
    """Tool calls, their replies, cancels and the tool registry."""
    return {
        "tool": {
            "address": _N.tool("{tool_name}"),
            "title": "tool calls",
            "description": "Core request/reply to the tool's workers, queue group tool_<tool_name>. Several replies "
            "per call: progress heartbeats, then one result or error.",
            "parameters": {"prefix": _PREFIX, "tool_name": _param("tool name, ^[A-Za-z0-9_-]{1,64}$")},
            "messages": {"ToolCall": _msg_ref("ToolCall")},
        },
        "toolReply": {
            "address": None,
            "description": "The caller's inbox.",
            "messages": {k: _msg_ref(k) for k in ("ToolProgress", "ToolResult", "ToolError")},
        },
        "toolControl": {
            "address": _N.toolctl("{execution_id}"),
            "title": "tool-call cancel",
            "parameters": {"prefix": _PREFIX, "execution_id": _param("tool_execution_id of the call")},
            "messages": {"ToolCancel": _msg_ref("ToolCancel")},
        },
        "toolRegistry": {
            "address": f"$KV.{_N.tools_bucket}.{{tool_name}}.{{worker_id}}",
            "title": "tool registry",
            "description": f"JetStream KV bucket {_D.tools_bucket} (<prefix>_tools): a worker's registration, "
            "refreshed while it serves, deleted on a graceful stop, expired by TTL otherwise.",
            "parameters": {
                "prefix": _PREFIX,
                "tool_name": _param("tool name"),
                "worker_id": _param("worker id"),
            },
            "messages": {"ToolRegistration": _msg_ref("ToolRegistration")},
        },
    }


def _record_channels() -> dict[str, Any]:
    """Leases, call records and step plans (KV), then the liveness subjects."""
    return {
        "leases": {
            "address": f"$KV.{_N.leases_bucket}.{{loop_id}}",
            "title": "loop leases",
            "description": f"JetStream KV bucket {_D.leases_bucket} (<prefix>_leases): which model-step replica "
            "drives a loop. It guards side effects (a drive acts only while it holds it); the commit's "
            "expected sequence is the fence." + _per_shard("<prefix>_leases_<k>"),
            "parameters": {"prefix": _PREFIX, "loop_id": _LOOP},
            "messages": {"LoopLease": _msg_ref("LoopLease")},
        },
        "callRecords": {
            "address": f"$KV.{_N.results_bucket}.tool.{{tool_name}}.{{execution_id}}",
            "title": "tool-call records",
            "description": f"JetStream KV bucket {_D.results_bucket} (<prefix>_results): a call whose record is "
            "done is answered from it and never runs again; one recorded with another argument digest is refused."
            + _per_shard("<prefix>_results_<k>"),
            "parameters": {
                "prefix": _PREFIX,
                "tool_name": _param("tool name"),
                "execution_id": _param("tool_execution_id of the call"),
            },
            "messages": {"ToolCallRecord": _msg_ref("ToolCallRecord")},
        },
        "stepPlans": {
            "address": f"$KV.{_N.results_bucket}.step.{{step_id}}",
            "title": "step plans",
            "description": f"JetStream KV bucket {_D.results_bucket} (<prefix>_results): written by model-step "
            "before a step's first tool call is sent." + _per_shard("<prefix>_results_<k>"),
            "parameters": {"prefix": _PREFIX, "step_id": _param("step id")},
            "messages": {"StepPlanRecord": _msg_ref("StepPlanRecord")},
        },
        "memoryNotes": {
            "address": f"$KV.{_N.memory_bucket}.{{loop_id}}.{{key}}",
            "title": "kv_memory notes",
            "description": f"JetStream KV bucket {_D.memory_bucket} (<prefix>_memory): the built-in kv_memory "
            "tool's notes, per loop (the call's Lw-Loop-Id), never expiring.",
            "parameters": {
                "prefix": _PREFIX,
                "loop_id": _LOOP,
                "key": _param("the note's key, UTF-8, base64url without padding"),
            },
            "messages": {"MemoryNote": _msg_ref("MemoryNote")},
        },
        **_liveness_channels(),
    }


def _liveness_channels() -> dict[str, Any]:
    return {
        "toolWorker": {
            "address": _N.tool_worker("{worker_id}"),
            "title": "tool-worker liveness",
            "description": "Each tool worker answers here (empty reply); no responders means the worker process "
            "is gone, so a call it recorded as started and never finished has an unknown outcome.",
            "parameters": {"prefix": _PREFIX, "worker_id": _param("worker id (as in its registration)")},
            "messages": {"WorkerPing": _msg_ref("WorkerPing")},
        },
        "leaseHolder": {
            "address": _N.lease_holder("{token}"),
            "title": "lease-holder liveness",
            "description": "Each model-step replica answers here; no responders means its process or "
            "connection is gone, so its leases may be taken at once.",
            "parameters": {"prefix": _PREFIX, "token": _param("the holder's liveness token (lease value)")},
            "messages": {"LeaseHolderPing": _msg_ref("LeaseHolderPing")},
        },
    }


def _api_channels() -> dict[str, Any]:
    """One channel per loop-API verb."""
    out: dict[str, Any] = {}
    for verb in subjects.VERBS:
        req = protocol.REQUEST_TYPES[verb].__name__
        out[f"api_{verb}"] = {
            "address": _N.api("{loop_id}", verb),
            "title": f"loop API: {verb}",
            "description": f"Core request/reply to the committer (queue group {subjects.COMMITTER_QUEUE}). "
            "command_id makes the command idempotent.",
            "parameters": {"prefix": _PREFIX, "loop_id": _LOOP},
            "messages": {req: _msg_ref(req)},
        }
    return out


def channels() -> dict[str, Any]:
    """The channels section, in the document's order."""
    return {**_loop_channels(), **_tool_channels(), **_record_channels(), **_api_channels()}
