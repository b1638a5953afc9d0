"""MCP ↔ loopwire translation, pure (no I/O): tool listings → specs, call results → result bodies.

* A tool ``<tool>`` of the server registered as ``NAME`` becomes the loopwire tool ``NAME_<tool>``;
  a name outside ``[A-Za-z0-9_-]{1,64}`` (what model APIs accept) is refused, as is a name listed
  twice, and an ``inputSchema`` that is not a valid JSON Schema for an object.
* MCP annotations (``readOnlyHint``, ``destructiveHint``, ``idempotentHint``, ``openWorldHint``)
  become the spec's safety annotations (an absent hint is false: an unannotated MCP tool is never
  run twice); ``source`` is ``mcp:NAME``.
* Results: text → text blocks, images → image blocks, audio and resources → a text note (embedded
  text resources as their text), ``structuredContent`` → one JSON text block (a text block that
  merely repeats it is dropped), ``isError`` → an error result starting ``error: ``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import jsonschema
import mcp_types as mt

from services.toolwire.protocol import ResultBody
from services.toolwire.spec import ToolSpec, valid_tool_name
from shared.content import Block, ImageBlock, TextBlock
from shared.errors import McpToolRejected as McpToolRejected

SOURCE_PREFIX: Final = "mcp:"
# No "_" in a server name: then NAME_<tool> splits one way only, and two bridges never collide.
SERVER_NAME_RE: Final = re.compile(r"^[A-Za-z0-9-]{1,40}$")


@dataclass(frozen=True, slots=True)
class MappedTool:
    """A listed MCP tool as loopwire serves it."""

    mcp_name: str
    spec: ToolSpec


def valid_server_name(server: str) -> bool:
    return bool(SERVER_NAME_RE.fullmatch(server))


def source_of(server: str) -> str:
    return f"{SOURCE_PREFIX}{server}"


def loopwire_name(server: str, mcp_name: str) -> str:
    """``NAME_<tool>``; raises :class:`McpToolRejected` when that is no valid model tool name."""
    name = f"{server}_{mcp_name}"
    if not valid_tool_name(name):
        raise McpToolRejected(mcp_name, f"{name!r} is not a valid tool name for model APIs (1-64 of A-Z a-z 0-9 _ -)")
    return name


def check_input_schema(mcp_name: str, schema: object) -> dict[str, Any]:
    """The schema if it is a valid JSON Schema describing an object (model APIs need one)."""
    if not isinstance(schema, dict):
        raise McpToolRejected(mcp_name, "inputSchema is not a JSON object")
    try:
        jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator).check_schema(schema)
    except jsonschema.SchemaError as e:
        raise McpToolRejected(mcp_name, f"inputSchema is not valid JSON Schema: {e.message}") from None
    if schema.get("type", "object") != "object":
        raise McpToolRejected(mcp_name, f"inputSchema must describe an object, not {schema.get('type')!r}")
    return dict(schema)


def annotations_of(hints: mt.ToolAnnotations | None) -> dict[str, bool]:
    """The spec's safety annotations from the MCP hints; a hint the server did not give is false."""
    if hints is None:
        return {"read_only": False, "destructive": False, "idempotent": False, "open_world": False}
    return {
        "read_only": hints.read_only_hint is True,
        "destructive": hints.destructive_hint is True and hints.read_only_hint is not True,
        "idempotent": hints.idempotent_hint is True,
        "open_world": hints.open_world_hint is True,
    }


def spec_of(server: str, tool: mt.Tool, *, timeout_seconds: float) -> ToolSpec:
    """The loopwire spec of one listed MCP tool; raises :class:`McpToolRejected`."""
    description = tool.description or tool.title or ""
    hints = annotations_of(tool.annotations)
    return ToolSpec(
        name=loopwire_name(server, tool.name),
        description=description,
        input_schema=check_input_schema(tool.name, tool.input_schema),
        timeout_seconds=timeout_seconds,
        read_only=hints["read_only"],
        destructive=hints["destructive"],
        idempotent=hints["idempotent"],
        open_world=hints["open_world"],
        source=source_of(server),
    )


def map_tools(
    server: str, tools: Sequence[mt.Tool], *, timeout_seconds: float
) -> tuple[list[MappedTool], list[McpToolRejected]]:
    """Every servable tool of a listing, and why each of the others is refused (listing order kept)."""
    mapped: list[MappedTool] = []
    rejected: list[McpToolRejected] = []
    counts: dict[str, int] = {}
    for t in tools:
        counts[t.name] = counts.get(t.name, 0) + 1
    for t in tools:
        if counts[t.name] > 1:
            if not any(r.mcp_name == t.name for r in rejected):
                rejected.append(McpToolRejected(t.name, f"listed {counts[t.name]} times by the server"))
            continue
        try:
            mapped.append(MappedTool(mcp_name=t.name, spec=spec_of(server, t, timeout_seconds=timeout_seconds)))
        except McpToolRejected as e:
            rejected.append(e)
    return mapped, rejected


# --- results ---------------------------------------------------------------------------------------


def _resource_block(res: mt.EmbeddedResource) -> TextBlock:
    inner = res.resource
    if isinstance(inner, mt.TextResourceContents):
        return TextBlock(text=inner.text)
    mime = inner.mime_type or "application/octet-stream"
    return TextBlock(text=f"[resource {inner.uri} ({mime}, {len(inner.blob)} base64 chars) omitted]")


def content_block(item: object) -> Block:
    """One MCP content item as a loopwire block."""
    if isinstance(item, mt.TextContent):
        return TextBlock(text=item.text)
    if isinstance(item, mt.ImageContent):
        return ImageBlock(media_type=item.mime_type, data=item.data)
    if isinstance(item, mt.AudioContent):
        return TextBlock(text=f"[audio ({item.mime_type}, {len(item.data)} base64 chars) omitted]")
    if isinstance(item, mt.ResourceLink):
        return TextBlock(text=f"[resource link: {item.name} {item.uri}]")
    if isinstance(item, mt.EmbeddedResource):
        return _resource_block(item)
    return TextBlock(text=f"[unsupported MCP content {type(item).__name__}]")


def _repeats(block: Block, value: object) -> bool:
    if not isinstance(block, TextBlock):
        return False
    try:
        return bool(json.loads(block.text) == value)
    except ValueError:
        return False


def result_of(result: mt.CallToolResult) -> ResultBody:
    """A ``tools/call`` result as a loopwire result body."""
    blocks = [content_block(c) for c in result.content]
    structured = result.structured_content
    if structured is not None:
        blocks = [b for b in blocks if not _repeats(b, structured)]
        text = json.dumps(structured, ensure_ascii=False, separators=(",", ":"), sort_keys=True)
        blocks.insert(0, TextBlock(text=text))
    if result.is_error:
        # Other tools' errors read "error: <message>"; keep MCP's the same for the model.
        first = next((b for b in blocks if isinstance(b, TextBlock)), None)
        if first is None:
            blocks.insert(0, TextBlock(text="error: the MCP tool reported an error"))
        elif not first.text.startswith("error"):
            blocks[blocks.index(first)] = TextBlock(text=f"error: {first.text}")
    return ResultBody(blocks=blocks, is_error=bool(result.is_error))


def progress_text(progress: float, total: float | None, message: str | None) -> str:
    """An MCP progress notification as one ToolCallProgress message (never empty)."""
    amount = f"{progress:g}/{total:g}" if total else f"{progress:g}"
    return f"{message} ({amount})" if message else f"progress {amount}"
