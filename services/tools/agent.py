"""Sub-agents: a tool whose every call runs a child loop (kind ``agent``, docs/tools.md "Sub-agents").

A call starts a **child loop** through the loop API, submits the call's task as its input, follows
the child's history until that turn ends and answers with the child's final answer. Everything is
derived from the call's tool execution id (stable across a re-run of the parent's step and across
re-sends of the call): the child's loop id and the command ids of its ``start``, ``input``,
``interrupt`` and ``close``. So a call sent again (its worker was killed, the parent's model-step
crashed) finds the same child: the start and the input are repeats the committer answers with their
original sequences, a child that already answered is read, one still running is followed. There is
never a second child for one call.

While the child runs, the call's progress messages (``ToolCallProgress`` in the parent) tell what
it does: its tool calls starting and ending (from its live events), its steps and gates (from its
history). A call cancelled because the parent's turn ended (interrupted, or the parent closed), or
cut by its deadline, interrupts and closes the child; a worker that stops, or a cancel from a
model-step that stopped driving the parent, leaves it alone (the call is sent again and follows it).

Nesting is bounded where a child is made: a call from a loop that already runs under this agent (a
cycle such as ping → pong → ping), or whose child would nest deeper than ``LW_AGENT_MAX_DEPTH``, gets
an error result and no child (:func:`calling_chain` reads the lineage from the loops' LoopStarted).
"""

from __future__ import annotations

import contextlib
import uuid
from dataclasses import dataclass
from typing import Annotated, Final

import anyio
import msgspec
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from services.tools.sdk import Tool, ToolContext, ToolError, ToolOutput
from services.toolwire.spec import KIND_AGENT
from shared import shaping
from shared.client import LoopClient
from shared.codec import decode_live_frame
from shared.content import AIMessage, text_of, tool_uses
from shared.errors import LoopwireError
from shared.events import (
    Event,
    GateOpened,
    GateResolved,
    LoopStarted,
    ParentRef,
    RetryPolicy,
    StepDone,
    ToolCallCompleted,
    ToolCallProgress,
    ToolCallStarted,
    TurnFailed,
)
from shared.forking import first_record
from shared.protocol import ClosedError, RemoteError
from shared.replay import load
from shared.subjects import Names
from shared.turns import TurnOutcome, wait_for_turn
from shared.wiretypes import PolicyEffect

# The namespace of every id derived from a parent's tool execution id (child loop, its commands).
CHILD_NAMESPACE: Final = uuid.UUID("7d0f3a52-6c1b-4e8a-9f27-1b5c3e9d4a60")

# A child may wait at a gate for an operator for hours: the call's deadline is long (its worker's
# heartbeats tell the caller it is alive meanwhile). ``--timeout`` sets another.
DEFAULT_AGENT_TIMEOUT_SECONDS: Final = 24 * 3600.0
# Sent again when its worker died or none is up (never on a timeout: the child was interrupted
# then): long enough for a restarted worker to register again.
AGENT_RETRY: Final = RetryPolicy(
    max_attempts=6, initial_backoff_seconds=0.5, max_backoff_seconds=4.0, retry_on=["crashed", "unavailable"]
)
# How long a cancelled call may take to interrupt and close its child.
_STOP_CHILD_SECONDS: Final = 10.0
_PROGRESS_TEXT: Final = 160


class AgentTask(msgspec.Struct, forbid_unknown_fields=True):
    """The input of every agent tool."""

    task: Annotated[str, msgspec.Meta(min_length=1, max_length=100_000, description="What the sub-agent should do")]


def child_loop_id(tool_execution_id: str) -> str:
    """The child loop of a call of an agent tool: one per tool execution id, forever."""
    return str(uuid.uuid5(CHILD_NAMESPACE, tool_execution_id))


def child_command_id(tool_execution_id: str, verb: str) -> str:
    """The command id of the call's ``verb`` (start, input, interrupt, close) on its child loop."""
    return str(uuid.uuid5(CHILD_NAMESPACE, f"{tool_execution_id}/{verb}"))


@dataclass(frozen=True, slots=True)
class AgentConfig:
    """What each child loop is started with."""

    model: str
    instructions: str = ""
    tools: tuple[str, ...] | None = None  # None: every live tool
    policy: tuple[tuple[str, PolicyEffect], ...] = ()


