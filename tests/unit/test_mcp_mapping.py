"""MCP ↔ loopwire mapping (pure): names, schemas, annotations, results, progress; bridge CLI helpers."""

from __future__ import annotations

import mcp_types as mt
import pytest

from services.cli.app import parse_args
from services.mcp import mapping as m
from services.mcp.connect import McpTarget, child_environment, headers_from_env
from shared.content import ImageBlock, TextBlock

OBJ = {"type": "object", "properties": {"x": {"type": "string"}}}


def mcp_tool(name: str, schema: dict[str, object] | None = None, **kw: object) -> mt.Tool:
    return mt.Tool(name=name, input_schema=schema if schema is not None else OBJ, **kw)  # type: ignore[arg-type]


def test_names_are_prefixed_and_checked() -> None:
    assert m.loopwire_name("fs", "read_file") == "fs_read_file"
    assert m.loopwire_name("everything", "get-sum") == "everything_get-sum"
    for bad in ("files.read", "a b", "x/y", "é", "t" * 62):
        with pytest.raises(m.McpToolRejected, match="not a valid tool name for model APIs"):
            m.loopwire_name("fs", bad)
    assert m.valid_server_name("server-everything") and m.valid_server_name("a1")
    for bad in ("a_b", "", "a.b", "x" * 41):
        assert not m.valid_server_name(bad)


@pytest.mark.parametrize(
    ("schema", "reason"),
    [
        ({"type": "object", "properties": {"x": {"type": "nonsense"}}}, "not valid JSON Schema"),
        ({"type": "object", "required": "x"}, "not valid JSON Schema"),
        ({"type": "array", "items": {}}, "must describe an object"),
        (["not", "an", "object"], "not a JSON object"),
    ],
)
def test_invalid_input_schemas_are_refused(schema: object, reason: str) -> None:
    with pytest.raises(m.McpToolRejected, match=reason):
        m.check_input_schema("t", schema)


def test_valid_schemas_pass_unchanged() -> None:
    draft7 = {"$schema": "http://json-schema.org/draft-07/schema#", "type": "object", "properties": {}}
    assert m.check_input_schema("t", draft7) == draft7
    assert m.check_input_schema("t", {"properties": {}}) == {"properties": {}}  # type omitted: still an object


def test_spec_carries_description_annotations_and_source() -> None:
    hints = mt.ToolAnnotations(read_only_hint=True, destructive_hint=False, open_world_hint=True)
    spec = m.spec_of("fs", mcp_tool("read", description="Read a file.", annotations=hints), timeout_seconds=90)
    assert spec.name == "fs_read" and spec.description == "Read a file." and spec.input_schema == OBJ
    assert (spec.read_only, spec.destructive, spec.idempotent, spec.open_world) == (True, False, False, True)
    assert spec.source == "mcp:fs" and spec.healthy and spec.timeout_seconds == 90
    untitled = m.spec_of("fs", mcp_tool("t", title="Title only"), timeout_seconds=1)
    assert untitled.description == "Title only" and not (
        untitled.read_only or untitled.destructive or untitled.idempotent or untitled.open_world
    )


def test_map_tools_keeps_the_good_ones_and_says_why_others_are_refused() -> None:
    tools = [mcp_tool("ok"), mcp_tool("bad name"), mcp_tool("dup"), mcp_tool("dup"), mcp_tool("s", {"type": 3})]
    mapped, rejected = m.map_tools("srv", tools, timeout_seconds=5)
    assert [t.spec.name for t in mapped] == ["srv_ok"] and mapped[0].mcp_name == "ok"
    reasons = {r.mcp_name: r.reason for r in rejected}
    assert set(reasons) == {"bad name", "dup", "s"}
    assert reasons["dup"] == "listed 2 times by the server"
    assert str(rejected[0]).startswith("MCP tool 'bad name' not registered: ")


