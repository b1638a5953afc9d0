"""Write a tool as a typed function with a decorator; the worker turns it into a NATS service.

    class Add(msgspec.Struct):
        a: float
        b: float

    @tool(description="Add two numbers.")
    def add(args: Add) -> str:
        return str(args.a + args.b)

The function takes one msgspec Struct (its JSON Schema is the tool's ``input_schema``) and optionally
a :class:`ToolContext` second. It may be async or sync (sync ones run in a worker thread) and returns
a ``str``, a list of content blocks, a :class:`ToolOutput`, or ``None`` (an empty result). A sync
function declared ``inline=True`` runs on the worker's event loop instead (for quick, non-blocking
work: no thread hop, but it holds up every other call while it runs). Raising
:class:`ToolError` (or any exception) makes an ``error: ...`` result; nothing a caller sends crashes
the worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
import sys
import threading
import time
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, overload

import anyio
import msgspec
from nats.aio.client import Client as NATS

from services.toolwire.protocol import CallIds, ResultBody
from services.toolwire.spec import KIND_FUNCTION, KINDS, ToolSpec, input_schema_of, valid_tool_name
from shared import shaping, telemetry
from shared.content import Block, ImageBlock, RefusalBlock, TextBlock, ThinkingBlock, ToolUseBlock
from shared.errors import LoopwireError
from shared.errors import ToolError as ToolError
from shared.events import RetryPolicy
from shared.settings import Settings
from shared.wiretypes import RETRYABLE_OUTCOMES, ToolErrorKind

log = logging.getLogger("loopwire.tools")

_BLOCK_TYPES = (TextBlock, RefusalBlock, ThinkingBlock, ToolUseBlock, ImageBlock)


class CallFailed(LoopwireError):
    """Raise from a tool to end the call with an ``error`` reply of ``kind`` instead of a result:
    the call could not run here (``unavailable``: the tool's backend is down) or its backend died
    under it (``crashed``). Callers see ``error: tool unavailable: ...`` / ``error: tool crashed: ...``.
    """

    # The tool protocol's error kind (ToolErrorBody.kind), not the loop API's ErrorKind.
    kind: ToolErrorKind  # type: ignore[assignment]

    def __init__(self, kind: ToolErrorKind, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


@dataclass(frozen=True, slots=True)
class ToolOutput:
    """A tool's answer with an explicit error flag (``is_error=True`` is shown to the model as is)."""

    text: str = ""
    is_error: bool = False


ToolReturn = str | list[Block] | ToolOutput | ResultBody | None


class ToolContext:
    """What a running call may use besides its arguments.

    ``progress(msg)`` and ``heartbeat()`` are safe from any thread and never block; ``cancelled``
    turns true when the call is cancelled (toolctl, deadline or shutdown) so sync tools can stop.
    """

    def __init__(
        self,
        *,
        ids: CallIds | None = None,
        idempotency_key: str = "",
        deadline: float | None = None,
        nc: NATS | None = None,
        settings: Settings | None = None,
        worker_id: str = "",
        progress_sink: Callable[[str], None] | None = None,
    ) -> None:
        self.ids = ids or CallIds()
        self.idempotency_key = idempotency_key
        self.deadline = deadline  # unix seconds, or None
        self.nc = nc
        self.settings = settings or Settings()
        self.worker_id = worker_id
        # The call's ``execute_tool`` span (a no-op object while tracing is off): add attributes/events.
        self.span = telemetry.current_span()
        self._sink = progress_sink
        # A plain flag: written on the loop, read from a tool's thread (a bool is safe to share).
        self._cancelled = False
        try:
            self._loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            self._loop = None
        self._loop_thread = threading.get_ident()

    @property
    def loop_id(self) -> str:
        return self.ids.loop_id

    @property
    def execution_id(self) -> str:
        return self.ids.execution_id

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    def cancel(self) -> None:
        self._cancelled = True

    def remaining(self) -> float | None:
        """Seconds left before the deadline (never negative), or None without one."""
        return None if self.deadline is None else max(0.0, self.deadline - time.time())

    def progress(self, message: str) -> None:
        """Send a progress message to the caller (surfaced as ToolCallProgress); also a heartbeat."""
        sink = self._sink
        if sink is None:
            return
        if self._loop is None or threading.get_ident() == self._loop_thread:
            sink(message)
        else:
            with contextlib.suppress(RuntimeError):  # the loop is closed: the call is over anyway
                self._loop.call_soon_threadsafe(sink, message)

    def heartbeat(self) -> None:
        """Tell the caller the call is alive now (the worker also beats on its own while it runs)."""
        self.progress("")


@dataclass(eq=False)
class Tool:
    """A tool: its function, its input type and its declaration. Built by :func:`tool`."""

    fn: Callable[..., Any]
    input_type: type[msgspec.Struct]
    name: str
    description: str = ""
    version: str = "1"
    sequential: bool = False
    write_target: str = ""
    timeout: float | None = None
    kind: str = KIND_FUNCTION
    read_only: bool = False
    idempotent: bool = False
    destructive: bool = False
    open_world: bool = False
    retry: RetryPolicy | None = None
    takes_context: bool = False
    is_async: bool = False
    inline: bool = False  # a sync function run on the event loop (see tool())
    input_schema: dict[str, Any] = field(default_factory=dict)
    _decoder: msgspec.json.Decoder[Any] | None = None

    def __post_init__(self) -> None:
        if not valid_tool_name(self.name):
            raise ValueError(f"invalid tool name {self.name!r}: use 1-64 of [A-Za-z0-9_-]")
        if self.kind not in KINDS:
            raise ValueError(f"invalid tool kind {self.kind!r}: expected one of {KINDS}")
        if self.write_target and self.write_target not in self.input_type.__struct_fields__:
            raise ValueError(f"write_target {self.write_target!r} is not a field of {self.input_type.__name__}")
        if self.timeout is not None and not self.timeout > 0:
            raise ValueError("timeout must be > 0 seconds")
        if self.inline and self.is_async:
            raise ValueError("inline applies to sync functions (async ones already run on the event loop)")
        if self.read_only and self.destructive:
            raise ValueError("a tool cannot be both read_only and destructive")
        if (r := self.retry) is not None:
            if not set(r.retry_on) <= set(RETRYABLE_OUTCOMES):
                raise ValueError(f"retry: retry_on takes {', '.join(RETRYABLE_OUTCOMES)}")
            if r.max_attempts < 1 or not 0 <= r.initial_backoff_seconds <= r.max_backoff_seconds:
                raise ValueError("retry: max_attempts ≥ 1 and 0 ≤ initial_backoff_seconds ≤ max_backoff_seconds")
            if r.max_attempts > 1 and not (self.read_only or self.idempotent):
                raise ValueError("retry: only a read_only or idempotent tool may be retried")
        self.input_schema = input_schema_of(self.input_type)
        self._decoder = msgspec.json.Decoder(self.input_type)

    def spec(self, settings: Settings | None = None) -> ToolSpec:
        timeout = self.timeout if self.timeout is not None else (settings or Settings()).tool_timeout_seconds
        return ToolSpec(
            name=self.name,
            description=self.description,
            input_schema=self.input_schema,
            version=self.version,
            sequential=self.sequential,
            has_write_target=bool(self.write_target),
            write_target=self.write_target,
            timeout_seconds=timeout,
            kind=self.kind,
            read_only=self.read_only,
            idempotent=self.idempotent,
            destructive=self.destructive,
            open_world=self.open_world,
            retry=self.retry,
        )

    def decode_args(self, raw: bytes) -> Any:
        """Decode and validate the arguments once; raises ``msgspec.ValidationError``/``DecodeError``."""
        assert self._decoder is not None
        return self._decoder.decode(raw)


def _input_type_of(fn: Callable[..., Any], localns: dict[str, Any] | None = None) -> tuple[type[msgspec.Struct], bool]:
    params = [
        p for p in inspect.signature(fn).parameters.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    if not params or len(params) > 2:
        raise TypeError(f"tool {fn.__name__}: expected (args: SomeStruct) or (args: SomeStruct, ctx: ToolContext)")
    annotation: Any = params[0].annotation
    with contextlib.suppress(Exception):  # unresolvable forward references: keep the raw annotation
        annotation = typing.get_type_hints(fn, localns=localns).get(params[0].name, annotation)
    if not (isinstance(annotation, type) and issubclass(annotation, msgspec.Struct)):
        raise TypeError(
            f"tool {fn.__name__}: the first parameter must be annotated with a msgspec.Struct "
            "(or pass input=TheStruct to @tool)"
        )
    return annotation, len(params) == 2


@overload
def tool(fn: Callable[..., Any], /) -> Tool: ...


@overload
def tool(
    fn: None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    version: str = "1",
    sequential: bool = False,
    write_target: str | None = None,
    timeout: float | None = None,
    kind: str = KIND_FUNCTION,
    input: type[msgspec.Struct] | None = None,
    read_only: bool = False,
    idempotent: bool = False,
    destructive: bool = False,
    open_world: bool = False,
    retry: RetryPolicy | None = None,
    inline: bool = False,
) -> Callable[[Callable[..., Any]], Tool]: ...


def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    version: str = "1",
    sequential: bool = False,
    write_target: str | None = None,
    timeout: float | None = None,
    kind: str = KIND_FUNCTION,
    input: type[msgspec.Struct] | None = None,
    read_only: bool = False,
    idempotent: bool = False,
    destructive: bool = False,
    open_world: bool = False,
    retry: RetryPolicy | None = None,
    inline: bool = False,
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Declare a tool. ``name`` defaults to the function's name, ``description`` to its docstring.

    ``sequential``: calls run first in a batch, one at a time. ``write_target``: the name of an input
    field; calls whose values for it are equal are serialised. ``timeout``: default deadline in
    seconds (else ``LW_TOOL_TIMEOUT_SECONDS``). ``kind="user_input"`` marks a tool the model-step
    answers through an operator gate instead of calling a worker.

    Safety annotations: ``read_only`` (no side effects), ``idempotent`` (a repeat with the same
    arguments has no further effect), ``destructive``, ``open_world``. Only a read-only or idempotent
    tool is ever run again when its first outcome is unknown, and only such a tool is retried
    (``retry``, default 4 attempts, backoff 0.5 s doubling up to 4 s); see docs/tools.md.

    ``inline``: a sync function that is quick and never blocks (no I/O, bounded work) runs on the
    worker's event loop instead of a worker thread. It cannot be interrupted by a cancel or its
    deadline once started, and every other call waits while it runs: never for blocking work.
    """

    def build(f: Callable[..., Any], localns: dict[str, Any]) -> Tool:
        detected, takes_ctx = _input_type_of(f, localns) if input is None else (input, _arity(f) == 2)
        return Tool(
            fn=f,
            input_type=detected,
            name=f.__name__ if name is None else name,
            description=(description if description is not None else inspect.getdoc(f) or "").strip(),
            version=version,
            sequential=sequential,
            write_target=write_target or "",
            timeout=timeout,
            kind=kind,
            read_only=read_only,
            idempotent=idempotent,
            destructive=destructive,
            open_world=open_world,
            retry=retry,
            takes_context=takes_ctx,
            is_async=inspect.iscoroutinefunction(f),
            inline=inline,
        )

    # The declaring frame's locals resolve string annotations of tools declared inside functions.
    if fn is not None:
        return build(fn, sys._getframe(1).f_locals)
    return lambda f: build(f, sys._getframe(1).f_locals)


def _arity(fn: Callable[..., Any]) -> int:
    return sum(
        1 for p in inspect.signature(fn).parameters.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    )


# --- running one call ------------------------------------------------------------------------------


def error_result(text: str) -> ResultBody:
    return ResultBody(blocks=[TextBlock(text=text)], is_error=True)


def _to_result(value: object) -> ResultBody:
    if value is None:
        return ResultBody(blocks=[])
    if isinstance(value, ResultBody):  # already shaped (e.g. a bridged MCP result)
        return value
    if isinstance(value, str):
        return ResultBody(blocks=[TextBlock(text=value)])
    if isinstance(value, ToolOutput):
        return ResultBody(blocks=[TextBlock(text=value.text)], is_error=value.is_error)
    if isinstance(value, TextBlock | RefusalBlock | ThinkingBlock | ToolUseBlock | ImageBlock):
        return ResultBody(blocks=[value])
    if isinstance(value, list) and all(isinstance(b, _BLOCK_TYPES) for b in value):
        return ResultBody(blocks=list(value))
    return error_result(shaping.tool_error(f"tool returned an unsupported value of type {type(value).__name__}"))


async def invoke(t: Tool, raw: bytes, ctx: ToolContext | None) -> ResultBody:
    """Decode the arguments once, run the tool, shape its outcome. Never raises (but cancellation).

    ``ctx`` may be None only for a tool that takes no context."""
    try:
        args = t.decode_args(raw)
    except (msgspec.ValidationError, msgspec.DecodeError) as e:
        return error_result(shaping.invalid_arguments(str(e)))
    call_args = (args, ctx) if t.takes_context else (args,)
    try:
        if t.is_async:
            value = await t.fn(*call_args)
        elif t.inline:  # declared quick and non-blocking: no thread hop
            value = t.fn(*call_args)
        else:
            value = await anyio.to_thread.run_sync(functools.partial(t.fn, *call_args), abandon_on_cancel=True)
        if inspect.isawaitable(value):  # a sync def returning an awaitable
            value = await value
    except CallFailed:
        raise
    except ToolError as e:
        return error_result(shaping.tool_error(str(e) or type(e).__name__))
    except Exception as e:
        log.warning("tool %s raised", t.name, exc_info=True)
        return error_result(shaping.tool_error(f"{type(e).__name__}: {e}" if str(e) else type(e).__name__))
    return _to_result(value)
