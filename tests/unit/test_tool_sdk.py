"""The tool SDK without NATS: declaration, schema, argument validation, outcome shaping."""

from __future__ import annotations

import threading
import time

import anyio
import msgspec
import pytest

from services.tools.sdk import ToolContext, ToolError, ToolOutput, invoke, tool
from services.toolwire.protocol import CallIds, ResultBody, ids_from_headers, request_headers
from services.toolwire.spec import KIND_USER_INPUT, ToolSpec, input_schema_of, valid_tool_name
from shared.content import ImageBlock, TextBlock
from shared.settings import Settings

pytestmark = pytest.mark.anyio


class Pair(msgspec.Struct, forbid_unknown_fields=True):
    """Two numbers."""

    a: float
    b: float = 0.0


class Inner(msgspec.Struct):
    n: int


class Nested(msgspec.Struct):
    items: list[Inner]
    path: str = ""


@tool(description="Add two numbers.")
def add(args: Pair) -> str:
    return f"{args.a + args.b:g}"


@tool(name="nested-tool", sequential=True, write_target="path", timeout=3, version="2.1")
async def nested(args: Nested, ctx: ToolContext) -> list[TextBlock]:
    """Echo the items."""
    return [TextBlock(text=str(i.n)) for i in args.items] + [TextBlock(text=ctx.loop_id)]


def text_of(r: ResultBody) -> str:
    return "".join(b.text for b in r.blocks if isinstance(b, TextBlock))


def test_declaration_and_spec() -> None:
    assert add.name == "add" and add.description == "Add two numbers."
    assert not add.takes_context and not add.is_async
    spec = add.spec(Settings(tool_timeout_seconds=42))
    assert spec == ToolSpec(
        name="add",
        description="Add two numbers.",
        input_schema=add.input_schema,
        timeout_seconds=42,
    )
    assert add.input_schema["type"] == "object"
    assert add.input_schema["required"] == ["a"]
    assert set(add.input_schema["properties"]) == {"a", "b"}
    n = nested.spec()
    assert (n.name, n.sequential, n.has_write_target, n.write_target, n.timeout_seconds, n.version) == (
        "nested-tool",
        True,
        True,
        "path",
        3,
        "2.1",
    )
    assert n.description == "Echo the items."
    # Nested structs keep their definitions; the top level is an inline object schema.
    assert nested.input_schema["type"] == "object" and "Inner" in nested.input_schema["$defs"]
    assert msgspec.json.decode(msgspec.json.encode(n), type=ToolSpec) == n


class Node(msgspec.Struct):
    children: list[Node] = []


def test_schema_of_self_referencing_input() -> None:
    schema = input_schema_of(Node)
    assert schema["type"] == "object" and "Node" in schema["$defs"]


@pytest.mark.parametrize("name", ["", "a.b", "a b", "x" * 65, "tool*", "ü"])
def test_invalid_names_are_refused(name: str) -> None:
    assert not valid_tool_name(name)
    with pytest.raises(ValueError, match="invalid tool name"):
        tool(name=name)(add.fn)


def test_declaration_errors() -> None:
    with pytest.raises(TypeError, match=r"msgspec\.Struct"):

        @tool
        def untyped(args: dict) -> str:  # type: ignore[type-arg]
            return ""

    with pytest.raises(ValueError, match="write_target"):
        tool(write_target="nope")(add.fn)
    with pytest.raises(ValueError, match="kind"):
        tool(kind="magic")(add.fn)
    with pytest.raises(ValueError, match="timeout"):
        tool(timeout=0)(add.fn)
    assert tool(name="ask", kind=KIND_USER_INPUT)(add.fn).spec().kind == "user_input"
    with pytest.raises(ValueError, match="inline"):

        @tool(inline=True)
        async def async_inline(args: Pair) -> str:
            return ""


async def test_invoke_success_and_blocks() -> None:
    r = await invoke(add, b'{"a": 1, "b": 2.5}', ToolContext())
    assert (text_of(r), r.is_error) == ("3.5", False)
    r = await invoke(nested, b'{"items": [{"n": 1}, {"n": 2}]}', ToolContext(ids=CallIds(loop_id="L")))
    assert [b.text for b in r.blocks if isinstance(b, TextBlock)] == ["1", "2", "L"]


