"""Turning events into text for people (one-line and multi-line summaries, tables) and JSON lines."""

from __future__ import annotations

import json
from typing import Final

import msgspec

from shared.codec import encode_live
from shared.content import AIMessage, Message, ToolResultMessage, UserMessage, text_of, tool_uses
from shared.events import (
    BudgetChanged,
    ContextCompacted,
    Event,
    GateOpened,
    GateResolved,
    InputSubmitted,
    LoopForked,
    LoopStarted,
    PermissionDecided,
    PermissionRequested,
    StepDone,
    TokenDelta,
    ToolCallCompleted,
    ToolCallProgress,
    ToolCallStarted,
    TurnDone,
    TurnFailed,
    TurnFoldedInto,
    TurnInterrupted,
    TurnStarted,
    UserInputRequested,
)

SHORT_ID: Final = 8
ONE_LINE: Final = 100


def short(ident: str) -> str:
    """The first characters of an id (enough to tell ids apart in a table)."""
    return ident[:SHORT_ID]


def clip(text: str, limit: int = ONE_LINE) -> str:
    """``text`` on one line, at most ``limit`` characters."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def clock_of(created_at: str) -> str:
    """``HH:MM:SS.mmm`` of an RFC 3339 timestamp (empty for live events)."""
    if "T" not in created_at:
        return ""
    return created_at.split("T", 1)[1][:12]


def tool_input(raw: bytes | msgspec.Raw) -> str:
    return bytes(raw).decode("utf-8", "replace")


def message_lines(message: Message, limit: int = ONE_LINE) -> list[str]:
    """One line per part of a message: its text, then each tool use."""
    if isinstance(message, AIMessage):
        out = []
        text = text_of(message)
        if text:
            out.append(f"assistant: {clip(text, limit)}")
        for use in tool_uses(message):
            out.append(f"  → {use.name} {clip(tool_input(use.input), limit)}")
        return out or ["assistant: (empty)"]
    if isinstance(message, ToolResultMessage):
        flag = " (error)" if message.is_error else ""
        return [f"  ← {message.tool_use_id}{flag}: {clip(text_of(message), limit)}"]
    role = "user" if isinstance(message, UserMessage) else "system"
    return [f"{role}: {clip(text_of(message), limit)}"]


def describe(event: Event, *, limit: int = ONE_LINE, multiline: bool = False) -> str:
    """What an event says, for a person: one line, or several for a StepDone when ``multiline``."""
    if isinstance(event, LoopStarted):
        tools = "all live tools" if event.tools is None else (", ".join(event.tools) or "no tools")
        policy = ", ".join(f"{k}={v}" for k, v in sorted(event.policy.items()))
        parts = [f"model {event.model or '(default)'}", f"tools: {tools}", f"default policy {event.default_policy}"]
        if policy:
            parts.append(f"policy {policy}")
        if event.system:
            parts.append(f"system: {clip(event.system, 40)}")
        return "; ".join(parts)
    if isinstance(event, BudgetChanged):
        b = event.budget
        return (
            "budget: "
            + (
                ", ".join(f"{k}={v}" for k, v in msgspec.structs.asdict(b).items() if v and k != "on_budget")
                or "unlimited"
            )
            + f" (on budget: {b.on_budget})"
        )
    if isinstance(event, LoopForked):
        return f"forked from {event.source_loop_id} at seq {event.source_seq} ({event.records} records follow)"
    if isinstance(event, InputSubmitted):
        return f"user: {clip(text_of(event.message), limit)}"
    if isinstance(event, TurnStarted | TurnFoldedInto):
        return f"turn {event.turn_index}: {clip(text_of(event.message), limit)}"
    if isinstance(event, ContextCompacted):
        head = (
            f"context compacted: messages 1-{event.upto} summarised by {event.model or '(the loop model)'}, "
            f"{event.tokens_before} → {event.tokens_after} tokens"
        )
        return head + "\n" + event.summary if multiline else clip(f"{head}: {event.summary}", limit * 2)
    if isinstance(event, StepDone):
        lines = [line for m in event.messages for line in message_lines(m, limit)]
        return "\n".join(lines) if multiline else clip(" | ".join(s.strip() for s in lines), limit * 2)
    if isinstance(event, TurnDone):
        text = text_of(event.message) if event.message is not None else ""
        usage = f" (tokens in {event.usage.input_tokens}, out {event.usage.output_tokens})" if event.usage else ""
        return f"turn {event.turn_index} done{usage}: {clip(text, limit)}"
    if isinstance(event, TurnFailed):
        return f"turn {event.turn_index} failed: {event.err.kind}: {clip(event.err.message, limit)}"
    if isinstance(event, TurnInterrupted):
        return f"turn {event.turn_index} interrupted: {event.reason}"
    if isinstance(event, PermissionRequested):
        r = event.request
        return f"gate {r.gate_id}: may {r.tool_name} run? {clip(r.summary, limit)}"
    if isinstance(event, PermissionDecided):
        return f"{event.tool_name}: {event.effect} ({event.reason})"
    if isinstance(event, UserInputRequested):
        choices = f" [{', '.join(event.choices)}]" if event.choices else ""
        return f"gate {event.gate_id}: {clip(event.question, limit)}{choices}"
    if isinstance(event, GateOpened):
        g = event.gate
        tool = f" {g.tool_name}" if g.tool_name else ""
        return f"gate {g.id} ({g.kind}{tool})"
    if isinstance(event, GateResolved):
        extra = event.text or event.reason
        by = f" by {event.resolver}" if event.resolver else ""
        return f"gate {event.gate_id}: {event.action}{by}" + (f": {clip(extra, limit)}" if extra else "")
    if isinstance(event, TokenDelta):
        c = event.chunk
        if c.kind == "tool_use":
            head = f"{c.name} " if c.name else ""
            return f"tool_use[{c.index}] {head}{c.text!r}"
        return f"{c.kind}: {c.text!r}"
    if isinstance(event, ToolCallStarted):
        return clip(event.summary or event.tool_name, limit)  # the summary starts with the tool's name
    if isinstance(event, ToolCallCompleted):
        status = "error" if event.is_error else "ok"
        return f"{event.tool_use_id} {status} in {event.duration_ms} ms: {clip(event.result_preview, limit)}"
    if isinstance(event, ToolCallProgress):
        return clip(event.message, limit)
    return ""


def event_json(event: Event, seq: int | None = None) -> str:
    """One JSON line: ``{"seq": N|null, "event": <the event as on the wire>}``."""
    head = "null" if seq is None else str(seq)
    return f'{{"seq":{head},"event":{encode_live(event).decode()}}}'


def json_line(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=False)
