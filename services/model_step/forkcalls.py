"""Re-execution in a forked loop: what a call equal to one of the source's (after the fork point) does.

``reuse`` takes the source's recorded result (nothing runs), ``rerun`` runs it like any call, ``ask``
opens a permission gate (approve runs it again, deny takes the source's result). The default follows
the tool's safety annotations: read-only → rerun, idempotent → reuse, anything else → ask.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from nats.aio.client import Client as NATS

from services.tools import protocol as tp
from services.tools.client import OK, CallOutcome
from services.tools.spec import ToolSpec
from shared.content import ToolResultMessage
from shared.events import (
    Event,
    LoopClosed,
    LoopForked,
    LoopIdle,
    LoopStarted,
    PermissionRequested,
    TurnDone,
    TurnFailed,
    TurnInterrupted,
    UserInputRequested,
)
from shared.forking import call_key, source_results
from shared.history import replay
from shared.subjects import Names
from shared.wiretypes import GateReason, Reexecution

REUSE: Final[Reexecution] = "reuse"
RERUN: Final[Reexecution] = "rerun"
ASK: Final[Reexecution] = "ask"
# Decision reason of a call that takes the source's result; gate reason of a repeated call's gate.
FORK_REUSED: Final = "fork_reused"
GATE_FORK_RERUN: Final[GateReason] = "fork_rerun"
FORK_RERUN_SUMMARY: Final = "forked: the source made this call; approve runs it again, deny reuses its result: "
FORK_RUNNING_SUMMARY: Final = (
    "forked: the source may be running this call now; approve runs it here too, deny takes the source's result: "
)
# Decision reason of a call whose gate was denied while the source had no result of it to take.
FORK_NO_RESULT: Final = "fork_no_source_result"
# How long a fork waits for a busy source to commit an equal call (or come to rest) before it asks.
SOURCE_WAIT_SECONDS: Final = 30.0

SourceResults = dict[tuple[str, str], ToolResultMessage]


def reexecution_for(forked: LoopForked, tool_name: str, spec: ToolSpec | None) -> str:
    """reuse | rerun | ask for a repeated call of ``tool_name``: the fork's rule, ``*``, then the annotations."""
    explicit = forked.reexecution.get(tool_name) or forked.reexecution.get("*")
    if explicit:
        return explicit
    if spec is not None and spec.read_only:
        return RERUN
    if spec is not None and spec.idempotent:
        return REUSE
    return ASK


# A source whose last record is one of these runs no call: it rests, or waits at a gate (a step is
# authorised whole before any of its calls runs). After any other, a drive of it may be running calls
# whose results are not committed yet.
_AT_REST: Final = frozenset(
    {
        LoopStarted,
        LoopForked,
        LoopIdle,
        LoopClosed,
        TurnDone,
        TurnFailed,
        TurnInterrupted,
        PermissionRequested,
        UserInputRequested,
    }
)


@dataclass(frozen=True, slots=True)
class SourceView:
    """What a fork knows of its source's calls after the fork point: their committed results, and
    whether the source may be running calls right now (``busy``: their outcome is not known yet)."""

    results: SourceResults
    busy: bool


def may_be_running(last: Event | None) -> bool:
    """Whether a loop whose last record is ``last`` may have a call running."""
    return last is not None and type(last) not in _AT_REST


async def read_source(nc: NATS, names: Names, forked: LoopForked, max_record_bytes: int) -> SourceView:
    """The source's records from the fork point on: its results after the point, and whether it is busy."""
    records = [
        r
        async for r in replay(
            nc, forked.source_loop_id, names=names, from_seq=forked.source_seq, max_record_bytes=max_record_bytes
        )
    ]
    last = records[-1][1] if records else None
    return SourceView(results=source_results(records, forked.source_seq), busy=may_be_running(last))


def recorded_outcome(results: SourceResults, name: str, raw_input: str) -> CallOutcome | None:
    """The source's result of an equal call as a finished call outcome (None: the source made no such call)."""
    r = results.get(call_key(name, raw_input))
    if r is None:
        return None
    return CallOutcome(OK, result=tp.ResultBody(blocks=list(r.blocks or []), is_error=r.is_error))
