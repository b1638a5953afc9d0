"""What the contract publishes: the wire types by schema group, the event unions and their descriptions."""

from __future__ import annotations

import functools
import operator
from collections.abc import Iterable
from typing import Annotated, Any, Final

import msgspec

from services.toolwire import protocol as tool_protocol
from services.toolwire.spec import Registration, ToolSpec
from shared import protocol
from shared.events import CLASSIFICATION, ENDURING_TYPES, EPHEMERAL_TYPES, EVENT_TYPES, Event
from shared.results import CallRecord, StepPlan

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


def _union(classes: Iterable[type[Event]]) -> Any:
    return functools.reduce(operator.or_, classes)


ENDURING_UNION: Final = _union(c for c in CLASSIFICATION if c.__name__ in ENDURING_TYPES)
EPHEMERAL_UNION: Final = _union(c for c in CLASSIFICATION if c.__name__ in EPHEMERAL_TYPES)
LIVE_FRAME: Final = Annotated[list[EPHEMERAL_UNION], msgspec.Meta(min_length=1)]  # type: ignore[valid-type]
ANY_UNION: Final = _union(CLASSIFICATION)
# The enduring events' names, in EVENT_TYPES order (what the history stream carries).
ENDURING_NAMES: Final = tuple(name for name in EVENT_TYPES if name in ENDURING_TYPES)
# What the loop API writes to a started loop (input, answer, interrupt, close, budget): the records the
# committer republishes on the loop's control subject for the model-step driving it.
CONTROL_NAMES: Final = ("InputSubmitted", "GateResolved", "TurnInterrupted", "LoopClosed", "BudgetChanged")

DESCRIPTIONS: Final[dict[str, str]] = {
    "EnduringEvent": "Any enduring event as stored in the history stream: the durable envelope "
    '(the event\'s fields plus "type" and "v": 1).',
    "EphemeralEvent": "Any ephemeral event, as one element of a live frame (may be dropped).",
    "LiveFrame": "A message on {prefix}.live.{loop_id}: one or more ephemeral events of the loop, oldest first "
    "(a frame holds at most ~50 ms of the loop's events, and a step's events go out before the step is committed).",
    "AnyEvent": "Any event of either class.",
    "ControlRecord": "A message on {prefix}.ctl.{loop_id}: one record a loop-API command stored, its bytes as "
    "stored in the history (the durable envelope), without the history's headers.",
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
