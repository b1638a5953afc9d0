"""The performance targets, judged from one run's measurements.

:func:`measurements` takes the figures a run measured out of the scenarios' results (plain numbers,
kept in the JSON); :func:`evaluate` turns them into one row per target with MET, MISS or
"not measured (why)". A target is MET only when every figure it needs was measured in the run;
a target over "every peer" is a MISS as soon as one measured peer beats loopwire, whichever
others are missing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from bench.common import table

P50_X_FLOOR_MAX = 1.6
CPU_X_FLOOR_MAX = 2.5
MSGS_PER_STEP_MAX = 8.0
PEERS = ("langgraph", "dbos", "restate")
LOOPWIRE = ("loopwire", "loopwire-r3")
MET, MISS = "MET", "MISS"


@dataclass(frozen=True)
class TargetRow:
    target: str
    loopwire: str
    compared: str
    ratio: str
    verdict: str  # MET, MISS or "not measured (<why>)"


# --- what the run measured -----------------------------------------------------------------------


def measurements(ctx: dict[str, Any]) -> dict[str, Any]:
    """The figures the targets need, from the results the scenarios left in ``ctx``."""
    m: dict[str, Any] = {}
    floor = ctx.get("floor")
    if floor:
        conc = floor["concurrent"]
        m["floor"] = {
            "loops": conc.extra.get("loops"),
            "cpu_us_per_step": sum(conc.extra.get("cpu_us_per_step", {}).values()),
            "traffic": conc.extra.get("traffic"),
        }
    step = ctx.get("step")
    if step is not None:
        m["step"] = {
            "loopwire": step.extra.get("p50_median_ms"),
            "floor": step.extra.get("floor_p50_ms"),
            "ratio": step.extra.get("p50_x_floor"),
            "rounds": step.extra.get("rounds"),
        }
    if ctx.get("cpu_pairs"):
        from bench.scenarios import cpu_pairs_summary

        pairs = cpu_pairs_summary(ctx["cpu_pairs"])
        m["cpu_pairs"] = {k: pairs[k] for k in ("rounds", "floor", "loopwire", "ratio")}
    tp = next((r for r in ctx.get("throughput") or [] if r.extra["loops"] == 64 and r.extra["replicas"] == 1), None)
    if tp is not None:
        m["throughput"] = {
            "loops": 64,
            "cpu_us_per_step": sum(tp.extra.get("cpu_us_per_step", {}).values()),
            "traffic": tp.extra.get("traffic"),
        }
    if "peers_rows" in ctx:
        systems: dict[str, dict[str, Any]] = {}
        for r in ctx["peers_rows"]:
            s = systems.setdefault(r.system, {})
            mode = r.extra.get("mode")
            if mode == "sequential":
                s["seq_steps_per_s"] = r.steps_per_s
            elif mode == "concurrent":
                s["conc_steps_per_s"] = r.steps_per_s
                if "cpu_us_per_step" in r.extra:
                    s["cpu_us_per_step"] = r.extra["cpu_us_per_step"]
            elif mode == "resume":
                s["resume_s"] = r.seconds
                for k in ("lease_ttl_s", "lease_ttl_default_s"):
                    if k in r.extra:
                        s[k] = r.extra[k]
        not_run = {k: f"skipped: {v}" for k, v in (ctx.get("peers_skipped") or {}).items()}
        not_run.update({k: f"blocked: {v}" for k, v in (ctx.get("peers_blocked") or {}).items()})
        m["peers"] = {"systems": systems, "not_run": not_run, "requested": list(ctx.get("peers_systems") or [])}
    return m


# --- the targets ---------------------------------------------------------------------------------


def _num(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f} ×" if b else ""


def _not_measured(why: str) -> str:
    return f"not measured ({why})"


def _peer_reason(m: dict[str, Any], system: str, key: str) -> str | None:
    """Why ``system``'s figure ``key`` is absent from the run (None if it was measured)."""
    peers = m.get("peers")
    if peers is None:
        return "peers not run"
    if key in peers["systems"].get(system, {}):
        return None
    if system in peers["not_run"]:  # "skipped: <why>" / "blocked: <why>"; the why is in the peers table
        return f"{system} {peers['not_run'][system].split(':', 1)[0]}"
    if system not in peers["requested"]:
        return f"{system} not in --peers"
    return f"{system}: no {key} figure"


def _alternating(name: str, rounds: dict[str, Any] | None, unit: str, limit: float, scenario: str) -> TargetRow:
    """A target against the floor judged on alternating rounds: the median of the rounds' ratios.
    ``rounds``: ``rounds`` (how many), ``loopwire`` and ``floor`` (each side's median), ``ratio``."""
    if not rounds or not rounds.get("rounds"):
        return TargetRow(name, "", "", "", _not_measured(f"{scenario} not run"))
    return TargetRow(
        name,
        f"{_num(rounds['loopwire'])} {unit}",
        f"floor {_num(rounds['floor'])} {unit} (medians of {rounds['rounds']} alternating runs)",
        f"{rounds['ratio']:.2f} ×",
        MET if rounds["ratio"] <= limit else MISS,
    )


