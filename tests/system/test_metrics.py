"""Metrics scraped by a real Prometheus server (Debian's ``prometheus``) from every service process.

Committer, model-step and a tool worker run as their own processes with ``LW_METRICS_PORT`` set
(and tracing on, exporting to the OTLP receiver process, so histograms carry exemplars). After a
load of demo loops, Prometheus' HTTP API says: the committed steps counted equal the StepDone records
in history, and the latency histograms have samples. Every exposition parses with prometheus-client's
own parsers (text format and OpenMetrics, whose exemplars name real trace ids).
"""

from __future__ import annotations

import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import anyio
import httpx
import pytest
from nats.aio.client import Client as NATS
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families as parse_text

from services.deployment import service_command
from shared import events as ev
from shared.client import LoopClient
from shared.natsserver import free_port
from shared.settings import Settings
from tests.syshelpers import debian_program, history, system, wait_for, wait_history
from tests.system.test_observability import otlp_receiver, read_spans, tracing_env

pytestmark = [pytest.mark.anyio, pytest.mark.system, pytest.mark.timeout(180)]

PROMETHEUS = debian_program("prometheus", "prometheus")
LOOPS = 8


@contextmanager
def prometheus(tmp: Path, targets: list[str]) -> Iterator[str]:
    """Debian's prometheus scraping ``targets`` every second; yields its base URL."""
    port = free_port()
    config = tmp / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\n"
        "scrape_configs:\n  - job_name: loopwire\n    static_configs:\n"
        f"      - targets: [{', '.join(repr(t) for t in targets)}]\n"
    )
    log = (tmp / "prometheus.log").open("wb")
    proc = subprocess.Popen(
        [
            PROMETHEUS,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--enable-feature=exemplar-storage",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, (tmp / "prometheus.log").read_text()[-2000:]
            try:
                if httpx.get(f"{url}/-/ready", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "prometheus did not become ready"
            time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=15)
        log.close()


async def query(url: str, promql: str) -> float | None:
    async with httpx.AsyncClient() as client:
        r = await client.get(f"{url}/api/v1/query", params={"query": promql}, timeout=5)
    body = r.json()
    assert body["status"] == "success", body
    result = body["data"]["result"]
    return float(result[0]["value"][1]) if result else None


async def test_prometheus_scrapes_every_service_and_counts_what_history_holds(
    settings: Settings, nc: NATS, tmp_path: Path
) -> None:
    ports = {"committer": free_port(), "model-step": free_port(), "tools": free_port()}
    with otlp_receiver(tmp_path) as (endpoint, spans_file):
        env = tracing_env(endpoint)
        with system(settings, committers=0, model_steps=0, tools=(), env=env) as s:
            s.start("committer", service_command("committer"), env={"LW_METRICS_PORT": str(ports["committer"])})
            s.tools("calculator", "clock", LW_METRICS_PORT=str(ports["tools"]))
            s.model_step(LW_METRICS_PORT=str(ports["model-step"]))
            with prometheus(tmp_path, [f"127.0.0.1:{p}" for p in ports.values()]) as prom:
                lc = LoopClient(nc, settings.names)
                loops = [str(uuid.uuid4()) for _ in range(LOOPS)]

                async def one(loop_id: str) -> None:
                    await lc.start(loop_id, model="demo")
                    await lc.input(loop_id, "what is 17*23 and what time is it in Tokyo?")
                    await wait_history(nc, settings, loop_id, lambda h: h.idle, timeout=60)

                async with anyio.create_task_group() as tg:
                    for loop_id in loops:
                        tg.start_soon(one, loop_id)
                steps = 0
                for loop_id in loops:
                    steps += sum(isinstance(e, ev.StepDone) for _, e in await history(nc, settings, loop_id))
                assert steps == 2 * LOOPS

                async def counted() -> float | None:
                    value = await query(prom, "sum(loopwire_steps_committed_total)")
                    return value if value == steps else None

                assert await wait_for(counted, timeout=20, interval=0.5) == steps

                async def all_up() -> float | None:
                    # (a scrape of a busy process may time out once: up is per scrape)
                    value = await query(prom, 'sum(up{job="loopwire"})')
                    return value if value == 3 else None

                assert await wait_for(all_up, timeout=20, interval=0.5) == 3
                turns = await query(prom, 'sum(loopwire_turns_total{outcome="done"})')
                assert turns == LOOPS
                for histogram in (
                    'loopwire_commit_duration_seconds_count{service="committer"}',
                    'loopwire_commit_duration_seconds_count{service="model-step"}',
                    "loopwire_model_request_duration_seconds_count",
                    'loopwire_tool_call_duration_seconds_count{side="worker"}',
                    'loopwire_tool_call_duration_seconds_count{side="caller"}',
                ):
                    value = await query(prom, f"sum({histogram})")
                    assert value is not None and value > 0, histogram
                tokens = await query(prom, 'sum(loopwire_model_tokens_total{direction="output"})')
                assert tokens is not None and tokens > 0
                assert await query(prom, 'sum(loopwire_tool_calls_total{side="worker",outcome="ok"})') == 2 * LOOPS

                # The expositions parse with prometheus-client's own parsers; exemplars name real traces.
                traces = {sp["trace_id"] for sp in read_spans(spans_file)}
                exemplars = []
                async with httpx.AsyncClient() as client:
                    for port in ports.values():
                        text = (await client.get(f"http://127.0.0.1:{port}/metrics")).text
                        assert any(f.name.startswith("loopwire_") for f in parse_text(text))
                        om = await client.get(
                            f"http://127.0.0.1:{port}/metrics", headers={"Accept": "application/openmetrics-text"}
                        )
                        for family in parse_openmetrics(om.text):
                            exemplars += [smp.exemplar for smp in family.samples if smp.exemplar is not None]
                assert exemplars
                assert all(x.labels["trace_id"] in traces for x in exemplars)
