"""The rules ``decode_event`` applies that no JSON Schema can express, each by name: the one list of them.

The published schemas (``loopwire schema``) say every other rule. A consumer that validates with
them alone implements these itself, so docs/protocol.md ("Rules a schema cannot express") lists
exactly these names and the conformance corpus holds a record breaking each (tests/unit/test_conformance.py
checks both). A check the decoder makes that a schema cannot state belongs here, named before it is coded.
"""

from __future__ import annotations

from typing import Final, NamedTuple

from shared.errors import InvalidEventError, Rule
from shared.strictjson import EMBEDDED_MAX_DEPTH
from shared.wiretypes import PREVIEW_MAX_BYTES, SUMMARY_MAX_BYTES

__all__ = ["RULES", "DecoderRule"]


class DecoderRule(NamedTuple):
    """One rule: its name as the docs list it, and the (event type, top-level field) pairs whose
    values it judges (none: the rule reads the record's bytes, whatever the event)."""

    name: str
    judges: tuple[tuple[str, str], ...] = ()

    def refusal(self, event: str) -> InvalidEventError:
        """The error of an ``event`` record breaking this rule (it names the first field judged)."""
        fields = [f for e, f in self.judges if e == event]
        return InvalidEventError(event, fields[0] if fields else "type", Rule.INVALID.value)


_INPUTS: Final = (("StepDone", "messages"), ("TurnDone", "message"), ("GateOpened", "gate"))
_STEP: Final = (("StepDone", "messages"),)

NO_DUPLICATE_KEYS: Final = DecoderRule("no duplicate keys (case-insensitive, any depth)")
ONE_RESULT_PER_USE: Final = DecoderRule("one tool result per tool use", _STEP)
RESULTS_IN_ORDER: Final = DecoderRule("results answer the tool uses in order", _STEP)
USE_IDS_NON_EMPTY: Final = DecoderRule("tool_use ids are non-empty", _STEP)
USE_IDS_DISTINCT: Final = DecoderRule("tool_use ids are distinct", _STEP)
INPUTS_STRICT: Final = DecoderRule("tool_use inputs are strict JSON", _INPUTS)
INPUT_DEPTH: Final = DecoderRule(f"a tool_use input nests at most {EMBEDDED_MAX_DEPTH} levels", _INPUTS)
SUMMARY_BYTES: Final = DecoderRule(
    f"summary is at most {SUMMARY_MAX_BYTES} UTF-8 bytes", (("ToolCallStarted", "summary"),)
)
PREVIEW_BYTES: Final = DecoderRule(
    f"result_preview is at most {PREVIEW_MAX_BYTES} UTF-8 bytes", (("ToolCallCompleted", "result_preview"),)
)
RECORD_BYTES: Final = DecoderRule("a record is at most LW_MAX_RECORD_BYTES bytes")
# JSON Schema's "integer" is any number with no fractional part, 1.0 included; the decoder reads a
# whole-number field only from an integer literal.
INTEGER_LITERALS: Final = DecoderRule("whole numbers are integer literals")
NOT_OWN_PARENT: Final = DecoderRule(
    "a child loop is not its own parent", (("LoopStarted", "parent"), ("LoopStarted", "loop_id"))
)
NOT_OWN_SOURCE: Final = DecoderRule(
    "a fork's source is another loop", (("LoopForked", "source_loop_id"), ("LoopForked", "loop_id"))
)
COMPACTION_ADVANCES: Final = DecoderRule(
    "a compaction covers more than the one before it",
    (("ContextCompacted", "upto"), ("ContextCompacted", "previous_upto")),
)
BACKOFF_ORDERED: Final = DecoderRule("a retry's initial backoff is at most its maximum", (("LoopStarted", "retries"),))

RULES: Final[tuple[DecoderRule, ...]] = (
    NO_DUPLICATE_KEYS,
    ONE_RESULT_PER_USE,
    RESULTS_IN_ORDER,
    USE_IDS_NON_EMPTY,
    USE_IDS_DISTINCT,
    INPUTS_STRICT,
    INPUT_DEPTH,
    SUMMARY_BYTES,
    PREVIEW_BYTES,
    RECORD_BYTES,
    INTEGER_LITERALS,
    NOT_OWN_PARENT,
    NOT_OWN_SOURCE,
    COMPACTION_ADVANCES,
    BACKOFF_ORDERED,
)
