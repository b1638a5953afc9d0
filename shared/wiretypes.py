"""Constrained wire types: ids, timestamps, bounded counts and every closed vocabulary, defined once.

msgspec enforces these on decode, and the generated JSON Schemas (``loopwire schema``) carry them:
each annotated type has a ``title``, and the schema generator turns every titled type into one named
definition (``#/$defs/Uuid``, ``#/$defs/TurnFailedKind``...) that the fields reference.

Patterns end in ``(?!\\n)$`` rather than ``$``: in Python's ``re`` (and PCRE) ``$`` also matches
before a final newline, in ECMA 262 it does not; with the lookahead every engine agrees.
"""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal, get_args

from msgspec import Meta

UINT64_MAX: Final = 2**64 - 1
INT64_MAX: Final = 2**63 - 1


def exact(body: str) -> str:
    """A pattern matching the whole string and nothing else, alike in ECMA 262 and Python ``re``."""
    return f"^{body}(?!\\n)$"


UUID_BODY: Final = "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
UUID_PATTERN: Final = exact(UUID_BODY)
UUID_OR_EMPTY_PATTERN: Final = exact(f"(?:{UUID_BODY})?")
# A real RFC 3339 instant with upper-case T and Z; whether the day exists is left to format date-time.
RFC3339_BODY: Final = (
    "[0-9]{4}-(?:0[1-9]|1[0-2])-(?:0[1-9]|[12][0-9]|3[01])"
    "T(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\\.[0-9]+)?"
    "(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])"
)
RFC3339_PATTERN: Final = exact(RFC3339_BODY)
RFC3339_OR_EMPTY_PATTERN: Final = exact(f"(?:{RFC3339_BODY})?")
TOOL_NAME_BODY: Final = "[A-Za-z0-9_-]{1,64}"
TOOL_NAME_PATTERN: Final = exact(TOOL_NAME_BODY)
# W3C trace context, version 00, with non-zero trace and span ids.
TRACEPARENT_BODY: Final = "00-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}"
TRACEPARENT_OR_EMPTY_PATTERN: Final = exact(f"(?:{TRACEPARENT_BODY})?")
POLICY_KEY_PATTERN: Final = exact(f"(?:\\*|{TOOL_NAME_BODY})")
# Python's whitespace (str.isspace), spelled out: ECMA 262's \s is a different set.
WHITESPACE_CLASS: Final = (
    "\\t\\n\\x0b\\x0c\\r\\x1c-\\x20\\x85\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000"
)
NON_BLANK_PATTERN: Final = f"[^{WHITESPACE_CLASS}]"
SUMMARY_MAX_BYTES: Final = 1024
PREVIEW_MAX_BYTES: Final = 2048
PREVIEW_MAX_LINES: Final = 20
NO_CONTROL_PATTERN: Final = exact("[^\\x00-\\x1f\\x7f]*")
PREVIEW_LINES_PATTERN: Final = exact(f"[^\\n]*(?:\\n[^\\n]*){{0,{PREVIEW_MAX_LINES - 1}}}")

UNSET: Final[Any] = ""
"""The default of a vocabulary field that has no default value: "" (absent) is refused by validation, and
the field is required in the schema. Typed Any so a ``Literal`` field can default to it."""

# --- ids and time ---------------------------------------------------------------------------------

