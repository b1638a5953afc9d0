"""The ``fork`` verb: a new loop from a committed point of another one (see shared.forking).

The fork's records are written in atomic batches of at most ``FORK_BATCH`` records. The first
batch starts with ``LoopForked``, which announces how many records follow; until the last of them
is stored the new loop is *forming*: the model-step does not drive it, the loop API refuses it and
``loopwire loops`` marks it. Every record's id is derived from the new loop id and the command, so a
repeated fork command (a client retry after a timeout, or after a committer died between batches)
finds what is stored, writes only the rest, and ends with the same whole loop. The fork's digest
chain continues its source's: its first record chains to the source's record at the fork point. A fork of at most
``FORK_BATCH`` records (the usual case) is a single atomic commit: no loop at all, or all of it.
"""

from __future__ import annotations

import asyncio
from typing import Final

from shared.codec import encode_event
from shared.content import AIMessage, tool_uses
from shared.errors import ErrorKind, InvalidEventError, LoopwireError, RecordTooLargeError
from shared.events import Event, ForkChanges, StepDone, now_rfc3339
from shared.forking import ForkPointError, ForkSpec, build_fork, check_point, source_calls
from shared.history import fold
from shared.jserrors import JetStreamError, JetStreamUnavailableError
from shared.modelspec import spec_problem
from shared.nextaction import may_run_calls
from shared.protocol import ApiReply, ForkRequest, WireError
from shared.replay import replay

from .loops import Loops
from .looptools import loop_tools

FORK_BATCH: Final = 500  # records per atomic batch (the server allows 1,000)
FORK_BATCH_BYTES: Final = 8 * 1024 * 1024


def _changes(req: ForkRequest) -> ForkChanges:
    if req.input is not None and not req.input.strip():
        raise WireError(ErrorKind.INVALID, "input must not be empty", field="input")
    if req.model is not None and len(req.model) > 512:
        raise WireError(ErrorKind.INVALID, "model is longer than 512 characters", field="model")
    if req.model is not None and (problem := spec_problem(req.model)):
        raise WireError(ErrorKind.INVALID, problem, field="model")
    return ForkChanges(input=req.input, model=req.model, system=req.system, policy=req.policy or None)


async def _source_records(loops: Loops, source: str) -> list[tuple[int, Event]]:
    try:
        limit = loops.settings.max_record_bytes
        return [r async for r in replay(loops.nc, source, names=loops.names, max_record_bytes=limit)]
    except (JetStreamUnavailableError, JetStreamError) as e:
        raise WireError(ErrorKind.UNAVAILABLE, f"cannot read the source loop: {e}") from None
    except LoopwireError as e:
        raise WireError(ErrorKind.UNAVAILABLE, f"the source loop's history does not decode: {e}") from None


async def _check_rules(
    loops: Loops, allow_list: list[str] | None, records: list[tuple[int, Event]], req: ForkRequest
) -> None:
    """Every tool the fork's policy changes and re-execution rules name is one of the loop's: its
    allow-list, else a live tool or one the source called."""
    policy, reexecution = list(req.policy or {}), list(req.reexecution or {})
    called = {
        b.name
        for _, e in records
        if isinstance(e, StepDone)
        for m in e.messages
        if isinstance(m, AIMessage)
        for b in tool_uses(m)
    }
    tools = await loop_tools(loops.nc, loops.settings, allow_list, policy + reexecution, called)
    tools.check("policy", policy)
    tools.check("reexecution", reexecution)


def _encoded(loops: Loops, spec: ForkSpec, events: list[Event]) -> list[bytes]:
    """The fork's records as stored. Its first (``LoopForked``) carries the source's calls after the
    point; too large for one record, the fork is refused: written without them, it would have to
    read its source again."""
    limit = loops.settings.max_record_bytes
    first, *rest = events
    try:
        head = encode_event(first, max_bytes=limit)
    except RecordTooLargeError as e:
        n = len(spec.source_calls.calls) if spec.source_calls is not None else 0
        raise WireError(
            ErrorKind.TOO_LARGE,
            f"the source's {n} calls after seq {spec.at} take the fork's first record to {e.size} bytes, over "
            f"the {limit}-byte record limit (LW_MAX_RECORD_BYTES): fork at a later point",
            event=type(first).__name__,
            field="source_calls",
        ) from None
    return [head, *(encode_event(e, max_bytes=limit) for e in rest)]


