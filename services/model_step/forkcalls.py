"""Re-execution in a forked loop: what a call equal to one of the source's (after the fork point) does.

``reuse`` takes the source's recorded result (nothing runs), ``rerun`` runs it like any call, ``ask``
opens a permission gate (approve runs it again, deny takes the source's result). The default follows
the tool's safety annotations: read-only → rerun, idempotent → reuse, anything else → ask.
"""

from __future__ import annotations

from typing import Final

from nats.aio.client import Client as NATS

from services.tools import protocol as tp
from services.tools.client import OK, CallOutcome
from services.tools.spec import ToolSpec
from shared.content import ToolResultMessage
from shared.events import LoopForked
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


async def read_source_results(nc: NATS, names: Names, forked: LoopForked, max_record_bytes: int) -> SourceResults:
    """The source's recorded results of the calls it made after the fork point."""
    records = [
        r
        async for r in replay(
            nc, forked.source_loop_id, names=names, from_seq=forked.source_seq + 1, max_record_bytes=max_record_bytes
        )
    ]
    return source_results(records, forked.source_seq)


def recorded_outcome(results: SourceResults, name: str, raw_input: str) -> CallOutcome | None:
    """The source's result of an equal call as a finished call outcome (None: the source made no such call)."""
    r = results.get(call_key(name, raw_input))
    if r is None:
        return None
    return CallOutcome(OK, result=tp.ResultBody(blocks=list(r.blocks or []), is_error=r.is_error))