def _vs_peers(name: str, m: dict[str, Any], system: str, key: str, unit: str, higher_wins: bool) -> TargetRow:
    """``system``'s figure ``key`` against every peer's: MET if strictly better than all of them."""
    why = _peer_reason(m, system, key)
    if why is not None:
        return TargetRow(name, "", "", "", _not_measured(why))
    systems = m["peers"]["systems"]
    mine = systems[system][key]
    measured = {p: systems[p][key] for p in PEERS if _peer_reason(m, p, key) is None}
    missing = [r for p in PEERS if (r := _peer_reason(m, p, key)) is not None]
    fig = f"{system} {_num(mine)} {unit}"
    if not measured:
        return TargetRow(name, fig, "", "", _not_measured("; ".join(missing)))
    pick = max if higher_wins else min
    best = pick(measured, key=lambda p: measured[p])
    compared = f"best peer {best} {_num(measured[best])} {unit}"
    if missing:
        compared += " (others: " + "; ".join(missing) + ")"
    ratio = _ratio(mine, measured[best])
    if not (mine > measured[best] if higher_wins else mine < measured[best]):
        return TargetRow(name, fig, compared, ratio, MISS)
    if missing:
        return TargetRow(name, fig, compared, ratio, _not_measured("not every peer measured"))
    return TargetRow(name, fig, compared, ratio, MET)


def _cpu_vs_restate(m: dict[str, Any]) -> TargetRow:
    name = "CPU µs/step (peers many-loop run, all processes) below Restate's"
    for system in ("loopwire", "restate"):
        why = _peer_reason(m, system, "cpu_us_per_step")
        if why is not None:
            return TargetRow(name, "", "", "", _not_measured(why))
    systems = m["peers"]["systems"]
    a, b = systems["loopwire"]["cpu_us_per_step"], systems["restate"]["cpu_us_per_step"]
    return TargetRow(name, f"{_num(a)} µs", f"restate {_num(b)} µs", _ratio(a, b), MET if a < b else MISS)


def _resume(m: dict[str, Any]) -> TargetRow:
    name = "resume after SIGKILL of the model-step faster than every peer (default settings)"
    lw = (m.get("peers") or {}).get("systems", {}).get("loopwire", {})
    if "resume_s" in lw and lw.get("lease_ttl_s") != lw.get("lease_ttl_default_s"):
        return TargetRow(
            name,
            f"loopwire {_num(lw['resume_s'])} s",
            "",
            "",
            _not_measured(f"lease TTL {lw.get('lease_ttl_s')} s, not the default {lw.get('lease_ttl_default_s')} s"),
        )
    return _vs_peers(name, m, "loopwire", "resume_s", "s", higher_wins=False)


def _messages(m: dict[str, Any]) -> TargetRow:
    name = f"messages into nats-server per committed step (64 loops, R1) ≤ {MSGS_PER_STEP_MAX:g}"
    for scenario in ("throughput", "floor"):
        if not (m.get(scenario) or {}).get("traffic"):
            return TargetRow(name, "", "", "", _not_measured(f"{scenario} not run"))
    a, b = m["throughput"]["traffic"], m["floor"]["traffic"]
    return TargetRow(
        name,
        f"{_num(a['in_msgs'])} in ({_num(a['out_msgs'])} out)",
        f"floor {_num(b['in_msgs'])} in ({_num(b['out_msgs'])} out)",
        _ratio(a["in_msgs"], b["in_msgs"]),
        MET if a["in_msgs"] <= MSGS_PER_STEP_MAX else MISS,
    )


def evaluate(m: dict[str, Any]) -> list[TargetRow]:
    """One row per target, from :func:`measurements` of one run."""
    rows = [
        _alternating(
            f"single-loop step p50 ≤ {P50_X_FLOOR_MAX:g} × floor", m.get("step"), "ms", P50_X_FLOOR_MAX, "step"
        ),
        _alternating(
            f"CPU µs/step (64 loops, all processes) ≤ {CPU_X_FLOOR_MAX:g} × floor",
            m.get("cpu_pairs"),
            "µs",
            CPU_X_FLOOR_MAX,
            "throughput",
        ),
        _cpu_vs_restate(m),
    ]
    for system in LOOPWIRE:
        for key, label in (("seq_steps_per_s", "1 loop"), ("conc_steps_per_s", "many loops")):
            rows.append(
                _vs_peers(
                    f"{system} steps/s ahead of every peer ({label})", m, system, key, "steps/s", higher_wins=True
                )
            )
    rows.append(_resume(m))
    rows.append(_messages(m))
    return rows


def render(rows: Sequence[TargetRow]) -> str:
    return table(
        "targets, measured in this run",
        ["target", "loopwire", "compared with", "ratio", "verdict"],
        [[r.target, r.loopwire, r.compared, r.ratio, r.verdict] for r in rows],
    )
