"""The figures of ``python -m bench scale`` (bench/scalefigures.py): pure functions of measured numbers."""

from __future__ import annotations

import pytest

from bench.scalefigures import RunFigures, bottleneck, busy_share, rotated, round_order, summarise, verdict


def test_each_process_connects_to_the_next_node_first() -> None:
    urls = ["a", "b", "c"]
    assert [rotated(urls, i)[0] for i in range(5)] == ["a", "b", "c", "a", "b"]
    assert rotated(urls, 1) == ["b", "c", "a"]


def test_shard_counts_alternate_in_rounds() -> None:
    assert round_order([1, 2, 4], 2) == [(0, 1), (0, 2), (0, 4), (1, 1), (1, 2), (1, 4)]


def test_the_machines_busy_share_leaves_out_idle_and_iowait() -> None:
    before = [100, 0, 50, 800, 10, 0, 5, 35, 0, 0]
    after = [400, 0, 150, 1000, 110, 0, 5, 135, 0, 0]  # 300 user, 100 system, 200 idle, 100 iowait, 100 steal
    assert busy_share(before, after) == pytest.approx(500 / 800)
    assert busy_share(before, before) is None
    assert busy_share(None, after) is None


def _run(shards: int, rnd: int, steps: int, servers: dict[str, float], busy: float = 1.0) -> RunFigures:
    return RunFigures(
        nodes=len(servers),
        shards=shards,
        round=rnd,
        seconds=2.0,
        steps=steps,
        servers=servers,
        services={"committer-1": 1.0, "model-step-1": 1.4},
        bench=0.1,
        machine_busy=busy,
        cpus=2,
    )


def test_one_runs_figures() -> None:
    r = _run(1, 0, 1000, {"n1": 0.6, "n2": 0.2, "n3": 0.2})
    assert r.steps_per_s == 500
    assert r.busiest == "n1"
    assert r.busiest_core == pytest.approx(0.3)
    assert r.busiest_share == pytest.approx(0.6)
    assert r.node_shares == pytest.approx({"n1": 0.6, "n2": 0.2, "n3": 0.2})
    assert r.services_core == pytest.approx(1.2)
    assert r.services_us_per_step == pytest.approx(2400)
    assert r.servers_us_per_step == pytest.approx(1000)
    assert r.services_share == pytest.approx(2.4 / 3.5)
    assert r.other_core == pytest.approx(2.0 - 3.5 / 2)  # 2 cores busy, the measured processes 1.75
    assert r.to_json()["steps_per_s"] == 500


def test_medians_by_shard_count_and_the_ratio_of_each_round() -> None:
    even = {"n1": 0.3, "n2": 0.3, "n3": 0.3}
    runs = [
        _run(1, 0, 1000, even),
        _run(2, 0, 1500, even),
        _run(1, 1, 2000, even),  # a faster minute: its round's ratio is against its own one-shard run
        _run(2, 1, 2400, even),
        _run(2, 2, 1600, even),  # a round without a one-shard run adds no ratio
    ]
    rows = {r["shards"]: r for r in summarise(runs)}
    assert rows[1]["steps_per_s"] == 750 and rows[1]["ratio"] == 1.0
    assert rows[2]["rounds"] == 3
    assert rows[2]["steps_per_s"] == 800
    assert rows[2]["ratio"] == pytest.approx(1.35)  # median of 1.5 and 1.2
    assert rows[2]["node_shares"] == pytest.approx({"n1": 1 / 3, "n2": 1 / 3, "n3": 1 / 3}, abs=1e-3)


def test_what_limited_the_rate() -> None:
    row = {
        "nodes": 3,
        "shards": 1,
        "machine_busy": 0.98,
        "busiest_core": 0.25,
        "services_share": 0.6,
        "services_us_per_step": 1200,
        "servers_us_per_step": 800,
        "cpus": 2,
    }
    assert bottleneck(row) == "services"
    assert bottleneck({**row, "services_share": 0.45}) == "machine CPU"
    assert bottleneck({**row, "busiest_core": 0.95, "services_share": 0.3}) == "server"
    assert bottleneck({**row, "machine_busy": 0.5}) == "not CPU"
    assert bottleneck({**row, "machine_busy": None}) == "unknown"
    said = verdict([row, {**row, "shards": 2, "other_core": 0.5, "servers_us_per_step": 1000}])
    assert said[0].startswith("3 nodes: the services, not the busiest server, were the bottleneck")
    assert "nats-servers together about 40–45 %" in said[0]
    assert said[1] == (
        "3 nodes: CPU per committed step, services + nats-servers: 1,200 + 800 µs with 1 shard, "
        "1,200 + 1,000 µs with 2."
    )
    assert "outside the benchmark" in said[2]
    mixed = verdict([row, {**row, "shards": 2, "services_share": 0.45}])
    assert mixed[0].startswith("3 nodes: the machine's CPU, shared by the services and the nats-servers")
