"""Context-window management with a real model-step: committer, tool worker and model-step as OS processes."""

from __future__ import annotations

import hashlib
import json
import re
import time
import uuid
from pathlib import Path
from typing import Any

import anyio
import pytest
from nats.aio.client import Client as NATS

from shared import events as ev
from shared.client import LoopClient
from shared.content import AIMessage
from shared.history import fold
from shared.protocol import InvalidRequestError
from shared.replay import load
from shared.settings import Settings
from tests.syshelpers import (
    check_every_record_chained,
    check_history_invariants,
    history,
    system,
    wait_history,
    write_script,
)
from tests.system.test_fork import acli
from tests.system.test_readme_examples import ROOT, Example, _python_block

LONG_LOOP = _python_block("Long loops: context management", "ContextPolicy(")

pytestmark = [pytest.mark.anyio, pytest.mark.system]

STEPS = 500
WINDOW = 16_000
MAX_TOKENS = 256


def _read_step() -> list[dict[str, Any]]:
    return [
        {"kind": "tool_use", "index": 0, "id": "r{k}", "name": "read_file"},
        {"kind": "tool_use", "index": 0, "text": '{"path":"a"}'},
        {"kind": "finish", "finish_reason": "tool_use"},
    ]


def _big_file(root: Path) -> None:
    """About 1,200 tokens of hex digits (they do not compress into a few tokens)."""
    data = b"".join(hashlib.sha256(str(k).encode()).digest() for k in range(34)).hex()
    (root / "a").write_text(data)


def _request_sizes(events: list[tuple[int, ev.Event]]) -> list[int]:
    """Every step request's input tokens as the scripted model counted it (report_input_tokens)."""
    return [
        m.usage.input_tokens
        for _, e in events
        if isinstance(e, ev.StepDone)
        for m in e.messages
        if isinstance(m, AIMessage) and m.usage is not None
    ]


def _compactions(events: list[tuple[int, ev.Event]]) -> list[ev.ContextCompacted]:
    return [e for _, e in events if isinstance(e, ev.ContextCompacted)]


def _check_chain(compactions: list[ev.ContextCompacted]) -> None:
    """Each compaction continues the one before: no range is compacted twice."""
    upto = 0
    for c in compactions:
        assert c.previous_upto == upto < c.upto
        assert c.event_id == ev.compaction_id_for(c.loop_id, c.upto)
        assert c.tokens_after < c.tokens_before
        upto = c.upto


@pytest.mark.parametrize(
    "policy",
    [
        ev.ContextPolicy(strategy="clear_tool_results", window=WINDOW, keep=1, clear_at_least=2_000),
        ev.ContextPolicy(strategy="compact", window=WINDOW),
    ],
    ids=["clear_tool_results", "compact"],
)
async def test_500_steps_run_within_a_16k_window(
    settings: Settings, nc: NATS, tmp_path: Path, policy: ev.ContextPolicy
) -> None:
    root = tmp_path / "root"
    root.mkdir()
    _big_file(root)
    responses: list[Any] = [_read_step()] * STEPS + ["done"]
    model = write_script(tmp_path, {"responses": responses, "report_input_tokens": True})
    limits = ev.Limits(max_iterations=STEPS + 10, max_calls_per_turn=STEPS + 10, max_tokens=MAX_TOKENS)
    with system(settings, tools=("read_file",), env={"LW_TOOL_ROOT": str(root)}):
        lc = LoopClient(nc, settings.names)
        loop_id = str(uuid.uuid4())
        await lc.start(loop_id, model=model, limits=limits, context=policy, tools=["read_file"])
        await lc.input(loop_id, "read it 500 times")
        await wait_history(nc, settings, loop_id, lambda h: h.idle, timeout=600)
        events = await history(nc, settings, loop_id)
    check_history_invariants(events)
    assert not [e for _, e in events if isinstance(e, ev.TurnFailed)]
    assert any(isinstance(e, ev.TurnDone) for _, e in events)
    # Every request the model received, as it counted it.
    sizes = _request_sizes(events)
    assert len(sizes) == STEPS + 1
    assert max(sizes) <= WINDOW - MAX_TOKENS
    # Nothing was lost: the history holds every message (about 600k tokens of tool results).
    stored = sum(len(e.messages) for _, e in events if isinstance(e, ev.StepDone))
    assert stored == 2 * STEPS + 1
    compactions = _compactions(events)
    if policy.strategy == "compact":
        assert len(compactions) > 10
        _check_chain(compactions)
        assert fold(events).compaction == compactions[-1]
    else:
        assert not compactions


