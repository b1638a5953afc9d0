"""Traces across processes: committer, model-step and tool workers export OTLP to a real receiver process.

After a demo loop, a loop whose tool returns an error result and a gated loop, every turn is one
trace (its id is the one recorded in the turn's TurnStarted), with the GenAI/messaging span names,
parent/child links across at least three processes, token counts equal to the committed usage and
error status on the error result's spans. A model-step SIGKILLed mid-turn (in a model stream, in a
tool call) leaves a trace that the replica resuming the turn continues: one tree, every exported
span's parent exported too.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from nats.aio.client import Client as NATS

from shared import events as ev
from shared.client import LoopClient
from shared.content import AIMessage
from shared.settings import Settings
from tests.otlp_receiver import waterfall
from tests.syshelpers import history, system, wait_for, wait_history, write_script

pytestmark = [pytest.mark.anyio, pytest.mark.system, pytest.mark.timeout(180)]

ROOT = Path(__file__).resolve().parents[2]
Span = dict[str, Any]


@contextmanager
def otlp_receiver(tmp: Path) -> Iterator[tuple[str, Path]]:
    """The receiver (tests/otlp_receiver.py) as its own process; yields (endpoint, spans file)."""
    port_file, out = tmp / "otlp.port", tmp / "spans.jsonl"
    out.touch()
    proc = subprocess.Popen([sys.executable, "-m", "tests.otlp_receiver", str(port_file), str(out)], cwd=ROOT)
    try:
        deadline = time.monotonic() + 20
        while not port_file.exists():
            assert proc.poll() is None, "the OTLP receiver exited"
            assert time.monotonic() < deadline, "the OTLP receiver did not start"
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port_file.read_text()}", out
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def tracing_env(endpoint: str) -> dict[str, str]:
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
        "OTEL_TRACES_SAMPLER": "always_on",
        "OTEL_BSP_SCHEDULE_DELAY": "50",  # export within moments (a SIGKILL loses only the last 50 ms)
    }


def read_spans(path: Path) -> list[Span]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def trace_of(tp: str) -> tuple[str, str]:
    _, trace_id, span_id, _ = tp.split("-")
    return trace_id, span_id


async def turn_started(nc: NATS, settings: Settings, loop_id: str) -> list[ev.TurnStarted]:
    return [e for _, e in await history(nc, settings, loop_id) if isinstance(e, ev.TurnStarted)]


async def spans_when(path: Path, trace_id: str, ready: Any, timeout: float = 15.0) -> list[Span]:
    async def probe() -> list[Span] | None:
        spans = [s for s in read_spans(path) if s["trace_id"] == trace_id]
        return spans if ready(spans) else None

    return await wait_for(probe, timeout=timeout, interval=0.1)


def names(spans: list[Span]) -> set[str]:
    return {s["name"] for s in spans}


def by_id(spans: list[Span]) -> dict[str, Span]:
    return {s["span_id"]: s for s in spans}


def check_one_tree(spans: list[Span]) -> None:
    """Every span's parent was exported, but the root's: a viewer shows one connected tree."""
    ids = by_id(spans)
    orphans = [(s["name"], s["service"]) for s in spans if s["parent_span_id"] and s["parent_span_id"] not in ids]
    assert orphans == []
    assert len([s for s in spans if not s["parent_span_id"]]) == 1


def check_cross_process_links(spans: list[Span]) -> None:
    ids = by_id(spans)
    workers = [s for s in spans if s["name"].startswith("execute_tool") and s["kind"] == "server"]
    assert workers
    for w in workers:
        caller = ids[w["parent_span_id"]]
        assert caller["name"] == w["name"] and caller["kind"] == "client"
        assert caller["service"] == "loopwire-model-step" and w["service"].startswith("loopwire-tool")
        assert caller["attributes"]["gen_ai.tool.call.id"] == w["attributes"]["gen_ai.tool.call.id"]
    appends = [s for s in spans if s["name"].startswith("append ") and s["kind"] == "server"]
    assert appends
    for a in appends:
        parent = ids[a["parent_span_id"]]
        assert parent["name"].startswith("commit ") and parent["service"] == "loopwire-model-step"
        assert a["service"] == "loopwire-committer" and a["attributes"]["messaging.system"] == "nats"
        assert a["attributes"]["loopwire.stream_sequence"] > 0
    assert len({s["instance"] for s in spans}) >= 3  # committer, model-step, tool worker


async def test_one_trace_per_turn_across_processes(settings: Settings, nc: NATS, tmp_path: Path) -> None:
    erring = write_script(
        tmp_path,
        [
            [
                {"kind": "tool_use", "index": 0, "id": "call_err_{k}", "name": "calculator"},
                {"kind": "tool_use", "index": 0, "text": json.dumps({"expression": "2 $ 3"})},
                {"kind": "finish", "finish_reason": "tool_use"},
            ],
            "That expression is not valid.",
        ],
    )
    env_json = {"LW_LOG_FORMAT": "json", "LW_LOG_LEVEL": "DEBUG"}
    with (
        otlp_receiver(tmp_path) as (endpoint, out),
        system(settings, env={**tracing_env(endpoint), **env_json}) as sys_,
    ):
        demo, bad, gated = await run_demo_erring_and_gated_loops(nc, settings, erring)
        demo_trace = await check_demo_turn_trace(nc, settings, out, demo)
        await check_error_result_trace(nc, settings, out, bad, erring, other_trace=demo_trace)
        await check_gated_turn_trace(nc, settings, out, gated)
        check_json_logs(sys_.log_dir)


async def run_demo_erring_and_gated_loops(nc: NATS, settings: Settings, erring: str) -> tuple[str, str, str]:
    """A demo loop, one on the ``erring`` script and a gated one (approved), each to idle: their ids."""
    lc = LoopClient(nc, settings.names)
    demo, bad, gated = (str(uuid.uuid4()) for _ in range(3))
    await lc.start(demo, model="demo")
    await lc.start(bad, model=erring)
    await lc.start(gated, model="demo", policy={"clock": "ask"})
    for loop_id in (demo, bad, gated):
        await lc.input(loop_id, "what is 17*23 and what time is it in Tokyo?")
    await wait_history(nc, settings, demo, lambda h: h.idle)
    await wait_history(nc, settings, bad, lambda h: h.idle)
    h = await wait_history(nc, settings, gated, lambda h: bool(h.open_gates))
    await lc.answer(gated, h.open_gates[0].gate.id, "approve")
    await wait_history(nc, settings, gated, lambda h: h.idle)
    return demo, bad, gated


async def check_demo_turn_trace(nc: NATS, settings: Settings, out: Path, demo: str) -> str:
    """One trace, expected names, links across processes, tokens = committed usage; returns the trace id."""
    (ts,) = await turn_started(nc, settings, demo)
    trace_id, turn_span = trace_of(ts.traceparent)
    spans = await spans_when(out, trace_id, lambda ss: len([s for s in ss if s["name"].startswith("append ")]) >= 3)
    assert {"invoke_agent", "execute_tool calculator", "execute_tool clock"} <= names(spans)
    # The turn records the context its drive began in: the input command's span.
    assert by_id(spans)[turn_span]["name"] == f"input {settings.prefix}.api"
    (agent,) = [s for s in spans if s["name"] == "invoke_agent"]
    assert agent["parent_span_id"] == turn_span and agent["attributes"]["gen_ai.conversation.id"] == demo
    assert agent["attributes"]["loopwire.turn_id"] == ts.turn_id
    check_cross_process_links(spans)
    check_one_tree(spans)
    chats = sorted((s for s in spans if s["name"].startswith("chat ")), key=lambda s: s["start"])
    steps = [e for _, e in await history(nc, settings, demo) if isinstance(e, ev.StepDone)]
    usages = [m.usage for st in steps for m in st.messages if isinstance(m, AIMessage)]
    assert [(u.input_tokens, u.output_tokens) for u in usages if u is not None] == [
        (c["attributes"]["gen_ai.usage.input_tokens"], c["attributes"]["gen_ai.usage.output_tokens"]) for c in chats
    ]
    assert all(c["attributes"]["gen_ai.request.model"] for c in chats)
    assert {c["name"] for c in chats} == {"chat demo"}
    assert [c["attributes"]["gen_ai.response.finish_reasons"] for c in chats] == [["tool_use"], ["end_turn"]]
    assert all(s["status"] != "error" for s in spans)
    # The text waterfall docs/observability.md shows (LW_TRACE_OUT=FILE keeps it).
    picture = waterfall(spans)
    assert picture.splitlines()[0].startswith(("start ", "input ", "invoke_agent"))
    if os.environ.get("LW_TRACE_OUT"):
        await anyio.Path(os.environ["LW_TRACE_OUT"]).write_text(picture + "\n")
    # Every span of every loop's turn is in its own trace: no span of this turn elsewhere.
    others = [s for s in read_spans(out) if s["attributes"].get("loopwire.turn_id") == ts.turn_id]
    assert all(s["trace_id"] == trace_id for s in others)
    return trace_id


async def check_error_result_trace(
    nc: NATS, settings: Settings, out: Path, bad: str, erring: str, *, other_trace: str
) -> None:
    """Error status on the caller's and the worker's execute_tool spans, in a trace of its own."""
    (ts_bad,) = await turn_started(nc, settings, bad)
    bad_trace, _ = trace_of(ts_bad.traceparent)
    assert bad_trace != other_trace
    bad_spans = await spans_when(
        out, bad_trace, lambda ss: len([s for s in ss if s["name"] == "execute_tool calculator"]) == 2
    )
    tool_spans = [s for s in bad_spans if s["name"] == "execute_tool calculator"]
    # A scripted model is named by its file, not by the directory a test kept it in.
    script_name = Path(erring.split(":", 1)[1]).name
    assert {s["name"] for s in bad_spans if s["name"].startswith("chat ")} == {f"chat scripted:{script_name}"}
    assert {s["kind"] for s in tool_spans} == {"client", "server"}
    assert all(s["status"] == "error" and s["attributes"]["error.type"] == "tool_error" for s in tool_spans)


async def check_gated_turn_trace(nc: NATS, settings: Settings, out: Path, gated: str) -> None:
    """The turn's drives before and after the gate share its trace."""
    (ts_gate,) = await turn_started(nc, settings, gated)
    gate_trace, gate_turn_span = trace_of(ts_gate.traceparent)
    gate_spans = await spans_when(
        out,
        gate_trace,
        lambda ss: (
            len([s for s in ss if s["name"] == "invoke_agent"]) >= 2
            and len([s for s in ss if s["name"].startswith("chat ")]) == 2
        ),
    )
    agents = sorted((s for s in gate_spans if s["name"] == "invoke_agent"), key=lambda s: s["start"])
    events = [e["name"] for s in agents for e in s["events"]]
    assert "gate.opened" in events and "gate.resolved" in events
    resumed = agents[-1]
    assert resumed["parent_span_id"] == gate_turn_span
    assert {"trace_id": gate_trace, "span_id": agents[0]["span_id"]} in resumed["links"]
    # The first drive's span ended when it parked at the gate, before the operator answered.
    assert agents[0]["end"] <= resumed["start"]
    check_cross_process_links(gate_spans)
    check_one_tree(gate_spans)