Uuid = Annotated[
    str,
    Meta(
        pattern=UUID_PATTERN,
        max_length=36,
        title="Uuid",
        description="A canonical lowercase 8-4-4-4-12 UUID string.",
    ),
]
UuidOrEmpty = Annotated[
    str,
    Meta(
        pattern=UUID_OR_EMPTY_PATTERN,
        max_length=36,
        title="UuidOrEmpty",
        description='An id coordinate: a canonical lowercase UUID, or "" (= absent).',
    ),
]
Rfc3339 = Annotated[
    str,
    Meta(
        pattern=RFC3339_PATTERN,
        title="Rfc3339",
        description="An RFC 3339 date-time (upper-case T and Z) naming a real instant.",
        extra_json_schema={"format": "date-time"},
    ),
]
Rfc3339OrEmpty = Annotated[
    str,
    Meta(
        pattern=RFC3339_OR_EMPTY_PATTERN,
        title="Rfc3339OrEmpty",
        description='An RFC 3339 date-time, or "" (= absent).',
    ),
]
TraceparentOrEmpty = Annotated[
    str,
    Meta(
        pattern=TRACEPARENT_OR_EMPTY_PATTERN,
        max_length=55,
        title="TraceparentOrEmpty",
        description='A W3C traceparent (version 00), or "" (= not traced).',
    ),
]
ToolName = Annotated[
    str,
    Meta(pattern=TOOL_NAME_PATTERN, title="ToolName", description="A tool name: 1 to 64 of A-Z a-z 0-9 _ -."),
]
NonEmpty = Annotated[str, Meta(min_length=1)]
NonBlank = Annotated[str, Meta(pattern=NON_BLANK_PATTERN, description="Not only whitespace (Python str.isspace).")]
PolicyKey = Annotated[
    str, Meta(pattern=POLICY_KEY_PATTERN, title="PolicyKey", description='A tool name, or "*" (every other tool).')
]
# Bytes are checked by validate_event; a string within the byte bound is within these character bounds.
SummaryText = Annotated[
    str,
    Meta(
        max_length=SUMMARY_MAX_BYTES,
        pattern=NO_CONTROL_PATTERN,
        description=f"At most {SUMMARY_MAX_BYTES} UTF-8 bytes, no control characters.",
    ),
]
PreviewText = Annotated[
    str,
    Meta(
        max_length=PREVIEW_MAX_BYTES,
        pattern=PREVIEW_LINES_PATTERN,
        description=f"At most {PREVIEW_MAX_BYTES} UTF-8 bytes and {PREVIEW_MAX_LINES} lines.",
    ),
]
CauseRef = Annotated[
    str, Meta(max_length=128, title="CauseRef", description="An id in cause (at most 128 characters).")
]

# --- counts and indexes ---------------------------------------------------------------------------

EnvelopeVersion = Literal[1]
# The largest whole number a client may set as a limit or a size (budgets, Limits, ContextPolicy):
# 2^53 - 1, the largest integer every JSON reader holds exactly (a double's, as in JavaScript).
MAX_LIMIT_COUNT: Final = 2**53 - 1
# Counts loopwire writes itself have no upper bound (a model's usage is summed as reported):
# msgspec decodes integers of any size (and its bounds must fit an int64).
TurnIndex = Annotated[int, Meta(ge=1, title="TurnIndex", description="1 for a loop's first turn.")]
Count = Annotated[int, Meta(ge=0, title="Count", description="A non-negative count or index.")]
TokenCount = Annotated[int, Meta(ge=0, title="TokenCount", description="A token count.")]
LimitCount = Annotated[
    int,
    Meta(ge=0, le=MAX_LIMIT_COUNT, title="LimitCount", description="A count a client sets: 0 to 2^53 - 1."),
]
MAX_LIMIT_VALUE: Final = 1_000_000  # Limits' max_iterations, max_calls_per_turn and max_parallel
LimitValue = Annotated[
    int, Meta(ge=1, le=MAX_LIMIT_VALUE, title="LimitValue", description="A per-loop limit, 1 to 10^6.")
]
Seq = Annotated[int, Meta(ge=0, le=INT64_MAX, title="Seq", description="A history stream sequence (0 = none).")]

# --- closed vocabularies --------------------------------------------------------------------------
#
# Each is a Literal (string values in code, an enum in the schema) with a title naming its definition.

_PolicyEffect = Literal["allow", "deny", "ask"]
_TurnFailedKind = Literal[
    "empty_response", "tool_limit", "model_error", "turn_panic", "unknown", "budget", "context_overflow"
]
_GateKind = Literal["permission", "user_input", "budget"]
_GateAction = Literal["approve", "approve_always", "deny", "reply", "abandoned"]
_AnswerAction = Literal["approve", "approve_always", "deny", "reply"]
_PermissionEffect = Literal["approve", "deny"]
_PermissionReason = Literal["policy_allow", "policy_deny", "always_allowed", "gate_approved", "gate_denied"]
_DecisionEffect = Literal["approve", "deny", "reply"]
_ChunkKind = Literal["text", "refusal", "thinking", "signature", "tool_use"]
_ToolErrorKind = Literal["timeout", "canceled", "internal", "not_started", "refused", "unavailable", "crashed"]
_OnUnknown = Literal["error", "ask"]
_RetryOutcome = Literal["crashed", "unavailable", "timeout"]
_GateReason = Literal["", "outcome_unknown", "fork_rerun"]
_Reexecution = Literal["reuse", "rerun", "ask"]
_OnBudget = Literal["fail", "ask"]
_ContextStrategy = Literal["none", "clear_tool_results", "compact"]