def agent_tool(
    name: str,
    *,
    model: str,
    instructions: str = "",
    tools: list[str] | None = None,
    description: str = "",
    policy: dict[str, PolicyEffect] | None = None,
    timeout: float = DEFAULT_AGENT_TIMEOUT_SECONDS,
) -> Tool:
    """An agent tool ``name`` (input ``{"task": string}``) whose calls run child loops of ``model``
    with ``instructions`` as their system prompt, ``tools`` (None: every tool) and ``policy``."""
    if name in (tools or ()):
        raise ValueError(f"agent tool {name!r} cannot list itself among its child's tools")
    own: dict[str, PolicyEffect] = {name: "deny"} if tools is None else {}
    config = AgentConfig(
        model=model,
        instructions=instructions,
        tools=None if tools is None else tuple(tools),
        # A child calling its own agent again would recurse without end: denied unless set otherwise
        # (a child with an allow-list cannot call it: the agent is never on that list, nor in its policy).
        policy=tuple({**own, **(policy or {})}.items()),
    )

    async def run(args: AgentTask, ctx: ToolContext) -> ToolOutput:
        return await run_child(name, config, args.task, ctx)

    return Tool(
        fn=run,
        input_type=AgentTask,
        name=name,
        description=description or f"Hand a task to the sub-agent {name}; it answers with its result.",
        timeout=timeout,
        kind=KIND_AGENT,
        idempotent=True,  # a repeat finds the same child loop (see the module docstring)
        retry=AGENT_RETRY,
        takes_context=True,
        is_async=True,
    )


async def run_child(name: str, config: AgentConfig, task: str, ctx: ToolContext) -> ToolOutput:
    """Run (or find, or follow) the call's child loop and answer with its final answer."""
    ids = ctx.ids
    if ctx.nc is None or not (ids.loop_id and ids.turn_id and ids.step_id and ids.execution_id):
        raise ToolError(f"{name} runs only as a loop's tool call (it starts a child loop of that loop)")
    eid = ids.execution_id
    child = child_loop_id(eid)
    names = ctx.settings.names
    lc = LoopClient(ctx.nc, names)
    parent = ParentRef(
        loop_id=ids.loop_id, turn_id=ids.turn_id, step_id=ids.step_id, tool_execution_id=eid, tool_name=name
    )
    tag = f"child {child[:8]}"
    refused = await _refusal(ctx, name)
    if refused:
        return ToolOutput(text=refused, is_error=True)

    def on_live(msg: Msg) -> None:
        try:
            events = decode_live_frame(msg.data)
        except LoopwireError:
            return
        for e in events:
            text = _live_progress(e)
            if text:
                ctx.progress(f"{tag}: {text}")

    async def on_live_msg(msg: Msg) -> None:
        on_live(msg)

    def on_event(e: Event, _seq: int) -> None:
        text = _history_progress(e)
        if text:
            ctx.progress(f"{tag}: {text}")

    sub = await ctx.nc.subscribe(names.live(child), cb=on_live_msg)
    try:
        ctx.progress(f"child loop {child} runs the task")
        await lc.start(
            child,
            model=config.model,
            system=config.instructions or None,
            tools=None if config.tools is None else list(config.tools),
            policy=dict(config.policy) or None,
            parent=parent,
            command_id=child_command_id(eid, "start"),
        )
        input_id = child_command_id(eid, "input")
        # Closed after a cancel: the history says how (whether the input was ever taken).
        with contextlib.suppress(ClosedError):
            await lc.input(child, task, command_id=input_id)
        outcome = await wait_for_turn(ctx.nc, names, child, input_id, 0, on_event=on_event)
    except anyio.get_cancelled_exc_class():
        remaining = ctx.remaining()
        if ctx.cancelled or (remaining is not None and remaining < 1.0):
            with anyio.CancelScope(shield=True), anyio.move_on_after(_STOP_CHILD_SECONDS):
                if (remaining is not None and remaining < 1.0) or await _abandoned(ctx, ids.turn_id):
                    await _stop(lc, child, eid)
        raise
    except RemoteError as e:
        return ToolOutput(text=shaping.tool_error(f"{name}: child loop {child}: {e}"), is_error=True)
    finally:
        with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
            await sub.unsubscribe()
    return _result(name, child, outcome)


