"""MCP servers in real loops: committer, model-step and ``loopwire serve mcp`` bridges as OS processes."""

from __future__ import annotations

import json
import sys
import time
import uuid
from pathlib import Path

import anyio
import pytest
from nats.aio.client import Client as NATS

from shared import events as ev
from shared import shaping
from shared.client import LoopClient
from shared.content import ImageBlock, ToolResultMessage, text_of
from shared.procs import ServiceProcess
from shared.settings import Settings
from tests.mcpfixtures import everything_command, probe_command, time_command
from tests.syshelpers import (
    TOOL_TURN_HISTORY,
    System,
    check_history_invariants,
    collect_live,
    history,
    system,
    types,
    wait_history,
    write_script,
)

pytestmark = [pytest.mark.anyio, pytest.mark.system]


def _tool_step(name: str, args: str) -> list[dict[str, object]]:
    return [
        {"kind": "tool_use", "index": 0, "id": "call_{k}", "name": name},
        {"kind": "tool_use", "index": 0, "text": args},
        {"kind": "finish", "finish_reason": "tool_use"},
    ]


def bridge(s: System, name: str, command: list[str], **env: str) -> ServiceProcess:
    return s.start(f"mcp-{name}", ["-m", "services.cli", "serve", "mcp", name, "--", *command], env=env)


async def test_loop_calls_an_mcp_tool_and_commits_a_valid_step(settings: Settings, nc: NATS, tmp_path: Path) -> None:
    model = write_script(tmp_path, [_tool_step("time_get_current_time", '{"timezone": "Asia/Tokyo"}'), "told"])
    with system(settings, tools=()) as s:
        bridge(s, "time", time_command())
        listing = await anyio.run_process([sys.executable, "-m", "services.cli", "tools", "--json"], env=s.env)
        tools = {t["name"]: t for t in map(json.loads, listing.stdout.decode().splitlines())}
        assert tools["time_get_current_time"]["source"] == "mcp:time" and tools["time_get_current_time"]["healthy"]
        table = await anyio.run_process([sys.executable, "-m", "services.cli", "tools"], env=s.env)
        assert "mcp:time" in table.stdout.decode()
        lc = LoopClient(nc, settings.names)
        loop_id = str(uuid.uuid4())
        await lc.start(loop_id, model=model)
        await lc.input(loop_id, "what time is it in Tokyo?")
        await wait_history(nc, settings, loop_id, lambda h: h.idle)
        events = await history(nc, settings, loop_id)
        check_history_invariants(events)
        assert types(events) == TOOL_TURN_HISTORY
        first = next(e for _, e in events if isinstance(e, ev.StepDone))
        result = first.messages[1]
        assert isinstance(result, ToolResultMessage) and not result.is_error
        assert json.loads(text_of(result))["timezone"] == "Asia/Tokyo"


async def test_progress_then_interrupt_cancels_the_mcp_request(settings: Settings, nc: NATS, tmp_path: Path) -> None:
    probe_log = tmp_path / "probe.log"
    model = write_script(tmp_path, [_tool_step("probe_slow", '{"seconds": 30}'), "slept"])
    with system(settings, tools=()) as s:
        bridge(s, "probe", probe_command(), PROBE_LOG=str(probe_log))
        lc = LoopClient(nc, settings.names)
        loop_id = str(uuid.uuid4())
        live = await collect_live(nc, settings, loop_id)
        await lc.start(loop_id, model=model)
        await lc.input(loop_id, "sleep please")
        with anyio.fail_after(15):
            while sum(isinstance(e, ev.ToolCallProgress) for e in live) < 3:
                await anyio.sleep(0.02)
        progress = [e.message for e in live if isinstance(e, ev.ToolCallProgress)]
        assert progress[:2] == ["step 1 (1)", "step 2 (2)"]
        t0 = time.monotonic()
        await lc.interrupt(loop_id)
        await wait_history(nc, settings, loop_id, lambda h: h.open_turn is None, timeout=5)
        assert time.monotonic() - t0 < 1.0
        assert "TurnInterrupted" in types(await history(nc, settings, loop_id))
        with anyio.fail_after(1):
            while "cancelled slow" not in (probe_log.read_text().splitlines() if probe_log.exists() else []):
                await anyio.sleep(0.02)


