"""Values of the command line are checked when given, against a stack started by ``loopwire up``: a
rule naming no tool of the loop (a misspelt policy would leave the tool ungated), a model spec or a
scripted model's file, LW_MODEL, and a sub-agent's model, tools and policy. One ``error:`` line, exit 1."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from shared.natsserver import free_port
from tests.integration.test_cli import LOOPWIRE, Up, up

__all__ = ["up"]  # the stack fixture, shared with test_cli


def one_error_line(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 1, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    return lines[0]


def run_with(up: Up, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "LW_NATS_URL": up.url, **env}
    return subprocess.run([LOOPWIRE, *args], env=full, capture_output=True, text=True, timeout=60)


def loop_model(up: Up, loop: str) -> str:
    rows = [json.loads(line) for line in up.run("loops", "--json").stdout.splitlines()]
    return str(next(r["model"] for r in rows if r["loop_id"] == loop))


def test_a_policy_naming_no_tool_of_the_loop_is_refused(up: Up) -> None:
    line = one_error_line(up.run("start", "--policy", "calculater=ask"))
    assert line == "error: invalid: policy: 'calculater' is not a tool of the loop (did you mean calculator?)"
    line = one_error_line(up.run("start", "--tools", "clock", "--policy", "calculator=ask"))
    assert line == "error: invalid: policy: 'calculator' is not a tool of the loop (its tools: clock)"
    gated = up.run("start", "--policy", "calculator=ask", "--policy", "*=allow")
    assert gated.returncode == 0, gated.stderr


def test_a_fork_s_rules_must_name_tools_of_the_loop(up: Up) -> None:
    loop = up.run("start").stdout.strip()
    assert up.run("send", loop, "what is 2+2?", "--wait").returncode == 0
    line = one_error_line(up.run("fork", loop, "--reexecute", "calculater=reuse"))
    assert line == "error: invalid: reexecution: 'calculater' is not a tool of the loop (did you mean calculator?)"
    line = one_error_line(up.run("fork", loop, "--policy", "clokc=deny"))
    assert line.endswith("(did you mean clock?)")
    assert up.run("fork", loop, "--reexecute", "calculator=reuse").returncode == 0


def test_a_misspelt_tool_names_its_close_match(up: Up) -> None:
    line = one_error_line(up.run("start", "--tools", "calculater"))
    assert line.startswith("error: --tools: no live tool named calculater (did you mean calculator?) (live: ")


def test_models_are_checked_when_given(up: Up, tmp_path: Path) -> None:
    line = one_error_line(up.run("fork", "0000", "--model", "dmeo"))
    assert line.startswith("error: --model: unknown model 'dmeo': expected one of demo, scripted:<path>")
    missing = tmp_path / "nope.json"
    line = one_error_line(up.run("start", "--model", f"scripted:{missing}"))
    assert line == f"error: --model: scripted model: cannot read {str(missing)!r}: FileNotFoundError"
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    line = one_error_line(up.run("start", "--model", f"scripted:{broken}"))
    assert line.startswith("error: --model: scripted model: broken.json is not valid JSON")
    assert up.run("loops", "--json").stdout.count(str(tmp_path)) == 0  # nothing was started


def test_start_takes_lw_model_from_its_environment(up: Up, tmp_path: Path) -> None:
    script = tmp_path / "hello.json"
    script.write_text(json.dumps({"responses": ["hello from the script"], "repeat_last": True}))
    started = run_with(up, {"LW_MODEL": f"scripted:{script}"}, "start")
    assert started.returncode == 0, started.stderr
    loop = started.stdout.strip()
    assert loop_model(up, loop) == f"scripted:{script}"
    sent = up.run("send", loop, "hi", "--wait")
    assert sent.returncode == 0 and "hello from the script" in sent.stdout, sent.stderr
    # --model wins over LW_MODEL; a bad LW_MODEL is refused like a bad --model.
    chosen = run_with(up, {"LW_MODEL": f"scripted:{script}"}, "start", "--model", "demo")
    assert loop_model(up, chosen.stdout.strip()) == "demo"
    line = one_error_line(run_with(up, {"LW_MODEL": "dmeo"}, "start"))
    assert line.startswith("error: LW_MODEL: unknown model 'dmeo'")


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--model", "dmeo"], "error: --model: unknown model 'dmeo'"),
        (["--model", "scripted:/no/such/script.json"], "error: --model: scripted model: cannot read"),
        (["--model", "demo", "--tools", "calculater"], "error: --tools: no live tool named calculater (did you mean"),
        (
            ["--model", "demo", "--policy", "calculater=ask"],
            "error: --policy: 'calculater' is not a tool of the loop (did you mean calculator?)",
        ),
        (
            ["--model", "demo", "--tools", "clock", "--policy", "calculator=ask"],
            "error: --policy: 'calculator' is not a tool of the loop (its tools: clock)",
        ),
    ],
    ids=["model", "script", "tools", "policy", "policy-of-allow-list"],
)
def test_a_sub_agent_refuses_bad_values_at_start(up: Up, args: list[str], expected: str) -> None:
    started = time.monotonic()
    line = one_error_line(up.run("serve", "agent", "helper", *args, timeout=30))
    assert line.startswith(expected), line
    assert time.monotonic() - started < 20
    assert "helper" not in up.run("tools").stdout  # it never served


@pytest.mark.parametrize(
    "args",
    [
        ["start", "--model", "scripted:/no/such/script.json"],
        ["fork", "00000000-0000-4000-8000-000000000000", "--model", "dmeo"],
        ["serve", "agent", "helper", "--model", "dmeo"],
    ],
    ids=["start", "fork", "agent"],
)
def test_a_bad_model_is_refused_before_connecting(args: list[str]) -> None:
    url = f"nats://127.0.0.1:{free_port()}"  # nothing listens there: the value is what is wrong
    env = {**os.environ, "LW_NATS_URL": url}
    done = subprocess.run([LOOPWIRE, *args], env=env, capture_output=True, text=True, timeout=60)
    line = one_error_line(done)
    assert line.startswith("error: --model: ") and "cannot connect" not in line


@pytest.mark.parametrize("args", [["up", "--port", "0", "--no-console"], ["demo", "--plain"]], ids=["up", "demo"])
def test_up_and_demo_refuse_a_bad_model_before_starting_anything(args: list[str], tmp_path: Path) -> None:
    for model, expected in [
        ("dmeo", "error: --model: unknown model 'dmeo'"),
        (f"scripted:{tmp_path / 'nope.json'}", "error: --model: scripted model: cannot read"),
    ]:
        started = time.monotonic()
        done = subprocess.run(
            [LOOPWIRE, *args, "--model", model, "--data-dir", str(tmp_path / "data")],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert one_error_line(done).startswith(expected), done.stderr
        assert time.monotonic() - started < 10
        assert not (tmp_path / "data").exists() or not any((tmp_path / "data").iterdir())  # nothing started


def test_a_sub_agent_s_policy_may_name_the_agent_itself(up: Up) -> None:
    # Documented: the agent is denied to its own children unless --policy NAME=allow; it registers
    # only once it serves, so the check counts it among the child's tools.
    agent = up.popen("serve", "agent", "selfish", "--model", "demo", "--policy", "selfish=allow")
    try:
        deadline = time.monotonic() + 30
        while '"selfish"' not in up.run("tools", "--json").stdout:
            assert agent.poll() is None, agent.communicate()
            assert time.monotonic() < deadline, "the agent never served"
            time.sleep(0.2)
    finally:
        agent.send_signal(signal.SIGTERM)
        agent.wait(timeout=30)