async def calling_chain(nc: NATS, names: Names, loop_id: str, limit: int) -> list[str]:
    """The agent tools ``loop_id`` runs under, outermost first ([] for a loop started on its own),
    read from each ancestor's LoopStarted up to ``limit`` + 1 levels (enough to tell a chain too deep)."""
    chain: list[str] = []
    seen = {loop_id}
    while len(chain) <= limit:
        # (a fork's first record is its LoopForked: a fork of a child is a loop of its own, at the top)
        first = await first_record(nc, names, loop_id)
        parent = first.parent if isinstance(first, LoopStarted) else None
        if parent is None:
            break
        chain.append(parent.tool_name)
        if parent.loop_id in seen:  # only a forged lineage loops: it is a cycle all the same
            break
        loop_id = parent.loop_id
        seen.add(loop_id)
    chain.reverse()
    return chain


async def _refusal(ctx: ToolContext, name: str) -> str:
    """Why a call of agent ``name`` from the calling loop may not start a child ("" if it may): that
    agent already runs in the loop's calling chain (a cycle, e.g. ping → pong → ping, would nest
    without end), or the child would nest deeper than ``LW_AGENT_MAX_DEPTH``."""
    assert ctx.nc is not None
    max_depth = ctx.settings.agent_max_depth
    chain = await calling_chain(ctx.nc, ctx.settings.names, ctx.loop_id, max_depth)
    if name in chain:
        return shaping.agent_cycle(name, chain)
    if len(chain) + 1 > max_depth:
        return shaping.agent_too_deep(name, chain, max_depth)
    return ""


async def _abandoned(ctx: ToolContext, turn_id: str) -> bool:
    """The parent's turn that made the call has ended (interrupted, or the loop closed): nobody waits
    for the child's answer. A cancel while that turn still runs comes from a model-step that stopped
    driving the parent (a restart, a lost lease): the step runs again and sends the call again, so
    the child goes on. So does a child whose parent cannot be read now (the re-sent call follows it)."""
    assert ctx.nc is not None
    try:
        h = await load(ctx.nc, ctx.settings.names, ctx.loop_id)
    except Exception:
        return False
    return h.closed or h.open_turn is None or h.open_turn.turn_id != turn_id


async def _stop(lc: LoopClient, child: str, eid: str) -> None:
    for verb in ("interrupt", "close"):
        try:
            if verb == "interrupt":
                await lc.interrupt(child, command_id=child_command_id(eid, verb))
            else:
                await lc.close(child, command_id=child_command_id(eid, verb))
        except RemoteError:
            continue  # never started (not found), idle (no turn to interrupt) or closed: nothing more to stop


def _result(name: str, child: str, outcome: TurnOutcome) -> ToolOutput:
    if outcome.outcome == "done":
        return ToolOutput(text=outcome.answer)
    if outcome.outcome == "failed" and isinstance(outcome.event, TurnFailed):
        err = outcome.event.err
        return ToolOutput(
            text=shaping.tool_error(f"{name} failed (child loop {child}): {err.kind}: {err.message}"), is_error=True
        )
    return ToolOutput(
        text=shaping.tool_error(f"{name} did not finish (child loop {child} was {outcome.outcome})"), is_error=True
    )


def _short(text: str) -> str:
    return shaping.bounded_diagnostic(" ".join(text.split()))[:_PROGRESS_TEXT]


def _live_progress(e: Event) -> str:
    if isinstance(e, ToolCallStarted):
        return f"{e.tool_name} started: {_short(e.summary)}" if e.summary else f"{e.tool_name} started"
    if isinstance(e, ToolCallCompleted):
        state = "failed" if e.is_error else "completed"
        return f"tool call {state}: {_short(e.result_preview)}"
    if isinstance(e, ToolCallProgress) and e.message:
        return _short(e.message)
    return ""


def _history_progress(e: Event) -> str:
    if isinstance(e, StepDone) and e.messages and isinstance(e.messages[0], AIMessage):
        ai = e.messages[0]
        calls = [b.name for b in tool_uses(ai)]
        said = _short(text_of(ai))
        if calls:
            return f"step done: called {', '.join(calls)}" + (f" ({said})" if said else "")
        return f"answered: {said}" if said else ""
    if isinstance(e, GateOpened):
        tool = f" for {e.gate.tool_name}" if e.gate.tool_name else ""
        return f"waiting at {e.gate.kind} gate {e.gate.id}{tool} (answer it in the parent's gates)"
    if isinstance(e, GateResolved):
        return f"gate {e.gate_id}: {e.action}"
    return ""
