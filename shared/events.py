"""Every event type, its class (ephemeral | enduring), scope and identity profile, in one place.

Events are msgspec Structs tagged by ``"type"`` (the class name). The header fields are flattened
into every event (``loop_id``, ``turn_id``, ...), exactly as they appear on the wire.

* Ephemeral events travel on core subjects, in frames of a loop's events (``lw.live.<loop_id>``), and
  may be dropped.
* Enduring events go only through the committer into JetStream and are never lost.

The classification lives in :data:`CLASSIFICATION` and nowhere else.
"""

from __future__ import annotations

import hashlib
import os
import time
import uuid
from datetime import UTC, datetime
from typing import Annotated, Any, Final, TypeVar

import msgspec

from shared.content import AIMessage, Message, ToolResultMessage, Usage, UserMessage
from shared.eventkinds import Class, Profile, Scope
from shared.wiretypes import (
    ALLOW,
    RETRYABLE_OUTCOMES,
    UNSET,
    CauseRef,
    ChunkKind,
    ContextStrategy,
    Count,
    DecisionEffect,
    EnvelopeVersion,
    GateAction,
    GateKind,
    GateReason,
    LimitCount,
    LimitValue,
    NonBlank,
    NonEmpty,
    OnBudget,
    OnUnknown,
    PermissionEffect,
    PermissionReason,
    PolicyEffect,
    PolicyKey,
    PreviewText,
    Reexecution,
    RetryOutcome,
    Rfc3339OrEmpty,
    Seq,
    SummaryText,
    ToolName,
    TraceparentOrEmpty,
    TurnFailedKind,
    TurnIndex,
    Uuid,
    UuidOrEmpty,
)

# --- header -------------------------------------------------------------------------------------


class Cause(msgspec.Struct, omit_defaults=True, forbid_unknown_fields=True, kw_only=True):
    """What caused an event: the client command, an earlier event, or a tool execution."""

    command_id: CauseRef = ""
    event_id: CauseRef = ""
    tool_execution_id: CauseRef = ""


class Event(msgspec.Struct, tag_field="type", tag=True, omit_defaults=True, forbid_unknown_fields=True, kw_only=True):
    """Base of every event; the header fields are flattened into the event itself."""

    # "" = absent; which ids an event must (and must not) carry is its identity profile.
    loop_id: UuidOrEmpty = ""
    turn_id: UuidOrEmpty = ""
    step_id: UuidOrEmpty = ""
    tool_execution_id: UuidOrEmpty = ""
    session_id: UuidOrEmpty = ""
    event_id: UuidOrEmpty = ""
    created_at: Rfc3339OrEmpty = ""
    cause: Cause | None = None
    # Envelope schema version. The codec writes it explicitly; v > 1 is refused on decode.
    v: EnvelopeVersion = 1


# --- bodies -------------------------------------------------------------------------------------


class Limits(msgspec.Struct, omit_defaults=True, forbid_unknown_fields=True, kw_only=True):
    """Per-loop limits (the defaults are the documented ones). ``max_result_bytes`` 0 = unbounded, else ≥ 256."""

    max_iterations: LimitValue = 25
    max_calls_per_turn: LimitValue = 100
    max_parallel: LimitValue = 8
    max_result_bytes: LimitCount = 0  # 0 or >= 256: checked by validate_event (not a msgspec constraint)
    max_tokens: LimitCount = 0  # 0 = provider default