@pytest.mark.parametrize(
    "raw",
    [b"", b"nope", b"[]", b'{"a": "x"}', b'{"b": 1}', b'{"a": 1, "c": 2}', b"\xff\xfe", b'{"a": 1e999}'],
)
async def test_invalid_arguments_are_a_tool_error(raw: bytes) -> None:
    r = await invoke(add, raw, ToolContext())
    assert r.is_error
    assert text_of(r).startswith("error: invalid tool arguments: ")


async def test_outcomes_are_shaped() -> None:
    class Empty(msgspec.Struct):
        pass

    @tool
    def returns_none(args: Empty) -> None:
        return None

    @tool
    def returns_output(args: Empty) -> ToolOutput:
        return ToolOutput("careful", is_error=True)

    @tool
    def raises_tool_error(args: Empty) -> str:
        raise ToolError("nope\nnot\tthis")

    @tool
    async def raises_other(args: Empty) -> str:
        raise KeyError("k")

    @tool
    def returns_junk(args: Empty) -> object:
        return 42

    @tool
    def returns_image(args: Empty) -> ImageBlock:
        return ImageBlock(media_type="image/png", data="AA==")

    ctx = ToolContext()
    assert (await invoke(returns_none, b"{}", ctx)).blocks == []
    r = await invoke(returns_output, b"{}", ctx)
    assert (text_of(r), r.is_error) == ("careful", True)
    r = await invoke(raises_tool_error, b"{}", ctx)
    assert (text_of(r), r.is_error) == ("error: nope not this", True)
    r = await invoke(raises_other, b"{}", ctx)
    assert (text_of(r), r.is_error) == ("error: KeyError: 'k'", True)
    r = await invoke(returns_junk, b"{}", ctx)
    assert r.is_error and "unsupported value of type int" in text_of(r)
    r = await invoke(returns_image, b"{}", ctx)
    assert isinstance(r.blocks[0], ImageBlock) and not r.is_error


async def test_sync_tools_run_in_a_thread_and_see_cancellation() -> None:
    seen: dict[str, object] = {}
    stopped = threading.Event()

    class Empty(msgspec.Struct):
        pass

    @tool
    def blocking(args: Empty, ctx: ToolContext) -> str:
        seen["thread"] = threading.get_ident()
        ctx.progress("from a thread")
        while not ctx.cancelled:
            time.sleep(0.01)
        stopped.set()
        return "stopped"

    progress: list[str] = []
    ctx = ToolContext(progress_sink=progress.append)
    with anyio.move_on_after(0.2):
        await invoke(blocking, b"{}", ctx)
    assert seen["thread"] != threading.get_ident()
    ctx.cancel()  # what the worker does when it cancels a call
    assert await anyio.to_thread.run_sync(stopped.wait, 2)
    await anyio.sleep(0.05)
    assert progress == ["from a thread"]


async def test_inline_tools_run_on_the_event_loop_thread() -> None:
    class Empty(msgspec.Struct):
        pass

    @tool(inline=True)
    def quick(args: Empty, ctx: ToolContext) -> str:
        ctx.progress("inline")
        return str(threading.get_ident())

    progress: list[str] = []
    r = await invoke(quick, b"{}", ToolContext(progress_sink=progress.append))
    assert text_of(r) == str(threading.get_ident()) and progress == ["inline"]
    assert quick.inline and "inline" not in msgspec.json.encode(quick.spec()).decode(), "not on the wire"


def test_headers_round_trip() -> None:
    ids = CallIds(loop_id="l", turn_id="t", step_id="s", tool_use_id="u", execution_id="e", traceparent="00-ab-cd-01")
    headers = request_headers(ids, 1234)
    assert headers["Lw-Idempotency-Key"] == "l:s:u"
    back, key, deadline = ids_from_headers(headers)
    assert (back, key, deadline) == (ids, "l:s:u", 1234)
    assert ids_from_headers({"Lw-Deadline": "soon"})[2] is None
    assert "traceparent" not in request_headers(CallIds(), 1)


def test_annotations_reach_the_spec() -> None:
    class Path_(msgspec.Struct):
        path: str

    @tool(read_only=True, open_world=True)
    def peek(args: Path_) -> str:
        return args.path

    spec = peek.spec()
    assert spec.read_only and spec.open_world and not spec.idempotent and not spec.destructive
    assert spec.source == "" and spec.healthy
    encoded = msgspec.json.decode(msgspec.json.encode(spec))
    assert encoded["read_only"] is True and encoded["destructive"] is False
