"""The replay scenario's measurements: loops of up to 10,000 steps built through the committer and
read back whole, and commit latency on a short loop against the longest one."""

from __future__ import annotations

import time
import uuid
from typing import Any

import msgspec

from bench.common import Row, pct, table
from bench.lw import BIG_LIMITS, Deployment
from bench.workload import ARGS, TOOL_RESULT, USER_TEXT


def replay_rows(out: dict[str, Any], lengths: list[int]) -> list[Row]:
    rows: list[Row] = []
    for n, r in out["replay"].items():
        rows.append(
            Row(
                scenario="replay",
                system="loopwire",
                config=f"{n:,}-step loop",
                steps=n,
                seconds=round(r["load_s"], 4),
                extra=r,
            )
        )
    c = out["commit"]
    rows.append(
        Row.from_latencies(
            "replay",
            "loopwire",
            "commit latency at step 10",
            c["short"],
            sum(c["short"]),
            durability="JetStream R1 file store",
        )
    )
    rows.append(
        Row.from_latencies(
            "replay",
            "loopwire",
            f"commit latency at step {lengths[-1]:,}",
            c["long"],
            sum(c["long"]),
            durability="JetStream R1 file store",
        )
    )
    return rows


def replay_tables(out: dict[str, Any], lengths: list[int]) -> list[str]:
    c = out["commit"]
    t = table(
        "replay: read a loop's whole history back (replay() = decode + validate; load() = replay + fold)",
        ["steps", "records", "replay s", "replay events/s", "load s", "load events/s", "bytes/step", "target"],
        [
            [
                n,
                r["records"],
                round(r["replay_s"], 4),
                round(r["replay_eps"]),
                round(r["load_s"], 4),
                round(r["load_eps"]),
                round(r["bytes_per_step"]),
                "≥ 20,000 ev/s",
            ]
            for n, r in out["replay"].items()
        ],
    )
    s50, l50 = pct(c["short"], 0.5) * 1000, pct(c["long"], 0.5) * 1000
    t2 = table(
        "commit latency vs history length (one-event commits through the committer, interleaved)",
        ["history", "commits", "p50 ms", "p99 ms", "mean ms", "target"],
        [
            ["10 steps", len(c["short"]), s50, pct(c["short"], 0.99) * 1000, _mean_ms(c["short"]), ""],
            [
                f"{lengths[-1]:,} steps",
                len(c["long"]),
                l50,
                pct(c["long"], 0.99) * 1000,
                _mean_ms(c["long"]),
                f"within 10% (p50 ratio {l50 / s50:.3f})",
            ],
        ],
    )
    return [t, t2]


def _mean_ms(xs: list[float]) -> float:
    return round(sum(xs) / len(xs) * 1000, 3) if xs else 0.0


def _step_events(loop_id: str, turn_id: str, k0: int, n: int) -> list[Any]:
    from shared.content import AIMessage, TextBlock, ToolUseBlock, Usage, tool_result
    from shared.events import StepDone, make

    out = []
    for k in range(k0, k0 + n):
        ai = AIMessage(
            blocks=[
                TextBlock(text=f"Computing step {k}."),
                ToolUseBlock(id=f"call_{k}", name="calculator", input=msgspec.Raw(ARGS.encode())),
            ],
            usage=Usage(input_tokens=20, output_tokens=10),
        )
        out.append(
            make(
                StepDone,
                loop_id=loop_id,
                turn_id=turn_id,
                step_id=str(uuid.uuid4()),
                messages=[ai, tool_result(f"call_{k}", TOOL_RESULT)],
            )
        )
    return out


async def _build_loop(client: Any, steps: int) -> tuple[str, str, int]:
    """A loop of ``steps`` StepDone records (as the model-step writes them), through the committer."""
    from shared.content import user_text
    from shared.events import Cause, InputSubmitted, LoopStarted, TurnStarted, make

    lid, tid, cmd = str(uuid.uuid4()), str(uuid.uuid4()), str(uuid.uuid4())
    head = [
        make(LoopStarted, loop_id=lid, model="scripted", limits=BIG_LIMITS, cause=Cause(command_id=str(uuid.uuid4()))),
        make(InputSubmitted, loop_id=lid, message=user_text(USER_TEXT), cause=Cause(command_id=cmd)),
    ]
    last = (await client.commit(lid, 0, head)).last_seq
    ts = make(
        TurnStarted, loop_id=lid, turn_id=tid, turn_index=1, message=user_text(USER_TEXT), cause=Cause(command_id=cmd)
    )
    last = (await client.commit(lid, last, [ts])).last_seq
    k = 0
    while k < steps:
        n = min(500, steps - k)
        last = (await client.commit(lid, last, _step_events(lid, tid, k, n))).last_seq
        k += n
    return lid, tid, last


async def measure_replay(d: Deployment, lengths: list[int], quick: bool) -> dict[str, Any]:
    """Read back loops of ``lengths`` steps; then commit latency at step 10 against the longest loop."""
    from shared.client import CommitClient
    from shared.replay import load, replay

    nc = await d.connect()
    names = d.settings.names
    client = CommitClient(nc, names, 60)
    results: dict[int, dict[str, Any]] = {}
    built: dict[int, tuple[str, str, int]] = {}
    js = nc.jetstream(timeout=10)
    for n in lengths:
        before = (await js.stream_info(names.history_stream)).state
        built[n] = await _build_loop(client, n)
        after = (await js.stream_info(names.history_stream)).state
        bytes_per_step = (after.bytes - before.bytes) / n
        lid = built[n][0]
        # warm (file cache, code paths) then measure
        [_ async for _ in replay(nc, lid, names=names)]
        t = time.perf_counter()
        count = 0
        async for _ in replay(nc, lid, names=names):
            count += 1
        rs = time.perf_counter() - t
        t = time.perf_counter()
        h = await load(nc, names, lid)
        ls = time.perf_counter() - t
        assert h.events == count and h.open_turn is not None and h.open_turn.steps == n
        results[n] = {
            "records": count,
            "replay_s": rs,
            "replay_eps": count / rs,
            "load_s": ls,
            "load_eps": count / ls,
            "bytes_per_step": bytes_per_step,
        }
    # Commit latency at step 10 vs the longest loop: alternate single-event commits on both.
    short = await _build_loop(client, 10)
    long_ = built[lengths[-1]]
    lat: dict[str, list[float]] = {"short": [], "long": []}
    lasts = {"short": short[2], "long": long_[2]}
    loops = {"short": short, "long": long_}
    rounds = 150 if quick else 400
    for i in range(rounds + 20):
        for key in ("short", "long") if i % 2 == 0 else ("long", "short"):
            lid, tid, _ = loops[key]
            e = _step_events(lid, tid, 0, 1)
            t = time.perf_counter()
            lasts[key] = (await client.commit(lid, lasts[key], e)).last_seq
            if i >= 20:  # warm-up rounds
                lat[key].append(time.perf_counter() - t)
    await d.close()
    return {"replay": results, "commit": lat}