async def test_a_model_step_killed_mid_compaction_leaves_one_compaction(
    settings: Settings, nc: NATS, tmp_path: Path
) -> None:
    root = tmp_path / "root"
    root.mkdir()
    _big_file(root)
    steps = 30
    summary = [
        {"sleep": 3},
        {"kind": "text", "text": "the file was read"},
        {"kind": "finish", "finish_reason": "end_turn"},
    ]
    script = {"responses": [_read_step()] * steps + ["done"], "report_input_tokens": True, "summary": summary}
    model = write_script(tmp_path, script)
    policy = ev.ContextPolicy(strategy="compact", window=WINDOW)
    limits = ev.Limits(max_iterations=steps + 10, max_calls_per_turn=steps + 10, max_tokens=MAX_TOKENS)
    with system(settings, tools=("read_file",), env={"LW_TOOL_ROOT": str(root)}) as sysm:
        lc = LoopClient(nc, settings.names)
        loop_id = str(uuid.uuid4())
        await lc.start(loop_id, model=model, limits=limits, context=policy, tools=["read_file"])
        await lc.input(loop_id, "read it")
        # The first compaction is under way when the steps stop for a second with none committed.
        seen, since = -1, time.monotonic()
        while True:
            events = await history(nc, settings, loop_id)
            assert not _compactions(events), "the summary came before the kill"
            n = sum(isinstance(e, ev.StepDone) for _, e in events)
            if n != seen:
                seen, since = n, time.monotonic()
            elif n > 5 and time.monotonic() - since > 1.0:
                break
            await anyio.sleep(0.1)
        (ms,) = sysm.sup.by_name("model-step")
        ms.kill()
        sysm.replace(ms)
        await wait_history(nc, settings, loop_id, lambda h: h.idle, timeout=120)
        events = await history(nc, settings, loop_id)
        shown = await acli(settings, "history", loop_id)
        await check_every_record_chained(nc, settings, loops=1)  # compactions, and a replaced model-step
    assert "context compacted: messages 1-" in shown and "the file was read" in shown
    check_history_invariants(events)
    assert any(isinstance(e, ev.TurnDone) for _, e in events)
    compactions = _compactions(events)
    assert compactions and compactions[0].summary == "the file was read"
    _check_chain(compactions)
    assert len({c.upto for c in compactions}) == len(compactions)
    assert max(_request_sizes(events)) <= WINDOW - MAX_TOKENS


async def test_a_request_that_cannot_fit_fails_the_turn(settings: Settings, nc: NATS, tmp_path: Path) -> None:
    model = write_script(tmp_path, {"responses": ["never asked"], "report_input_tokens": True})
    policy = ev.ContextPolicy(strategy="clear_tool_results", window=2_000)
    with system(settings, tools=()):
        lc = LoopClient(nc, settings.names)
        started = await acli(
            settings, "start", "--model", model, "--context", policy.strategy, "--context-window", "2000", "--json"
        )
        loop_id = json.loads(started)["loop_id"]
        assert (await load(nc, settings.names, loop_id)).config.context == policy  # type: ignore[union-attr]
        await lc.input(loop_id, " ".join(f"w{i}" for i in range(3_000)))
        await wait_history(nc, settings, loop_id, lambda h: h.idle, timeout=30)
        events = await history(nc, settings, loop_id)
        (failed,) = [e for _, e in events if isinstance(e, ev.TurnFailed)]
        assert failed.err.kind == "context_overflow"
        assert "input tokens" in failed.err.message and "1500" in failed.err.message
        assert not [e for _, e in events if isinstance(e, ev.StepDone)]

        with pytest.raises(InvalidRequestError, match=r"context\.window"):
            await lc.start(str(uuid.uuid4()), model=model, context=ev.ContextPolicy(window=16))
        with pytest.raises(InvalidRequestError, match="need a strategy"):
            await lc.start(str(uuid.uuid4()), model=model, context=ev.ContextPolicy(trigger=100))


async def test_a_message_larger_than_the_window_is_not_compacted(settings: Settings, nc: NATS, tmp_path: Path) -> None:
    """Compaction could only replace it by a summary nobody could write from it: the turn fails."""
    model = write_script(tmp_path, {"responses": ["never asked"], "summary": "a summary", "report_input_tokens": True})
    with system(settings, tools=()):
        lc = LoopClient(nc, settings.names)
        started = await acli(
            settings, "start", "--model", model, "--context", "compact", "--context-window", "1024", "--json"
        )
        loop_id = json.loads(started)["loop_id"]
        await lc.input(loop_id, " ".join(f"w{i}" for i in range(600)))  # about 1,200 tokens: over 768
        await wait_history(nc, settings, loop_id, lambda h: h.idle, timeout=30)
        events = await history(nc, settings, loop_id)
        failed = [e for _, e in events if isinstance(e, ev.TurnFailed)]
        assert [f.err.kind for f in failed] == ["context_overflow"], events
        assert "message 1 alone needs" in failed[0].err.message and "over the 768" in failed[0].err.message
        assert not _compactions(events) and not [e for _, e in events if isinstance(e, ev.StepDone)]


async def test_the_readme_long_loop_example_runs(settings: Settings, nc: NATS, tmp_path: Path) -> None:
    assert (ROOT / "examples" / "long_loop.py").read_text() == LONG_LOOP
    with system(settings, tools=("calculator",)):
        example = Example(tmp_path, "long_loop", LONG_LOOP, settings)
        code, out = await example.finish(120)
    assert code == 0, out
    lines = out.splitlines()
    assert len(lines) == 13, out
    for n, line in enumerate(lines[:12], 1):
        assert line.startswith("done ") and f"{n}*{n + 10} = {n * (n + 10)}" in line, out
    m = re.fullmatch(r"(\d+) messages in the history, the first (\d+) summarised, (\d+) sent", lines[-1])
    assert m is not None, out
    total, upto, sent = map(int, m.groups())
    assert total == 12 * 4 and upto > 0 and sent == 1 + total - upto, out
