"""Tracing off costs nothing; JSON log lines; metric recording and exposition; the new settings."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from shared import logfmt, metrics, telemetry
from shared.settings import Settings


def test_tracing_is_off_without_an_otlp_endpoint_and_never_loads_the_sdk() -> None:
    code = (
        "import sys, os\n"
        "from shared import telemetry\n"
        "import services.model_step.driver, services.committer.service, services.tools.worker\n"
        "assert telemetry.configure('x') is False\n"
        "assert not [m for m in sys.modules if m.startswith('opentelemetry.sdk')], 'SDK loaded'\n"
        "assert telemetry.traceparent() == '' and telemetry.headers_or_none(None) is None\n"
        "with telemetry.span('a') as s:\n"
        "    s.set_attribute('k', 1)\n"
        "print('ok')\n"
    )
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("OTEL_")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


@pytest.mark.parametrize(
    ("env", "wanted"),
    [
        ({}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"}, True),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4318", "OTEL_TRACES_EXPORTER": "none"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4318", "OTEL_SDK_DISABLED": "true"}, False),
    ],
)
def test_tracing_follows_the_standard_variables(env: dict[str, str], wanted: bool) -> None:
    assert telemetry.tracing_requested(env) is wanted


def test_json_log_lines_carry_the_bound_coordinates() -> None:
    fmt = logfmt.JsonFormatter("model-step")
    record = logging.LogRecord("loopwire.x", logging.WARNING, __file__, 1, "step %s failed", ("s1",), None)
    with logfmt.bound(loop_id="L", turn_id="T"), logfmt.bound(step_id="S", tool_execution_id=""):
        line = json.loads(fmt.format(record))
    assert line["service"] == "model-step" and line["level"] == "WARNING"
    assert line["message"] == "step s1 failed"
    assert (line["loop_id"], line["turn_id"], line["step_id"]) == ("L", "T", "S")
    assert "tool_execution_id" not in line and line["time"].endswith("Z")
    outside = json.loads(fmt.format(record))
    assert "loop_id" not in outside


def test_log_format_and_metrics_port_settings() -> None:
    s = Settings.from_env({"LW_LOG_FORMAT": "JSON", "LW_METRICS_PORT": "9464"})
    assert (s.log_format, s.metrics_port) == ("json", 9464)
    assert (Settings.from_env({}).log_format, Settings.from_env({}).metrics_port) == ("text", 0)
    with pytest.raises(ValueError, match="LW_LOG_FORMAT"):
        Settings.from_env({"LW_LOG_FORMAT": "xml"})
    with pytest.raises(ValueError, match="LW_METRICS_PORT"):
        Settings.from_env({"LW_METRICS_PORT": "many"})


def test_committed_records_are_counted_by_type_and_the_exposition_parses(monkeypatch: pytest.MonkeyPatch) -> None:
    def value(name: str, **labels: str) -> float:
        v = metrics.REGISTRY.get_sample_value(name, labels or None)
        return v or 0.0

    before_steps, before_done = value("loopwire_steps_committed_total"), value("loopwire_turns_total", outcome="done")
    metrics.committed(["StepDone"])  # off: nothing recorded
    assert value("loopwire_steps_committed_total") == before_steps
    monkeypatch.setattr(metrics, "ENABLED", True)
    metrics.committed(["TurnStarted", "StepDone", "StepDone", "TurnDone", "LoopIdle"])
    metrics.observe(metrics.COMMIT_SECONDS, 0.003, "committer")
    assert value("loopwire_steps_committed_total") == before_steps + 2
    assert value("loopwire_turns_total", outcome="done") == before_done + 1
    families = {f.name: f for f in text_string_to_metric_families(generate_latest(metrics.REGISTRY).decode())}
    assert "loopwire_commit_duration_seconds" in families
    for name in families:
        assert name.startswith("loopwire_")


def test_a_tool_context_holds_a_no_op_span_while_tracing_is_off() -> None:
    from services.tools.sdk import ToolContext

    ctx = ToolContext()
    assert ctx.span is telemetry.NO_SPAN
    ctx.span.set_attribute("k", 1)  # safe to use unconditionally
    ctx.span.add_event("e")
    assert not ctx.span.is_recording()