class ContextPolicy(msgspec.Struct, omit_defaults=True, forbid_unknown_fields=True, kw_only=True):
    """How a loop's model requests are kept within the model's context window (docs/context.md).

    ``strategy``: "none" (sent as built), "clear_tool_results" (old tool results become a short
    placeholder) or "compact" (older messages are summarised). ``window``: the
    context window in tokens (0 = the model's, shared/modelspec.py). ``trigger``: input tokens above
    which the strategy acts (0 = only when the window would be exceeded). ``keep``: the most recent
    tool results never cleared; ``clear_at_least``: tokens a clearing below the window must free, else
    nothing is cleared (the prompt cache stays valid); ``exclude_tools``: tools whose results are never
    cleared. ``compact``: above the trigger (or the window) the model summarises the older messages,
    committed as ContextCompacted; ``model`` writes the summaries ("" = the loop's model).
    """

    strategy: ContextStrategy = "none"
    window: LimitCount = 0
    trigger: LimitCount = 0
    keep: LimitCount = 3
    clear_at_least: LimitCount = 0
    exclude_tools: list[ToolName] = msgspec.field(default_factory=list)
    model: Annotated[str, msgspec.Meta(max_length=512)] = ""  # compact: the summary's model ("" = the loop's)


class Budget(msgspec.Struct, omit_defaults=True, forbid_unknown_fields=True, kw_only=True):
    """A loop's budget, checked before each model step (docs/budgets.md). Every limit 0 = unlimited;
    the whole-number ones at most ``MAX_LIMIT_COUNT``, the others at most 1e9.

    ``max_total_tokens`` counts the loop's input (cache reads and writes included) and output tokens
    over all turns; ``max_cost_usd`` its cost from the price table at each step's commit;
    ``max_steps_per_turn`` the model steps of one turn; ``max_turn_seconds`` the wall time since the
    turn's TurnStarted. ``on_budget``: a spent budget fails the turn ("fail") or opens a budget gate ("ask").
    """

    max_total_tokens: LimitCount = 0
    max_cost_usd: Annotated[float, msgspec.Meta(ge=0, le=1e9)] = 0.0
    max_steps_per_turn: LimitCount = 0
    max_turn_seconds: Annotated[float, msgspec.Meta(ge=0, le=1e9)] = 0.0
    on_budget: OnBudget = "fail"


class ParentRef(msgspec.Struct, omit_defaults=True, forbid_unknown_fields=True, kw_only=True):
    """The call a child loop runs for: an agent tool's call in the parent loop (docs/protocol.md, "Sub-agents").

    The child's id is derived from ``tool_execution_id``, so a re-sent call finds the same child."""

    loop_id: Uuid
    turn_id: Uuid
    step_id: Uuid
    tool_execution_id: Uuid
    tool_name: ToolName


class RetryPolicy(msgspec.Struct, omit_defaults=True, forbid_unknown_fields=True, kw_only=True):
    """How a call that ended without a tool answer (worker crashed, no live workers, deadline) is sent
    again. Applies only to read-only or idempotent tools; a tool's own error result is never retried."""

    max_attempts: Annotated[int, msgspec.Meta(ge=1, le=100)] = 1  # 1 = no retry
    initial_backoff_seconds: Annotated[float, msgspec.Meta(ge=0, le=3600)] = 0.2
    max_backoff_seconds: Annotated[float, msgspec.Meta(ge=0, le=3600)] = 2.0
    retry_on: list[RetryOutcome] = msgspec.field(default_factory=lambda: list(RETRYABLE_OUTCOMES))  # type: ignore[arg-type]


class TurnError(msgspec.Struct, omit_defaults=True, forbid_unknown_fields=True, kw_only=True):
    kind: TurnFailedKind = "unknown"
    message: str = ""


class RawToolUse(msgspec.Struct, omit_defaults=True, forbid_unknown_fields=True, kw_only=True):
    """The executable view of one tool use: the bytes the model sent, before sanitisation."""

    id: str = ""
    name: str = ""
    input: str = ""
    # Set when the id was missing or repeated and loopwire minted one (the call never runs).
    minted_id: bool = False


class Decision(msgspec.Struct, omit_defaults=True, forbid_unknown_fields=True, kw_only=True):
    """A per-call authorisation decision taken before anything runs."""

    tool_use_id: str = ""
    tool_execution_id: UuidOrEmpty = ""
    effect: DecisionEffect = UNSET
    reason: str = ""  # open-ended: why (policy_allow, gate_denied, user_reply...)
    text: str = ""  # deny: the model-visible denial; reply: the operator's answer (the call's result)