def check_json_logs(log_dir: Path) -> None:
    """LW_LOG_FORMAT=json: every service writes one JSON object per line."""
    lines = [ln for f in log_dir.glob("*.log") for ln in f.read_text().splitlines() if ln.strip()]
    assert lines
    about_loops = 0
    for ln in lines:
        doc = json.loads(ln)
        assert {"time", "level", "service", "message"} <= set(doc), doc
        # A line about a loop carries its id as a field, to be found by it.
        named = re.search(r"\bloop ([0-9a-f-]{36})\b", doc["message"])
        if named:
            about_loops += 1
            assert doc.get("loop_id") == named[1], doc
    assert about_loops, "no line about a loop at DEBUG"


async def test_a_killed_model_step_leaves_a_trace_the_resuming_replica_continues(
    settings: Settings, nc: NATS, tmp_path: Path
) -> None:
    env = {**tracing_env(""), "LW_DEMO_CHUNK_DELAY": "0.1"}
    with otlp_receiver(tmp_path) as (endpoint, out):
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = endpoint
        with system(settings, env=env) as s:
            lc = LoopClient(nc, settings.names)
            loop_id = str(uuid.uuid4())
            await lc.start(loop_id, model="demo")
            await lc.input(loop_id, "what is 17*23 and what time is it in Tokyo?")
            h = await wait_history(nc, settings, loop_id, lambda h: h.open_turn is not None)
            assert h.open_turn is not None
            trace_id, turn_span = trace_of(h.open_turn.traceparent)
            # The TurnStarted commit span of the first replica has been exported: kill it mid-step.
            first = await spans_when(out, trace_id, lambda ss: any(x["name"].startswith("commit ") for x in ss))
            killed = {x["instance"] for x in first if x["service"] == "loopwire-model-step"}
            (victim,) = s.sup.by_name("model-step")
            victim.kill()
            s.model_step()
            h = await wait_history(nc, settings, loop_id, lambda h: h.idle, timeout=60)
            assert h.open_turn is None
            spans = await spans_when(
                out,
                trace_id,
                lambda ss: any(
                    x["name"] == "invoke_agent" and x["instance"] not in killed and x["parent_span_id"] == turn_span
                    for x in ss
                ),
            )
            instances = {x["instance"] for x in spans if x["service"] == "loopwire-model-step"}
            assert killed < instances  # both replicas' spans, one trace
            resumed = [x for x in spans if x["instance"] in instances - killed]
            assert any(x["name"].startswith("chat ") for x in resumed)
            assert any(x["name"] == "execute_tool calculator" for x in resumed)
            (ts,) = await turn_started(nc, settings, loop_id)
            assert trace_of(ts.traceparent)[0] == trace_id
            check_one_tree(spans)
        await anyio.lowlevel.checkpoint()


