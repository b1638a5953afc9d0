"""A live view of one loop: model text streaming, tool calls starting and completing, commits.

Fed with every event of the loop as it arrives (live ephemeral ones and replayed enduring ones).
On a terminal it is a rich ``Live`` display that redraws in place; otherwise (a pipe, a file, CI)
it writes plain lines as things happen, text tokens inline.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import IO, Final

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.spinner import Spinner
from rich.table import Table
from rich.text import Text

from services.cli.render import clip, describe
from shared.content import AIMessage, ToolResultMessage, text_of
from shared.events import (
    Event,
    GateOpened,
    GateResolved,
    PermissionRequested,
    StepDone,
    TokenDelta,
    ToolCallCompleted,
    ToolCallProgress,
    ToolCallStarted,
    TurnDone,
    TurnFailed,
    TurnInterrupted,
    UserInputRequested,
)

_PAD: Final = 7  # width of the plain-mode label column


@dataclass
class ToolRow:
    name: str
    summary: str
    started: float
    progress: str = ""
    done: bool = False
    is_error: bool = False
    duration_ms: int = 0
    preview: str = ""


@dataclass
class StepRow:
    index: int
    text: str = ""
    tools: dict[str, ToolRow] = field(default_factory=dict)
    committed_seq: int = 0
    results: int = 0


class LoopView:
    """Collects one loop's progress from its events and shows it (rich live view or plain lines)."""

    def __init__(self, console: Console, *, plain: bool | None = None, out: IO[str] | None = None) -> None:
        self.console = console
        self.plain = (not console.is_terminal) if plain is None else plain
        self.out = out or console.file
        self.steps: dict[str, StepRow] = {}
        self.notes: list[str] = []
        self.status = "waiting for the model…"
        self.started = time.monotonic()
        self.finished: float | None = None
        self._open_text: str | None = None  # plain mode: the step whose text line is open
        self._live: Live | None = None

    # --- life cycle -------------------------------------------------------------------------------

    def __enter__(self) -> LoopView:
        if not self.plain:
            self._live = Live(self, console=self.console, refresh_per_second=12, transient=False)
            self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._live is not None:
            self._live.refresh()
            self._live.__exit__(None, None, None)
            self._live = None
        self._end_text()

    # --- folding events ---------------------------------------------------------------------------

    def _step(self, step_id: str) -> StepRow:
        row = self.steps.get(step_id)
        if row is None:
            row = self.steps[step_id] = StepRow(index=len(self.steps) + 1)
        return row

    def apply(self, event: Event, seq: int | None = None) -> None:
        """Fold one event (``seq`` for a committed one) and show what changed."""
        if isinstance(event, TokenDelta):
            step = self._step(event.step_id)
            if event.chunk.kind in ("text", "refusal") and event.chunk.text:
                step.text += event.chunk.text
                self._stream_text(event.step_id, event.chunk.text)
            elif event.chunk.kind == "tool_use" and event.chunk.name:
                self.status = f"the model is asking for {event.chunk.name}…"
            return
        if isinstance(event, ToolCallStarted):
            step = self._step(event.step_id)
            step.tools[event.tool_execution_id] = ToolRow(
                name=event.tool_name, summary=event.summary, started=time.monotonic()
            )
            self.status = "running tools…"
            self._line("tool", f"{clip(event.summary)} started")
        elif isinstance(event, ToolCallProgress):
            row = self._step(event.step_id).tools.get(event.tool_execution_id)
            if row is not None:
                row.progress = event.message
        elif isinstance(event, ToolCallCompleted):
            row = self._step(event.step_id).tools.get(event.tool_execution_id)
            if row is None:
                row = self._step(event.step_id).tools[event.tool_execution_id] = ToolRow(
                    name=event.tool_use_id, summary=event.tool_use_id, started=time.monotonic()
                )
            row.done, row.is_error = True, event.is_error
            row.duration_ms, row.preview = event.duration_ms, event.result_preview
            status = "failed" if event.is_error else "ok"
            self._line("tool", f"{row.name} {status} in {event.duration_ms} ms: {clip(event.result_preview)}")
        elif isinstance(event, StepDone):
            step = self._step(event.step_id)
            head = event.messages[0] if event.messages else None
            if not step.text and isinstance(head, AIMessage) and text_of(head):
                # The live tokens were missed (joined late, or dropped): show the committed text.
                step.text = text_of(head)
                self._stream_text(event.step_id, step.text)
            step.committed_seq = seq or 0
            step.results = sum(1 for m in event.messages if isinstance(m, ToolResultMessage))
            where = f" at seq {seq}" if seq else ""
            calls = f" with {step.results} tool result(s)" if step.results else ""
            self.status = "waiting for the model…"
            self._line("commit", f"step {step.index} committed{where}{calls}")
        elif isinstance(event, PermissionRequested | UserInputRequested | GateResolved):
            gate_id = event.request.gate_id if isinstance(event, PermissionRequested) else event.gate_id
            note = describe(event)
            if not isinstance(event, GateResolved):
                verb = "approve/deny" if isinstance(event, PermissionRequested) else "reply"
                note += f"  (loopwire {verb.split('/')[0]} {gate_id})"
                self.status = "waiting for an operator at a gate…"
            self.notes.append(note)
            self._line("gate", note)
        elif isinstance(event, GateOpened):
            pass  # PermissionRequested / UserInputRequested say it better
        elif isinstance(event, TurnDone | TurnFailed | TurnInterrupted):
            self.finished = time.monotonic()
            elapsed = self.finished - self.started
            if isinstance(event, TurnDone):
                self.status = f"turn done in {elapsed:.2f} s"
            else:
                # Whole: why a turn failed is the line a person reads first (a model's error included).
                self.status = f"{describe(event, limit=2000)} (after {elapsed:.2f} s)"
            self._line("turn", self.status)
        if self._live is not None:
            self._live.refresh()

    # --- plain output -----------------------------------------------------------------------------

    def _write(self, text: str) -> None:
        if self.plain:
            self.out.write(text)
            self.out.flush()

    def _end_text(self) -> None:
        if self._open_text is not None:
            self._write("\n")
            self._open_text = None

    def _stream_text(self, step_id: str, text: str) -> None:
        if not self.plain:
            return
        if self._open_text != step_id:
            self._end_text()
            self._write(f"{'model':<{_PAD}}| ")
            self._open_text = step_id
        self._write(text.replace("\n", "\n" + " " * _PAD + "| "))

    def _line(self, label: str, text: str) -> None:
        if not self.plain:
            return
        self._end_text()
        self._write(f"{label:<{_PAD}}| {text}\n")

    # --- rich rendering ---------------------------------------------------------------------------

    def __rich__(self) -> RenderableType:
        parts: list[RenderableType] = []
        for step in self.steps.values():
            mark = f"committed at seq {step.committed_seq}" if step.committed_seq else "streaming…"
            parts.append(Text.assemble((f"step {step.index}", "bold cyan"), ("  " + mark, "dim")))
            if step.text:
                parts.append(Text(step.text))
            if step.tools:
                grid = Table.grid(padding=(0, 1))
                for row in step.tools.values():
                    if not row.done:
                        took = f"{time.monotonic() - row.started:.1f} s"
                        icon: RenderableType = Spinner("dots", style="yellow")
                        detail = Text(row.progress or "running", style="yellow")
                    else:
                        took = f"{row.duration_ms} ms"
                        icon = Text("✗", style="red bold") if row.is_error else Text("✓", style="green bold")
                        detail = Text(clip(row.preview, 70), style="red" if row.is_error else "")
                    grid.add_row(icon, Text(clip(row.summary, 50), style="bold"), Text(took, style="dim"), detail)
                parts.append(grid)
        for note in self.notes:
            parts.append(Text(note, style="magenta"))
        if self.finished is None:
            parts.append(Spinner("dots", text=Text(self.status, style="dim")))
        else:
            parts.append(Text(self.status, style="bold green" if self.status.startswith("turn done") else "bold red"))
        return Group(*parts)
