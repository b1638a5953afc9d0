"""The benchmark's targets table: each target's verdict from a run's measurements (bench/targets.py)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from bench.targets import MET, MISS, TargetRow, evaluate, render


def _peer(seq: float, conc: float, cpu: int, resume: float) -> dict[str, Any]:
    return {"seq_steps_per_s": seq, "conc_steps_per_s": conc, "cpu_us_per_step": cpu, "resume_s": resume}


def _all_met() -> dict[str, Any]:
    """A run in which loopwire meets every target."""
    lw = _peer(300, 900, 1_000, 0.4) | {"lease_ttl_s": 2.0, "lease_ttl_default_s": 2.0}
    return {
        "floor": {
            "loops": 64,
            "cpu_us_per_step": 500,
            "traffic": {"in_msgs": 5.0, "out_msgs": 5.0, "in_bytes": 900.0, "out_bytes": 900.0, "nodes": 1},
        },
        "step": {"loopwire": 3.0, "floor": 2.0, "ratio": 1.5, "rounds": 5},
        "cpu_pairs": {"rounds": 5, "floor": 500, "loopwire": 1_150, "ratio": 2.4},
        "throughput": {
            "loops": 64,
            "cpu_us_per_step": 1_200,
            "traffic": {"in_msgs": 8.0, "out_msgs": 11.0, "in_bytes": 3000.0, "out_bytes": 4000.0, "nodes": 1},
        },
        "peers": {
            "systems": {
                "loopwire": lw,
                "loopwire-r3": _peer(250, 800, 1_500, 0.5),
                "langgraph": _peer(100, 140, 7_000, 1.5),
                "dbos": _peer(100, 90, 13_000, 1.9),
                "restate": _peer(200, 740, 1_200, 0.6),
            },
            "not_run": {},
            "requested": ["loopwire", "loopwire-r3", "langgraph", "dbos", "restate"],
        },
    }


def _row(rows: list[TargetRow], starts: str) -> TargetRow:
    found = [r for r in rows if r.target.startswith(starts)]
    assert len(found) == 1, (starts, [r.target for r in rows])
    return found[0]


def test_every_target_met() -> None:
    rows = evaluate(_all_met())
    assert len(rows) == 9
    assert [r.verdict for r in rows] == [MET] * 9
    assert _row(rows, "single-loop step p50").ratio == "1.50 ×"
    assert _row(rows, "CPU µs/step (64 loops").ratio == "2.40 ×"
    assert "best peer restate" in _row(rows, "loopwire steps/s ahead of every peer (many loops)").compared
    assert "MET" in render(rows)


@pytest.mark.parametrize(
    ("path", "value", "target"),
    [
        (("step", "ratio"), 1.65, "single-loop step p50"),  # the median of the rounds' ratios
        (("cpu_pairs", "ratio"), 2.6, "CPU µs/step (64 loops"),  # the median of the rounds' ratios
        (("peers", "systems", "loopwire", "cpu_us_per_step"), 1_200, "CPU µs/step (peers"),  # equal is not below
        (("peers", "systems", "loopwire", "seq_steps_per_s"), 199, "loopwire steps/s ahead of every peer (1 loop)"),
        (("peers", "systems", "loopwire-r3", "conc_steps_per_s"), 740, "loopwire-r3 steps/s ahead of every peer (many"),
        (("peers", "systems", "loopwire", "resume_s"), 0.61, "resume after SIGKILL"),
        (("throughput", "traffic", "in_msgs"), 8.5, "messages into nats-server"),
    ],
)
def test_a_figure_past_its_limit_misses(path: tuple[str, ...], value: float, target: str) -> None:
    m = _all_met()
    node = m
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = value
    rows = evaluate(m)
    assert _row(rows, target).verdict == MISS
    assert sum(r.verdict == MISS for r in rows) == 1


def test_unmeasured_inputs_say_why() -> None:
    rows = evaluate({"floor": _all_met()["floor"]})
    assert _row(rows, "single-loop step p50").verdict == "not measured (step not run)"
    assert _row(rows, "messages into nats-server").verdict == "not measured (throughput not run)"
    assert _row(rows, "CPU µs/step (64 loops").verdict == "not measured (throughput not run)"
    assert _row(rows, "resume after SIGKILL").verdict == "not measured (peers not run)"
    assert not any(r.verdict in (MET, MISS) for r in rows)


def test_a_missing_peer_blocks_met_but_not_miss() -> None:
    m = _all_met()
    del m["peers"]["systems"]["dbos"]
    m["peers"]["not_run"]["dbos"] = "skipped: Python module dbos not installed"
    rows = evaluate(m)
    r = _row(rows, "loopwire steps/s ahead of every peer (1 loop)")
    assert r.verdict == "not measured (not every peer measured)"
    assert "(others: dbos skipped)" in r.compared
    # a measured peer that is ahead is a miss whatever else is missing
    m2 = copy.deepcopy(m)
    m2["peers"]["systems"]["restate"]["seq_steps_per_s"] = 400
    assert _row(evaluate(m2), "loopwire steps/s ahead of every peer (1 loop)").verdict == MISS


def test_cpu_below_restate_needs_restate() -> None:
    m = _all_met()
    del m["peers"]["systems"]["restate"]
    m["peers"]["requested"].remove("restate")
    assert _row(evaluate(m), "CPU µs/step (peers").verdict == "not measured (restate not in --peers)"


def test_resume_with_a_shortened_lease_is_not_a_figure() -> None:
    m = _all_met()
    m["peers"]["systems"]["loopwire"]["lease_ttl_s"] = 0.5
    verdict = _row(evaluate(m), "resume after SIGKILL").verdict
    assert verdict.startswith("not measured (lease TTL 0.5 s")


def test_cpu_pairs_are_judged_by_the_median_of_the_rounds_ratios() -> None:
    from bench.scenarios import cpu_pairs_summary

    def side(**cpu: int) -> dict[str, Any]:
        return {"cpu_us_per_step": cpu}

    # The machine slows down over the rounds: each round's ratio holds, the sides' medians drift apart.
    pairs = [
        {"floor": side(driver=100, nats=100), "loopwire": side(model=300, nats=100)},  # 2.0
        {"floor": side(driver=150, nats=150), "loopwire": side(model=500, nats=160)},  # 2.2
        {"floor": side(driver=250, nats=250), "loopwire": side(model=900, nats=300)},  # 2.4
    ]
    s = cpu_pairs_summary(pairs)
    assert (s["rounds"], s["floor"], s["loopwire"]) == (3, 300, 660)
    assert s["ratio"] == pytest.approx(2.2)
    assert s["by_process"] == {"floor": {"driver": 150, "nats": 150}, "loopwire": {"model": 500, "nats": 160}}
    assert cpu_pairs_summary([]) == {}