class SuspendedStep(msgspec.Struct, omit_defaults=True, forbid_unknown_fields=True, kw_only=True):
    """A step parked at a gate: enough to continue it without calling the model again."""

    message: AIMessage = msgspec.field(default_factory=AIMessage)
    calls: list[RawToolUse] = msgspec.field(default_factory=list)
    decisions: list[Decision] = msgspec.field(default_factory=list)
    iteration: Count = 0
    calls_so_far: Count = 0


class Gate(msgspec.Struct, omit_defaults=True, forbid_unknown_fields=True, kw_only=True):
    id: Uuid = ""
    kind: GateKind = UNSET
    controls: list[GateAction] = msgspec.field(default_factory=list)
    tool_use_id: str = ""
    tool_name: str = ""
    step: SuspendedStep | None = None
    # "outcome_unknown": the call may have run already (its step ran before and left no result);
    # approving runs it again. Empty for an ordinary permission or user-input gate.
    reason: GateReason = ""


class PermissionRequest(msgspec.Struct, omit_defaults=True, forbid_unknown_fields=True, kw_only=True):
    gate_id: Uuid = ""
    tool_name: NonEmpty = ""
    summary: str = ""


class Chunk(msgspec.Struct, omit_defaults=True, forbid_unknown_fields=True, kw_only=True):
    """One streamed model fragment. ``kind``: text | refusal | thinking | signature | tool_use."""

    kind: ChunkKind = "text"
    text: str = ""
    index: Count = 0
    id: str = ""
    name: str = ""


# --- loop lifecycle (enduring) ------------------------------------------------------------------


class LoopStarted(Event):
    model: Annotated[str, msgspec.Meta(max_length=512)] = ""
    system: str = ""
    tools: list[ToolName] | None = None  # allow-list; None = every live tool
    policy: dict[PolicyKey, PolicyEffect] = msgspec.field(default_factory=dict)
    default_policy: PolicyEffect = ALLOW
    limits: Limits = msgspec.field(default_factory=Limits)
    # A call that may have run but left no recorded result when its step runs again, of a tool that
    # is neither read-only nor idempotent: "error" (the model reads that the outcome is unknown) or
    # "ask" (an operator gate: approve runs it again).
    on_unknown: OnUnknown = "error"
    # Per tool name: overrides the retry policy the tool declares.
    retries: dict[ToolName, RetryPolicy] = msgspec.field(default_factory=dict)
    budget: Budget = msgspec.field(default_factory=Budget)
    # Set for a sub-agent's child loop: the parent loop's call it runs for.
    parent: ParentRef | None = None
    context: ContextPolicy = msgspec.field(default_factory=ContextPolicy)


class ForkChanges(msgspec.Struct, omit_defaults=True, forbid_unknown_fields=True, kw_only=True):
    """What a fork changed against its source (absent = unchanged)."""

    input: str | None = None  # the replaced (or added) user input's text
    model: str | None = None
    system: str | None = None
    policy: dict[PolicyKey, PolicyEffect] | None = None


