"""Re-execution in a forked loop: what a call equal to one of the source's (after the fork point) does.

``reuse`` takes the source's recorded result (nothing runs), ``rerun`` runs it like any call, ``ask``
opens a permission gate (approve runs it again, deny takes the source's result). The default follows
the tool's safety annotations: read-only → rerun, idempotent → reuse, anything else → ask. What a
call does, the source's results and state given, is decided by ``policy.authorise`` (``fork_way``);
this module gives what the fork knows of its source: copied into its first record when it was
written (then the fork never reads its source: a call the source may have been running then is one
of unknown outcome), or read from the source (a fork written before forks copied them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from nats.aio.client import Client as NATS

from services.model_step.steps import may_run_calls
from services.toolcaller.client import OK, CallOutcome
from services.toolwire import protocol as tp
from services.toolwire.spec import ToolSpec
from shared.content import ToolResultMessage
from shared.events import LoopForked
from shared.forking import call_key, source_results
from shared.history import LoopHistory
from shared.replay import load, replay
from shared.subjects import Names
from shared.wiretypes import Reexecution

REUSE: Final[Reexecution] = "reuse"
RERUN: Final[Reexecution] = "rerun"
ASK: Final[Reexecution] = "ask"
# How long a fork that reads its source (one written before forks copied its calls) waits for a busy
# source to commit an equal call (or come to rest) before it asks.
SOURCE_WAIT_SECONDS: Final = 30.0

SourceResults = dict[tuple[str, str], ToolResultMessage]


def reexecution_for(forked: LoopForked, tool_name: str, spec: ToolSpec | None) -> Reexecution:
    """reuse | rerun | ask for a repeated call of ``tool_name``: the fork's rule, ``*``, then the annotations."""
    explicit = forked.reexecution.get(tool_name) or forked.reexecution.get("*")
    if explicit:
        return explicit
    if spec is not None and spec.read_only:
        return RERUN
    if spec is not None and spec.idempotent:
        return REUSE
    return ASK


@dataclass(frozen=True, slots=True)
class SourceView:
    """What a fork knows of its source's calls after the fork point: their committed results, and
    whether the source may be running calls (``busy``: their outcome is not known yet). ``copied``:
    as the fork copied them when it was written; it never learns more (nothing to wait for)."""

    results: SourceResults
    busy: bool
    copied: bool = False


def copied_view(forked: LoopForked) -> SourceView | None:
    """The source's calls as the fork copied them when it was written: all the fork ever knows of
    them (a source at work then may have been running calls: their outcome stays unknown). None:
    read the source (a fork written before forks copied them)."""
    c = forked.source_calls
    if c is None:
        return None
    return SourceView(results={(x.name, x.input): x.result for x in c.calls}, busy=c.busy, copied=True)


async def read_source(
    nc: NATS, names: Names, forked: LoopForked, max_record_bytes: int, fold: LoopHistory | None, *, consistent: bool
) -> tuple[SourceView, LoopHistory]:
    """The source's calls after the fork point, and its fold (``fold``, the last one, is read on
    from where it ended): busy while it has work to do (:func:`~services.model_step.steps.may_run_calls`)."""
    # The fold first: a call committed after it is read below, so a source seen resting has
    # committed every call it ran.
    h = await load(nc, names, forked.source_loop_id, fold, max_record_bytes=max_record_bytes, consistent=consistent)
    records = [
        r
        async for r in replay(
            nc, forked.source_loop_id, names=names, from_seq=forked.source_seq, max_record_bytes=max_record_bytes
        )
    ]
    return SourceView(results=source_results(records, forked.source_seq), busy=may_run_calls(h)), h


def recorded_outcome(results: SourceResults, name: str, raw_input: str) -> CallOutcome | None:
    """The source's result of an equal call as a finished call outcome (None: the source made no such call)."""
    r = results.get(call_key(name, raw_input))
    if r is None:
        return None
    return CallOutcome(OK, result=tp.ResultBody(blocks=list(r.blocks or []), is_error=r.is_error))
