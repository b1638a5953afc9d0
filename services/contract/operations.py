"""The AsyncAPI document's operations: who sends and who receives on each channel."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final

from services.contract.catalog import ENDURING_NAMES
from shared import protocol, subjects

_COMMITTER_QUEUE: Final = {"nats": {"queue": subjects.COMMITTER_QUEUE}}
_TOOL_REPLIES: Final = ("ToolProgress", "ToolResult", "ToolError")


def _chan(channel: str) -> dict[str, str]:
    return {"$ref": f"#/channels/{channel}"}


def _chan_msgs(channel: str, names: Iterable[str]) -> list[dict[str, str]]:
    return [{"$ref": f"#/channels/{channel}/messages/{name}"} for name in names]


def _reply(channel: str, names: Iterable[str]) -> dict[str, Any]:
    return {"channel": _chan(channel), "messages": _chan_msgs(channel, names)}


def _op(
    action: str,
    channel: str,
    summary: str,
    names: Iterable[str],
    *,
    bindings: dict[str, Any] | None = None,
    reply: dict[str, Any] | None = None,
) -> dict[str, Any]:
    op: dict[str, Any] = {"action": action, "channel": _chan(channel), "summary": summary}
    if bindings is not None:
        op["bindings"] = bindings
    op["messages"] = _chan_msgs(channel, names)
    if reply is not None:
        op["reply"] = reply
    return op


def _loop_operations() -> dict[str, Any]:
    """History, live events, commits and work signals."""
    return {
        "appendHistory": _op(
            "send",
            "history",
            "The committer appends validated events (OCC + de-duplication; several = one atomic batch).",
            ENDURING_NAMES,
        ),
        "followHistory": _op(
            "receive", "history", "Consumers replay and follow a loop's committed history.", ENDURING_NAMES
        ),
        "notifyDriver": _op(
            "send",
            "control",
            "The committer republishes the records a loop-API command stored for a started loop.",
            ["ControlRecord"],
        ),
        "watchControl": _op(
            "receive",
            "control",
            "The model-step driving a loop reads the history again after another writer's record, and cancels "
            "its step on TurnInterrupted or LoopClosed.",
            ["ControlRecord"],
        ),
        "publishLive": _op(
            "send", "live", "The model-step publishes token deltas and tool-call progress.", ["LiveFrame"]
        ),
        "followLive": _op("receive", "live", "Consumers watch a loop live.", ["LiveFrame"]),
        "commit": _op(
            "receive",
            "commit",
            "The committer validates and appends a group of events.",
            ["CommitRequest"],
            bindings=_COMMITTER_QUEUE,
            reply=_reply("commitReply", ["CommitReply"]),
        ),
        "askPresence": _op(
            "send",
            "presence",
            "`loopwire shards grow` asks which services are running.",
            ["PresenceRequest"],
            reply=_reply("presenceReply", ["Presence"]),
        ),
        "answerPresence": _op(
            "receive", "presence", "Every running service answers with what it is.", ["PresenceRequest"]
        ),
        "signalWork": _op(
            "send",
            "work",
            "The committer signals work after LoopStarted, InputSubmitted, GateResolved, an interrupt or a fork.",
            ["WorkSignal"],
        ),
        "pullWork": _op(
            "receive", "work", "Model-step replicas pull work, lease the loop, drive it and ack.", ["WorkSignal"]
        ),
    }


def _tool_and_lease_operations() -> dict[str, Any]:
    """Tool calls, cancels and registrations; loop leases and their liveness pings."""
    return {
        "callTool": _op(
            "send", "tool", "The model-step calls a tool.", ["ToolCall"], reply=_reply("toolReply", _TOOL_REPLIES)
        ),
        "serveTool": _op(
            "receive",
            "tool",
            "Tool workers serve calls in the tool's queue group.",
            ["ToolCall"],
            bindings={"nats": {"queue": subjects.Names("{prefix}").tool_queue("{tool_name}")}},
        ),
        "cancelToolCall": _op("send", "toolControl", "Cancel a running tool call.", ["ToolCancel"]),
        "registerTool": _op("send", "toolRegistry", "A tool worker registers what it serves.", ["ToolRegistration"]),
        "rememberNote": _op("send", "memoryNotes", "The kv_memory tool stores a loop's note.", ["MemoryNote"]),
        "leaseLoop": _op("send", "leases", "A model-step replica takes and refreshes a loop's lease.", ["LoopLease"]),
        "pingLeaseHolder": _op(
            "receive",
            "leaseHolder",
            "A model-step replica answers liveness pings for the leases it holds.",
            ["LeaseHolderPing"],
        ),
    }


def _api_operations() -> dict[str, Any]:
    """One operation per loop-API verb (clients → committer)."""
    return {
        f"api_{verb}": _op(
            "receive",
            f"api_{verb}",
            f"Loop API {verb} (clients → committer).",
            [protocol.REQUEST_TYPES[verb].__name__],
            bindings=_COMMITTER_QUEUE,
            reply=_reply("apiReply", ["ApiReply"]),
        )
        for verb in subjects.VERBS
    }


def operations() -> dict[str, Any]:
    """The operations section, in the document's order."""
    return {**_loop_operations(), **_tool_and_lease_operations(), **_api_operations()}