class SourceCall(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """A call the fork's source committed after the fork point: tool, canonical arguments, result."""

    name: str
    input: str
    result: ToolResultMessage


class SourceCalls(msgspec.Struct, omit_defaults=True, forbid_unknown_fields=True, kw_only=True):
    """The source's calls after the fork point as they stood when the fork was written, so the fork
    decides a repeated call without reading its source again (its source may live on a shard that is
    electing a leader, or be gone). ``busy``: the source had work to do then, so it may have been
    running calls whose results it had not committed (their outcome stays unknown to the fork)."""

    calls: list[SourceCall] = msgspec.field(default_factory=list)
    busy: bool = False


class LoopForked(Event):
    """The first record of a forked loop: where it comes from and what the fork changed.

    ``records`` copied or new records follow it (LoopStarted first); until all of them are stored the
    loop is *forming*: nothing drives it and the loop API refuses it (a repeated fork command finishes it).
    """

    source_loop_id: Uuid = ""
    source_seq: Seq = 0
    records: Annotated[int, msgspec.Meta(ge=1)] = 1
    changes: ForkChanges = msgspec.field(default_factory=ForkChanges)
    # Per tool name ("*" = every tool): what a call equal to one of the source's after the fork point does.
    reexecution: dict[PolicyKey, Reexecution] = msgspec.field(default_factory=dict)
    # Absent only in a fork written before forks copied them: the source is read (a copy too large
    # for one record refuses the fork instead).
    source_calls: SourceCalls | None = None


class InputSubmitted(Event):
    message: UserMessage = msgspec.field(default_factory=UserMessage)


class LoopIdle(Event):
    pass


class LoopClosed(Event):
    pass


class BudgetChanged(Event):
    """The loop's budget from now on (the ``budget`` command), replacing LoopStarted's and any before."""

    budget: Budget = msgspec.field(default_factory=Budget)


# --- turns (enduring; the three terminals end a turn) -------------------------------------------


class TurnStarted(Event):
    turn_index: TurnIndex = 0
    message: UserMessage = msgspec.field(default_factory=UserMessage)
    # The context the turn's first drive began in (the work signal's; its own span when there was
    # none): every later span of the turn, in any process, joins its trace (docs/observability.md).
    traceparent: TraceparentOrEmpty = ""


class TurnFoldedInto(Event):
    turn_index: TurnIndex = 0
    message: UserMessage = msgspec.field(default_factory=UserMessage)


class StepDone(Event):
    messages: list[Message] = msgspec.field(default_factory=list)
    # The step's cost in micro-USD from the price table when it was committed (0: unpriced or no
    # usage): the history keeps what a step cost even after the table changes.
    cost_micro_usd: Count = 0


class ContextCompacted(Event):
    """A summary the model wrote of the loop's first ``upto`` messages (docs/context.md): model
    requests from here on send it in their place, followed by the messages from ``upto`` on. The
    messages themselves stay in the history (replay, fork and ``loopwire history`` show them all).

    ``previous_upto``: the messages the summary before this one covered (0: none); this summary
    includes it. ``tokens_before`` / ``tokens_after``: the request's input tokens without and with
    the summary. ``model``: the model spec that wrote it. Its event id is derived from the loop and
    ``upto`` (:func:`compaction_id_for`), so a repeated commit of the same compaction is a duplicate.
    ``usage`` / ``cost_micro_usd``: what the summary request cost; they count in the loop's and the
    turn's usage and budget like a step's.
    """

    upto: Annotated[int, msgspec.Meta(ge=1)] = 1
    previous_upto: Count = 0
    summary: NonBlank = "(summary)"
    tokens_before: Count = 0
    tokens_after: Count = 0
    model: Annotated[str, msgspec.Meta(max_length=512)] = ""
    usage: Usage | None = None
    cost_micro_usd: Count = 0


class TurnDone(Event):
    turn_index: TurnIndex = 0
    message: AIMessage | None = None
    usage: Usage | None = None


class TurnFailed(Event):
    turn_index: TurnIndex = 0
    err: TurnError = msgspec.field(default_factory=TurnError)


class TurnInterrupted(Event):
    turn_index: TurnIndex = 0
    reason: str = ""


# --- permission and user-input gates (enduring) -------------------------------------------------


class PermissionRequested(Event):
    request: PermissionRequest = msgspec.field(default_factory=PermissionRequest)


class PermissionDecided(Event):
    tool_name: str = ""
    effect: PermissionEffect = UNSET
    reason: PermissionReason = UNSET


class UserInputRequested(Event):
    gate_id: Uuid = ""
    question: NonBlank = ""
    choices: list[str] = msgspec.field(default_factory=list)


class GateOpened(Event):
    gate: Gate = msgspec.field(default_factory=Gate)


class GateResolved(Event):
    gate_id: Uuid = ""
    action: GateAction = UNSET
    text: str = ""
    reason: str = ""
    resolver: str = ""


# --- live only (ephemeral) ----------------------------------------------------------------------


class TokenDelta(Event):
    turn_index: TurnIndex = 0
    chunk: Chunk = msgspec.field(default_factory=Chunk)


class ToolCallStarted(Event):
    tool_name: str = ""
    tool_use_id: str = ""
    summary: SummaryText = ""
    replayed: bool = False  # the call finished before (its recorded result is used; nothing runs)


class ToolCallCompleted(Event):
    tool_use_id: str = ""
    is_error: bool = False
    result_preview: PreviewText = ""
    duration_ms: Count = 0
    replayed: bool = False


class ToolCallProgress(Event):
    message: str = ""


AnyEvent = (
    LoopStarted
    | LoopForked
    | InputSubmitted
    | LoopIdle
    | LoopClosed
    | BudgetChanged
    | TurnStarted
    | TurnFoldedInto
    | StepDone
    | ContextCompacted
    | TurnDone
    | TurnFailed
    | TurnInterrupted
    | PermissionRequested
    | PermissionDecided
    | UserInputRequested
    | GateOpened
    | GateResolved
    | TokenDelta
    | ToolCallStarted
    | ToolCallCompleted
    | ToolCallProgress
)

_E, _P = Class.ENDURING, Class.EPHEMERAL

# The one place where every event type is classified: (class, scope, identity profile, ends_turn).
CLASSIFICATION: Final[dict[type[Event], tuple[Class, Scope, Profile, bool]]] = {
    LoopStarted: (_E, Scope.LOOP, Profile.LOOP, False),
    LoopForked: (_E, Scope.LOOP, Profile.LOOP, False),
    InputSubmitted: (_E, Scope.LOOP, Profile.LOOP, False),
    LoopIdle: (_E, Scope.LOOP, Profile.LOOP, False),
    LoopClosed: (_E, Scope.LOOP, Profile.LOOP, False),
    BudgetChanged: (_E, Scope.LOOP, Profile.LOOP, False),
    TurnStarted: (_E, Scope.LOOP, Profile.TURN, False),
    TurnFoldedInto: (_E, Scope.LOOP, Profile.TURN, False),
    StepDone: (_E, Scope.LOOP, Profile.STEP, False),
    ContextCompacted: (_E, Scope.LOOP, Profile.STEP, False),
    TurnDone: (_E, Scope.LOOP, Profile.TURN, True),
    TurnFailed: (_E, Scope.LOOP, Profile.TURN, True),
    TurnInterrupted: (_E, Scope.LOOP, Profile.TURN, True),
    PermissionRequested: (_E, Scope.LOOP, Profile.TOOL, False),
    PermissionDecided: (_E, Scope.LOOP, Profile.TOOL, False),
    UserInputRequested: (_E, Scope.LOOP, Profile.TOOL, False),
    GateOpened: (_E, Scope.LOOP, Profile.GATE, False),
    GateResolved: (_E, Scope.LOOP, Profile.GATE, False),
    TokenDelta: (_P, Scope.LOOP, Profile.STEP, False),
    ToolCallStarted: (_P, Scope.LOOP, Profile.TOOL, False),
    ToolCallCompleted: (_P, Scope.LOOP, Profile.TOOL, False),
    ToolCallProgress: (_P, Scope.LOOP, Profile.TOOL, False),
}

EVENT_TYPES: Final[dict[str, type[Event]]] = {cls.__name__: cls for cls in CLASSIFICATION}
ENDURING_TYPES: Final = frozenset(n for n, c in EVENT_TYPES.items() if CLASSIFICATION[c][0] is _E)
EPHEMERAL_TYPES: Final = frozenset(n for n, c in EVENT_TYPES.items() if CLASSIFICATION[c][0] is _P)


def _cls(event: Event | type[Event]) -> type[Event]:
    return event if isinstance(event, type) else type(event)


def event_class(event: Event | type[Event]) -> Class:
    return CLASSIFICATION[_cls(event)][0]


def event_scope(event: Event | type[Event]) -> Scope:
    return CLASSIFICATION[_cls(event)][1]


def event_profile(event: Event | type[Event]) -> Profile:
    return CLASSIFICATION[_cls(event)][2]


def ends_turn(event: Event | type[Event]) -> bool:
    """True only for TurnDone, TurnFailed and TurnInterrupted."""
    return CLASSIFICATION[_cls(event)][3]


def type_name(event: Event | type[Event]) -> str:
    return _cls(event).__name__


# --- factories ----------------------------------------------------------------------------------


# Step and execution ids are derived, not random: a step re-run after a crash has the same id, so
# tool idempotency keys (<loop>:<step>:<tool_use_id>) stay stable and "one StepDone per step" is checkable.
_STEP_NS: Final = uuid.UUID("4f1d3c2a-7b7e-4e55-9a51-0c2f6f1b9d10")


# The variant digit of a UUID's text for each hex digit found there: its two top bits become "10".
_VARIANT: Final = {d: "89ab"[int(d, 16) & 3] for d in "0123456789abcdef"}


def _uuid_text(x: str, version: str) -> str:
    """``str(uuid.UUID(hex=x, version=...))`` from 32 hex digits, by string slicing: every step mints
    several ids, and building a UUID object (or a bytearray to set the bits in) cost more than the
    hash or the random bytes themselves."""
    return f"{x[:8]}-{x[8:12]}-{version}{x[13:16]}-{_VARIANT[x[16]]}{x[17:20]}-{x[20:32]}"


def _uuid5(namespace: bytes, name: str) -> str:
    return _uuid_text(hashlib.sha1(namespace + name.encode(), usedforsecurity=False).hexdigest(), "5")


def step_id_for(turn_id: str, step_index: int) -> str:
    return _uuid5(_STEP_NS.bytes, f"{turn_id}:{step_index}")


def execution_id_for(step_id: str, tool_use_id: str) -> str:
    # (a step id is a canonical UUID, derived by step_id_for: its bytes without uuid.UUID's checks)
    return _uuid5(bytes.fromhex(step_id.replace("-", "")), tool_use_id)


_COMPACTION_NS: Final = uuid.UUID("0c6f2d1e-5a8b-4f3c-9e7d-2b1a4c6e8f90")


def compaction_id_for(loop_id: str, upto: int) -> str:
    """The event id of a loop's compaction of its first ``upto`` messages (the same for every replica)."""
    return _uuid5(_COMPACTION_NS.bytes, f"{loop_id}:{upto}")


def new_id() -> str:
    return _uuid_text(os.urandom(16).hex(), "4")


# The formatted second of the latest timestamp: every event an event loop stamps within one second
# shares it, and only the microseconds are formatted anew (the datetime round trip cost more than
# the rest of stamping an event).
_second: list[tuple[int, str]] = [(-1, "")]


def now_rfc3339() -> str:
    """The current UTC time, ``YYYY-MM-DDTHH:MM:SS.ffffffZ``."""
    seconds, nanos = divmod(time.time_ns(), 1_000_000_000)
    sec, text = _second[0]
    if sec != seconds:
        text = datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S")
        _second[0] = (seconds, text)
    return f"{text}.{nanos // 1000:06d}Z"


EvT = TypeVar("EvT", bound=Event)


def stamp(event: EvT) -> EvT:
    """Mint ``event_id`` and ``created_at`` on an enduring event where they are still empty."""
    if event_class(event) is Class.ENDURING:
        if not event.event_id:
            event.event_id = new_id()
        if not event.created_at:
            event.created_at = now_rfc3339()
    return event


def make(cls: type[EvT], **fields: Any) -> EvT:
    """Build an event; enduring ones get a fresh event_id and created_at."""
    return stamp(cls(**fields))
