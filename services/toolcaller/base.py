"""The seam between the model-step and the tools: a planned call, the tool lookup and the executor.

The model-step's driver plans and authorises :class:`PlannedCall` values and hands them to an
:class:`Execute` (:class:`services.toolcaller.executor.Executor`); tool specs come from a
:class:`ToolLookup` (:class:`services.toolcaller.registry.ToolRegistry`). Implementations import this
module; it imports none of them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from services.toolcaller.client import CallOutcome
from services.toolwire.spec import ToolSpec
from shared.content import AIMessage, ToolResultMessage
from shared.events import Decision, Event, Limits, PermissionDecided, RawToolUse, RetryPolicy
from shared.toolcall import ToolCall

SpecOf = Callable[[str], ToolSpec | None]
"""A tool's spec by name (None: no worker has it, or the loop does not allow it)."""

Publisher = Callable[[Event], Awaitable[None]]


@dataclass(slots=True)
class PlannedCall:
    """One call of a step with its authorisation outcome."""

    call: ToolCall
    execution_id: str
    decision: Decision | None = None  # None: a pre-execution failure the executor reports (fail closed)
    permission_event: PermissionDecided | None = None  # the decision worth recording, if any
    recorded: CallOutcome | None = None  # finished in an earlier run of the step: its outcome stands
    fresh: bool = False  # the step was planned just now: no earlier attempt of the call exists

    @classmethod
    def of(cls, use: ToolCall | RawToolUse, execution_id: str, decision: Decision | None = None) -> PlannedCall:
        return cls(use if isinstance(use, ToolCall) else ToolCall.of(use), execution_id, decision)

    @classmethod
    def approved(cls, use: ToolCall | RawToolUse, execution_id: str) -> PlannedCall:
        return cls.of(use, execution_id, Decision(tool_use_id=use.id, tool_execution_id=execution_id, effect="approve"))

    @classmethod
    def denied(cls, use: ToolCall | RawToolUse, execution_id: str, text: str) -> PlannedCall:
        d = Decision(tool_use_id=use.id, tool_execution_id=execution_id, effect="deny", text=text)
        return cls.of(use, execution_id, d)

    @classmethod
    def replied(cls, use: ToolCall | RawToolUse, execution_id: str, text: str) -> PlannedCall:
        d = Decision(tool_use_id=use.id, tool_execution_id=execution_id, effect="reply", text=text)
        return cls.of(use, execution_id, d)


class ToolLookup(Protocol):
    """The live tools (the registry): what the model is offered, and a tool's spec by name."""

    def live(self) -> Sequence[ToolSpec]: ...

    def get(self, name: str) -> ToolSpec | None: ...


class Fence(Protocol):
    """The caller's right to start side effects (the model-step's loop lease)."""

    @property
    def held(self) -> bool: ...

    def start_by_ms(self) -> int: ...


@dataclass(frozen=True, slots=True)
class RecordFit:
    """The step's results must fit one durable record together with the step's assistant message."""

    message: AIMessage
    max_record_bytes: int


class Execute(Protocol):
    """Run one step's batch: one result per planned call, in call order, fitted to the record."""

    def __call__(
        self,
        *,
        loop_id: str,
        turn_id: str,
        step_id: str,
        planned: Sequence[PlannedCall],
        limits: Limits | None = None,
        spec_of: SpecOf | None = None,
        traceparent: str = "",
        fence: Fence | None = None,
        retries: Mapping[str, RetryPolicy] | None = None,
        fit: RecordFit | None = None,
    ) -> Awaitable[list[ToolResultMessage]]: ...


__all__ = ["Execute", "Fence", "PlannedCall", "Publisher", "RecordFit", "SpecOf", "ToolLookup"]


def step_needs_plan(specs: Iterable[ToolSpec | None]) -> bool:
    """Whether a step with calls of these tools (minted ids left out) records its plan before its calls.

    A step of read-only calls only does not: running it again asks the model again, harmlessly,
    so nobody reads its plan or its calls' records either (the executor sends ``Lw-No-Record``).
    An unknown tool counts as not read-only.
    """
    return not all(spec is not None and spec.read_only for spec in specs)