def _batches(payloads: list[bytes]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    start, size = 0, 0
    for i, p in enumerate(payloads):
        if i > start and (i - start >= FORK_BATCH or size + len(p) > FORK_BATCH_BYTES):
            out.append((start, i))
            start, size = i, 0
        size += len(p)
    if start < len(payloads):
        out.append((start, len(payloads)))
    return out


async def fork(loops: Loops, loop_id: str, req: ForkRequest, first_event_id: str) -> ApiReply:
    """Write the fork ``loop_id`` of ``req.source_loop_id`` (or finish one a repeat of it began)."""
    if req.source_loop_id == loop_id:
        raise WireError(ErrorKind.INVALID, "a loop cannot be forked into itself", field="source_loop_id")
    changes = _changes(req)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + loops.settings.commit_retry_seconds
    async with loops.lock(loop_id):
        h = await loops.history(loop_id, deadline)
        if h.forked is not None:
            mine = h.forked.cause is not None and h.forked.cause.command_id == req.command_id
            if not mine:
                raise WireError(ErrorKind.CONFLICT, "the loop was created by another command", last_seq=h.last_seq)
            if not h.forming:
                return ApiReply(ok=True, seq=h.formed_seq, loop_id=loop_id)
        elif h.last_seq:
            raise WireError(ErrorKind.CONFLICT, "a loop with this id already exists", last_seq=h.last_seq)
        records = await _source_records(loops, req.source_loop_id)
        if not records:
            raise WireError(ErrorKind.NOT_FOUND, "no such source loop", field="source_loop_id")
        src = fold(records)
        if src.forming:
            raise WireError(ErrorKind.NOT_FOUND, "the source loop is still being forked", field="source_loop_id")
        if h.forked is None:  # a repeat finishing a forming fork keeps what it was given
            await _check_rules(loops, src.config.tools if src.config is not None else None, records, req)
        try:
            # A repeat finishing a forming fork keeps its point (the source may have moved on since).
            at = check_point(records, h.forked.source_seq if h.forked is not None else req.at)
            spec = ForkSpec(
                new_loop=loop_id,
                source_loop=req.source_loop_id,
                at=at,
                command_id=req.command_id,
                created_at=h.forked.created_at if h.forked is not None else now_rfc3339(),
                changes=h.forked.changes if h.forked is not None else changes,
                reexecution=dict(h.forked.reexecution if h.forked is not None else (req.reexecution or {})),
                # Read once, here: the fork never reads its source again (whose shard may be down).
                source_calls=h.forked.source_calls
                if h.forked is not None
                else source_calls(records, at, busy=may_run_calls(src)),
            )
            events = build_fork(spec, records, first_event_id)
        except ForkPointError as e:
            raise WireError(ErrorKind.INVALID, str(e), field="at") from None
        try:
            payloads = _encoded(loops, spec, events)
        except WireError:
            raise
        except InvalidEventError as e:
            raise WireError(ErrorKind.INVALID, str(e), event=e.event, field=e.field, rule=e.rule) from None
        except LoopwireError as e:
            raise WireError(e.kind, str(e)) from None
        done = h.events  # records a repeat of this command already stored
        last = h.last_seq
        ids = [e.event_id for e in events]
        # The fork's chain continues its source's at the fork point (only its first record needs it).
        source_link = await loops.appender.link_at(req.source_loop_id, at) if not last else None
        for a, b in _batches(payloads):
            if b <= done:
                continue
            a = max(a, done)
            seqs = await loops.appender.append(loop_id, last, payloads[a:b], ids[a:b], chain_from=source_link)
            last = seqs[-1]
        loops.cache.drop(loop_id)
    await loops.queue_work(loop_id, last)
    return ApiReply(ok=True, seq=last, loop_id=loop_id)