def test_results_map_to_blocks() -> None:
    res = mt.CallToolResult(
        content=[
            mt.TextContent(type="text", text="hello"),
            mt.ImageContent(type="image", data="AAAA", mime_type="image/png"),
            mt.AudioContent(type="audio", data="BBBB", mime_type="audio/wav"),
            mt.ResourceLink(type="resource_link", name="readme", uri="file:///r.md"),
            mt.EmbeddedResource(type="resource", resource=mt.TextResourceContents(uri="file:///a.txt", text="inside")),
            mt.EmbeddedResource(type="resource", resource=mt.BlobResourceContents(uri="file:///b.bin", blob="QUJD")),
        ]
    )
    body = m.result_of(res)
    assert not body.is_error
    assert body.blocks == [
        TextBlock(text="hello"),
        ImageBlock(media_type="image/png", data="AAAA"),
        TextBlock(text="[audio (audio/wav, 4 base64 chars) omitted]"),
        TextBlock(text="[resource link: readme file:///r.md]"),
        TextBlock(text="inside"),
        TextBlock(text="[resource file:///b.bin (application/octet-stream, 4 base64 chars) omitted]"),
    ]


def test_structured_content_becomes_one_json_text_block() -> None:
    repeated = mt.CallToolResult(
        content=[mt.TextContent(type="text", text='{"b": 2, "a": [1]}'), mt.TextContent(type="text", text="note")],
        structured_content={"a": [1], "b": 2},
    )
    assert m.result_of(repeated).blocks == [TextBlock(text='{"a":[1],"b":2}'), TextBlock(text="note")]
    only = mt.CallToolResult(content=[], structured_content={"ü": "x"})
    assert m.result_of(only).blocks == [TextBlock(text='{"ü":"x"}')]


def test_is_error_results_read_like_other_tool_errors() -> None:
    err = m.result_of(mt.CallToolResult(content=[mt.TextContent(type="text", text="no such file")], is_error=True))
    assert err.is_error and err.blocks == [TextBlock(text="error: no such file")]
    kept = m.result_of(mt.CallToolResult(content=[mt.TextContent(type="text", text="error: x")], is_error=True))
    assert kept.blocks == [TextBlock(text="error: x")]
    empty = m.result_of(mt.CallToolResult(content=[], is_error=True))
    assert empty.is_error and empty.blocks == [TextBlock(text="error: the MCP tool reported an error")]


def test_progress_text() -> None:
    assert m.progress_text(1, 4, None) == "progress 1/4"
    assert m.progress_text(2.5, None, "copying") == "copying (2.5)"
    assert m.progress_text(3, 10, "step") == "step (3/10)"
    assert m.progress_text(0, 0, None) == "progress 0"


def test_child_environment_hides_loopwire_configuration() -> None:
    env = child_environment({"LW_NATS_URL": "nats://secret@x", "LW_PREFIX": "lw", "HOME": "/h", "TOKEN": "t"})
    assert env == {"HOME": "/h", "TOKEN": "t"}


def test_headers_come_from_the_environment() -> None:
    env = {"MCP_AUTH": "Bearer abc", "BAD": "a\r\nInjected: 1"}
    assert headers_from_env(["Authorization=MCP_AUTH"], env) == {"Authorization": "Bearer abc"}
    with pytest.raises(ValueError, match="MISSING is not set"):
        headers_from_env(["Authorization=MISSING"], env)
    with pytest.raises(ValueError, match="expected Header=ENV_VAR"):
        headers_from_env(["Authorization"], env)
    with pytest.raises(ValueError, match="line break"):
        headers_from_env(["X=BAD"], env)


def test_target_needs_exactly_one_of_command_and_url() -> None:
    with pytest.raises(ValueError):
        McpTarget(name="x")
    with pytest.raises(ValueError):
        McpTarget(name="x", command=("a",), url="http://h/mcp")
    assert McpTarget(name="x", url="http://h/mcp").describe() == "http://h/mcp"


def test_cli_parses_serve_mcp() -> None:
    args = parse_args(["serve", "mcp", "fs", "--timeout", "120", "--", "npx", "-y", "server", "--", "--flag"])
    assert (args.name, args.timeout, args.command) == ("fs", 120, ["npx", "-y", "server", "--", "--flag"])
    http = parse_args(["--prefix", "p", "serve", "mcp", "web", "--url", "http://h/mcp", "--header-env", "A=B"])
    assert http.url == "http://h/mcp" and http.header_env == ["A=B"] and http.command == [] and http.prefix == "p"
    assert parse_args(["serve", "tool", "--", "calculator"]).tools == ["calculator"]  # argparse's own "--"
