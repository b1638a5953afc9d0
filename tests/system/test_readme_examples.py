"""The README's Python examples, extracted from README.md and run as written against a running system.

The tool example serves ``shout`` to a loop whose (scripted) model calls it; the loop example drives
a turn of the demo model; the consumer example sees that turn's steps. Each runs as its own process,
importing only ``loopwire``, like a reader's copy would.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from nats.aio.client import Client as NATS

from services.toolcaller.registry import ToolRegistry
from services.tools.agent import child_loop_id
from shared import events as ev
from shared.client import LoopClient
from shared.content import ToolResultMessage, text_of
from shared.replay import replay
from shared.settings import Settings
from shared.turns import wait_for_turn
from tests.syshelpers import system, wait_for, write_script

pytestmark = [pytest.mark.anyio, pytest.mark.system]

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def _python_block(section: str, containing: str) -> str:
    """The first ```python block of ``section`` that contains ``containing``."""
    start = README.index(f"\n## {section}\n")
    end = README.find("\n## ", start + 1)
    for code in re.findall(r"^```python\n(.*?)^```$", README[start:end], re.M | re.S):
        if containing in code:
            return str(code)
    raise AssertionError(f"no python block with {containing!r} in README section {section!r}")


TOOL = _python_block("Add a tool in 10 lines", "run_worker")
ONE_LOOP = _python_block("Consume events", "wait_for_turn")
SUB_AGENT = _python_block("Sub-agents", "agent_tool")
FOLLOW = _python_block("Consume events", "follow_all")


def test_the_examples_are_the_example_files_and_import_only_loopwire() -> None:
    assert (ROOT / "examples" / "add_a_tool.py").read_text() == TOOL
    assert (ROOT / "examples" / "one_loop.py").read_text() == ONE_LOOP
    assert (ROOT / "examples" / "follow_steps.py").read_text() == FOLLOW
    for code in (TOOL, ONE_LOOP, FOLLOW):
        imports = re.findall(r"^(?:from (\S+) import|import (\S+))", code, re.M)
        assert {a or b for a, b in imports} <= {"asyncio", "sys", "msgspec", "nats.js.api", "loopwire"}


class Example:
    """One README block, written to a file and run as a process of its own."""

    def __init__(self, tmp: Path, name: str, code: str, settings: Settings, *args: str) -> None:
        path = tmp / f"{name}.py"
        path.write_text(code)
        env = {**os.environ, "LW_NATS_URL": ",".join(settings.nats_urls), "LW_PREFIX": settings.prefix}
        self.out_path = tmp / f"{name}.out"
        self._out = self.out_path.open("w")
        # From the temporary directory: nothing but the installed packages is importable.
        self.proc = subprocess.Popen(
            [sys.executable, str(path), *args],
            cwd=tmp,
            env=env,
            stdout=self._out,
            stderr=subprocess.STDOUT,
            # Ctrl-C as in a terminal: a job started in the background by a shell (CI) has SIGINT
            # ignored, which its children inherit, and Python then installs no handler for it.
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )

    def output(self) -> str:
        self._out.flush()
        return self.out_path.read_text()

    async def finish(self, timeout: float) -> tuple[int, str]:
        """Wait for the example to exit by itself (killed after ``timeout``): its exit code and output."""
        try:
            code = await anyio.to_thread.run_sync(lambda: self.proc.wait(timeout=timeout))
            return code, self.output()
        finally:
            self.kill()

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=15)
        finally:
            self._out.close()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self._out.close()


@pytest.fixture
def examples(tmp_path: Path) -> Iterator[list[Example]]:
    started: list[Example] = []
    yield started
    for e in started:
        e.kill()


async def _history_consumers(nc: NATS, settings: Settings) -> int:
    info = await nc.jetstream().stream_info(settings.names.history_stream)
    return info.state.consumer_count


async def test_the_readme_examples_run_against_a_running_system(
    settings: Settings, nc: NATS, tmp_path: Path, examples: list[Example]
) -> None:
    shout_model = write_script(
        tmp_path,
        [
            [
                {"kind": "tool_use", "index": 0, "id": "call_shout", "name": "shout"},
                {"kind": "tool_use", "index": 0, "text": '{"text": "hello"}'},
                {"kind": "finish", "finish_reason": "tool_use"},
            ],
            "Shouted.",
        ],
    )
    with system(settings, tools=("calculator", "clock"), env={"LW_MODEL": "demo"}):
        follow = Example(tmp_path, "follow_steps", FOLLOW, settings)
        examples.append(follow)
        await wait_for(lambda: _history_consumers(nc, settings), timeout=30)  # it sees only what follows

        # The tool example: a worker of its own, called by a loop's model.
        worker = Example(tmp_path, "add_a_tool", TOOL, settings)
        examples.append(worker)
        async with ToolRegistry(nc, settings.names) as registry:
            spec = await registry.wait_for("shout", timeout=30)
        assert spec.input_schema["required"] == ["text"]
        client = LoopClient(nc, settings.names)
        loop_id = str(uuid.uuid4())
        await client.start(loop_id, model=shout_model)
        sent = await client.input(loop_id, "shout hello")
        with anyio.fail_after(30):
            turn = await wait_for_turn(nc, settings.names, loop_id, sent.command_id, sent.seq)
        assert (turn.outcome, turn.answer) == ("done", "Shouted.")
        records = [e async for _, e in replay(nc, loop_id, names=settings.names)]
        results = [m for e in records if isinstance(e, ev.StepDone) for m in e.messages[1:]]
        assert [(text_of(m), m.is_error) for m in results if isinstance(m, ToolResultMessage)] == [("HELLO!", False)]

        # The loop example: one turn of the demo model, then the history.
        one = Example(tmp_path, "one_loop", ONE_LOOP, settings, "what is 17*23 and what time is it in Tokyo?")
        examples.append(one)
        code = await anyio.to_thread.run_sync(lambda: one.proc.wait(timeout=60))
        out = one.output()
        assert code == 0, out
        assert out.startswith("done ") and "17*23 = 391" in out, out
        assert re.search(r"^\d+ StepDone$", out, re.M) and re.search(r"^\d+ TurnDone$", out, re.M), out

        # The consumer example saw both loops' steps.
        await wait_for(lambda: _contains(follow, "calls=['calculator', 'clock']"), timeout=20)
        assert "calls=['shout']" in follow.output()
        assert worker.stop() == 0  # SIGTERM drains and exits 0, as the README says


async def _contains(example: Example, needle: str) -> bool:
    return needle in example.output()


async def test_ctrl_c_stops_an_example_quietly(nc: NATS, settings: Settings, tmp_path: Path) -> None:
    from shared.streams import ensure_all

    await ensure_all(nc.jetstream(), settings)
    follow = Example(tmp_path, "follow_steps", FOLLOW, settings)
    with anyio.fail_after(60):  # it follows: its consumer is on the history stream (a Ctrl-C is for then)
        while (await nc.jetstream().stream_info(settings.names.history_stream)).state.consumer_count < 1:
            assert follow.proc.poll() is None, follow.output()
            await anyio.sleep(0.1)
    follow.proc.send_signal(signal.SIGINT)
    with contextlib.suppress(subprocess.TimeoutExpired):
        follow.proc.wait(timeout=10)
    code = follow.stop()
    text = follow.out_path.read_text()
    assert code == 130 and "Traceback" not in text, text


async def test_the_sub_agent_example_answers_through_a_child_loop(
    settings: Settings, nc: NATS, tmp_path: Path, examples: list[Example]
) -> None:
    assert (ROOT / "examples" / "sub_agent.py").read_text() == SUB_AGENT
    assert set(re.findall(r"^(?:from (\S+) import|import (\S+))", SUB_AGENT, re.M)) == {("loopwire", "")}
    with system(settings, tools=("calculator",)):
        worker = Example(tmp_path, "sub_agent", SUB_AGENT, settings)
        examples.append(worker)
        async with ToolRegistry(nc, settings.names) as registry:
            spec = await registry.wait_for("researcher", timeout=30)
        assert spec.kind == "agent" and spec.input_schema["required"] == ["task"]
        client = LoopClient(nc, settings.names)
        loop_id = str(uuid.uuid4())
        await client.start(loop_id, model="demo", tools=["researcher"])
        sent = await client.input(loop_id, 'ask researcher "what is 17*23"')
        with anyio.fail_after(60):
            turn = await wait_for_turn(nc, settings.names, loop_id, sent.command_id, sent.seq)
        assert turn.outcome == "done", turn
        steps = [e async for _, e in replay(nc, loop_id, names=settings.names) if isinstance(e, ev.StepDone)]
        result = steps[0].messages[1]
        assert isinstance(result, ToolResultMessage) and not result.is_error and "391" in text_of(result)
        child = child_loop_id(ev.execution_id_for(steps[0].step_id, result.tool_use_id))
        child_turn = [e async for _, e in replay(nc, child, names=settings.names) if isinstance(e, ev.TurnDone)]
        assert len(child_turn) == 1 and child_turn[0].message is not None
        assert text_of(child_turn[0].message) == text_of(result)
        assert worker.stop() == 0