async def test_a_model_step_killed_in_a_tool_call_leaves_one_tree_and_its_replacement_logs_the_turn(
    settings: Settings, nc: NATS, tmp_path: Path
) -> None:
    ledger = tmp_path / "ledger.jsonl"
    ledger.touch()
    slow = [
        {"kind": "tool_use", "index": 0, "id": "c_{k}", "name": "ledger"},
        {"kind": "tool_use", "index": 0, "text": json.dumps({"note": "x", "hold": 5.0})},
        {"kind": "finish", "finish_reason": "tool_use"},
    ]
    script = write_script(tmp_path, {"responses": [slow, "done"], "repeat_last": True}, "s.json")
    env = {**tracing_env(""), "LW_LEDGER": str(ledger), "LW_LOG_FORMAT": "json", "LW_LOG_LEVEL": "DEBUG"}
    # The dead replica's lease outlives its replacement's start-up however slow: it is taken over.
    env["LW_LEASE_TTL_SECONDS"] = "10"
    with otlp_receiver(tmp_path) as (endpoint, out):
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = endpoint
        with system(settings, env=env, tools=("tests.system.ledger_tool:ledger",)) as s:
            lc = LoopClient(nc, settings.names)
            loop_id = str(uuid.uuid4())
            await lc.start(loop_id, model=script)
            await lc.input(loop_id, "go")
            with anyio.fail_after(30):  # the call has started on its worker and holds for 5 s
                while not ledger.read_text().strip():
                    await anyio.sleep(0.05)
            await anyio.sleep(1)
            (victim,) = s.sup.by_name("model-step")
            victim.kill()
            replacement = s.model_step()
            with anyio.fail_after(30):  # the replacement drives the loop: it waits for the call's result
                while "driving" not in await anyio.Path(replacement.log_path).read_text():
                    await anyio.sleep(0.05)
            await lc.input(loop_id, "and then")  # its work signal comes during that drive
            await wait_history(nc, settings, loop_id, lambda h: h.idle and not h.pending_inputs, timeout=60)
            ts, *_ = await turn_started(nc, settings, loop_id)
            trace_id, _ = trace_of(ts.traceparent)
            await spans_when(
                out,
                trace_id,
                lambda ss: (
                    any(x["name"] == "invoke_agent" for x in ss)
                    and any(x["name"] == "execute_tool ledger" and x["kind"] == "server" for x in ss)
                ),
            )
            await anyio.sleep(0.5)  # the turn's last spans
            spans = [x for x in read_spans(out) if x["trace_id"] == trace_id]
            check_one_tree(spans)
            # The replacement continued the dead replica's drive span: its children are from both.
            agent = next(x for x in spans if x["name"] == "invoke_agent")
            assert agent["attributes"]["loopwire.turn_id"] == ts.turn_id
            model_steps = {x["instance"] for x in spans if x["service"] == "loopwire-model-step"}
            assert len(model_steps) == 2
            assert {x["instance"] for x in spans if x["parent_span_id"] == agent["span_id"]} == model_steps
            # The worker's span is under the caller's span, which the replacement continued too.
            worker = next(x for x in spans if x["name"] == "execute_tool ledger" and x["kind"] == "server")
            caller = by_id(spans)[worker["parent_span_id"]]
            assert (caller["kind"], caller["instance"]) == ("client", agent["instance"])
            assert len(ledger.read_text().splitlines()) == 1  # run once: the replacement waited for its result
            # Every model-step line about the loop carries its id and its turn's trace.
            about = [
                doc
                for log_file in s.log_dir.glob("model-step-*.log")
                for doc in map(json.loads, log_file.read_text().splitlines())
                if loop_id in doc["message"]
            ]
            assert any("taken over" in d["message"] for d in about)
            assert any("noted" in d["message"] for d in about)
            for d in about:
                assert (d.get("loop_id"), d.get("trace_id")) == (loop_id, trace_id), d