async def test_long_running_operation_reports_progress(settings: Settings, nc: NATS, tmp_path: Path) -> None:
    command = everything_command()
    args = '{"duration": 2, "steps": 4}'
    model = write_script(tmp_path, [_tool_step("everything_trigger-long-running-operation", args), "finished"])
    with system(settings, tools=()) as s:
        bridge(s, "everything", command)
        lc = LoopClient(nc, settings.names)
        loop_id = str(uuid.uuid4())
        live = await collect_live(nc, settings, loop_id)
        await lc.start(loop_id, model=model)
        await lc.input(loop_id, "run the long operation")
        await wait_history(nc, settings, loop_id, lambda h: h.idle)
        events = await history(nc, settings, loop_id)
        check_history_invariants(events)
        assert types(events) == TOOL_TURN_HISTORY
        progress = [e.message for e in live if isinstance(e, ev.ToolCallProgress)]
        assert progress[:4] == ["progress 1/4", "progress 2/4", "progress 3/4", "progress 4/4"]
        result = next(e for _, e in events if isinstance(e, ev.StepDone)).messages[1]
        assert isinstance(result, ToolResultMessage) and not result.is_error
        assert "completed" in text_of(result).lower()


async def test_an_mcp_image_is_committed_as_an_image_block_or_a_note_saying_why_not(
    settings: Settings, nc: NATS, tmp_path: Path
) -> None:
    model = write_script(tmp_path, [_tool_step("everything_get-tiny-image", "{}"), "seen"])
    with system(settings, tools=()) as s:
        bridge(s, "everything", everything_command())
        lc = LoopClient(nc, settings.names)
        roomy, tight = str(uuid.uuid4()), str(uuid.uuid4())
        await lc.start(roomy, model=model)
        # A result bound smaller than the image: the image is left out and its note says why.
        await lc.start(tight, model=model, limits=ev.Limits(max_result_bytes=256))
        for loop_id in (roomy, tight):
            await lc.input(loop_id, "show me the image")
        results: dict[str, ToolResultMessage] = {}
        for loop_id in (roomy, tight):
            await wait_history(nc, settings, loop_id, lambda h: h.idle)
            events = await history(nc, settings, loop_id)
            check_history_invariants(events)
            result = next(e for _, e in events if isinstance(e, ev.StepDone)).messages[1]
            assert isinstance(result, ToolResultMessage) and not result.is_error
            results[loop_id] = result
        blocks = results[roomy].blocks or []
        assert [type(b).__name__ for b in blocks] == ["TextBlock", "ImageBlock"]
        image = blocks[1]
        assert isinstance(image, ImageBlock) and image.media_type == "image/png" and image.data
        note = shaping.image_note(1, image)
        assert note == f"[image 1: image/png, {shaping.image_size(image) / 1024:.1f} KB]"
        lines = text_of(results[roomy]).split("\n")
        assert lines[0] == "Here's the image you requested:" and lines[1] == note and len(lines) >= 3
        tight_blocks = results[tight].blocks or []
        assert [type(b).__name__ for b in tight_blocks] == ["TextBlock"]
        assert "[image 1: image/png, " in text_of(results[tight])
        assert "omitted: larger than the loop's max_result_bytes]" in text_of(results[tight])


async def test_the_demo_model_calls_an_mcp_tool_the_words_name(settings: Settings, nc: NATS) -> None:
    with system(settings, tools=()) as s:
        bridge(s, "time", time_command())
        lc = LoopClient(nc, settings.names)
        loop_id = str(uuid.uuid4())
        await lc.start(loop_id, model="demo")
        await lc.input(loop_id, "use time_get_current_time for 'Europe/Paris'")  # the README's words
        await wait_history(nc, settings, loop_id, lambda h: h.idle)
        events = await history(nc, settings, loop_id)
        check_history_invariants(events)
        step = next(e for _, e in events if isinstance(e, ev.StepDone))
        [use] = [b for b in step.messages[0].blocks or () if type(b).__name__ == "ToolUseBlock"]
        assert use.name == "time_get_current_time" and json.loads(bytes(use.input)) == {"timezone": "Europe/Paris"}
        result = step.messages[1]
        assert isinstance(result, ToolResultMessage) and not result.is_error
        assert json.loads(text_of(result))["timezone"] == "Europe/Paris"