PolicyEffect = Annotated[_PolicyEffect, Meta(title="PolicyEffect", description="LoopStarted policy values.")]
TurnFailedKind = Annotated[_TurnFailedKind, Meta(title="TurnFailedKind", description="TurnFailed.err.kind")]
GateKind = Annotated[_GateKind, Meta(title="GateKind", description="Gate.kind")]
GateAction = Annotated[
    _GateAction, Meta(title="GateAction", description="GateResolved.action and Gate.controls entries.")
]
AnswerAction = Annotated[
    _AnswerAction, Meta(title="AnswerAction", description="AnswerRequest.action (a GateAction but abandoned).")
]
PermissionEffect = Annotated[_PermissionEffect, Meta(title="PermissionEffect", description="PermissionDecided.effect")]
PermissionReason = Annotated[_PermissionReason, Meta(title="PermissionReason", description="PermissionDecided.reason")]
DecisionEffect = Annotated[_DecisionEffect, Meta(title="DecisionEffect", description="Decision.effect")]
ChunkKind = Annotated[_ChunkKind, Meta(title="ChunkKind", description="TokenDelta.chunk.kind")]
ToolErrorKind = Annotated[_ToolErrorKind, Meta(title="ToolErrorKind", description="ToolErrorBody.kind")]
OnUnknown = Annotated[_OnUnknown, Meta(title="OnUnknown", description="LoopStarted.on_unknown")]
RetryOutcome = Annotated[_RetryOutcome, Meta(title="RetryOutcome", description="RetryPolicy.retry_on entries")]
GateReason = Annotated[_GateReason, Meta(title="GateReason", description="Gate.reason (empty: an ordinary gate)")]
Reexecution = Annotated[
    _Reexecution, Meta(title="Reexecution", description="LoopForked.reexecution values: a repeated call of the source")
]

OnBudget = Annotated[
    _OnBudget, Meta(title="OnBudget", description="Budget.on_budget: a spent budget fails the turn or asks")
]
ContextStrategy = Annotated[
    _ContextStrategy,
    Meta(title="ContextStrategy", description="ContextPolicy.strategy: how requests fit the window"),
]

POLICY_EFFECTS: Final[tuple[str, ...]] = get_args(_PolicyEffect)
# The policy effects by name, typed by the vocabulary (a misspelling fails the type check).
ALLOW: Final[_PolicyEffect] = "allow"
DENY: Final[_PolicyEffect] = "deny"
ASK: Final[_PolicyEffect] = "ask"
TURN_FAILED_KINDS: Final[tuple[str, ...]] = get_args(_TurnFailedKind)
GATE_KINDS: Final[tuple[str, ...]] = get_args(_GateKind)
GATE_ACTIONS: Final[tuple[str, ...]] = get_args(_GateAction)
ANSWER_ACTIONS: Final[tuple[str, ...]] = get_args(_AnswerAction)
PERMISSION_EFFECTS: Final[tuple[str, ...]] = get_args(_PermissionEffect)
PERMISSION_REASONS: Final[tuple[str, ...]] = get_args(_PermissionReason)
DECISION_EFFECTS: Final[tuple[str, ...]] = get_args(_DecisionEffect)
CHUNK_KINDS: Final[tuple[str, ...]] = get_args(_ChunkKind)
TOOL_ERROR_KINDS: Final[tuple[str, ...]] = get_args(_ToolErrorKind)
ON_UNKNOWN_OUTCOMES: Final[tuple[str, ...]] = get_args(_OnUnknown)
# Call outcomes a retry policy may send again (the tool gave no answer); a tool's own error never is.
RETRYABLE_OUTCOMES: Final[tuple[str, ...]] = get_args(_RetryOutcome)
GATE_REASONS: Final[tuple[str, ...]] = get_args(_GateReason)
REEXECUTIONS: Final[tuple[str, ...]] = get_args(_Reexecution)
ON_BUDGET_OUTCOMES: Final[tuple[str, ...]] = get_args(_OnBudget)
CONTEXT_STRATEGIES: Final[tuple[str, ...]] = get_args(_ContextStrategy)
