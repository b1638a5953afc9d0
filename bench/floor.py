"""The floor: the raw message pattern of one tool step with nats-py alone.

One step = a request/reply to a trivial *tool responder* (answers "391") + a request/reply to a
trivial *commit responder* that does one CAS JetStream publish (``Nats-Expected-Last-Subject-Sequence``
+ ``Nats-Msg-Id``, the same record size as a loopwire StepDone) and answers the new sequence.
Both responders are separate processes (``python -m bench.floor serve tool|commit``), like
loopwire's tool worker and committer; the loops run in the benchmark process, like a model-step.
No validation, no live events, no leases, no history reads: what is left is the transport.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

import nats
from nats.aio.msg import Msg
from nats.js import api

from bench.common import Row, pct
from bench.workload import ARGS, TOOL_RESULT

PREFIX: Final = "floor"
STREAM: Final = "FLOOR_HISTORY"
TOOL_SUBJECT: Final = f"{PREFIX}.tool.calculator"
COMMIT_SUBJECT: Final = f"{PREFIX}.commit"
HIST: Final = f"{PREFIX}.hist"
H_EXPECTED: Final = "Nats-Expected-Last-Subject-Sequence"
H_MSG_ID: Final = "Nats-Msg-Id"
H_LOOP: Final = "Floor-Loop"
H_EXPECT: Final = "Floor-Expected"
TIMEOUT: Final = 10.0


def step_record() -> bytes:
    """A real StepDone envelope of the workload (same size as what loopwire stores per step)."""
    import msgspec

    from shared.codec import encode_event
    from shared.content import AIMessage, TextBlock, ToolUseBlock, Usage, tool_result
    from shared.events import StepDone, make

    ai = AIMessage(
        blocks=[
            TextBlock(text="Computing step 0."),
            ToolUseBlock(id="call_0", name="calculator", input=msgspec.Raw(ARGS.encode())),
        ],
        usage=Usage(input_tokens=20, output_tokens=10),
    )
    e = make(
        StepDone,
        loop_id=str(uuid.uuid4()),
        turn_id=str(uuid.uuid4()),
        step_id=str(uuid.uuid4()),
        messages=[ai, tool_result("call_0", TOOL_RESULT)],
    )
    return encode_event(e)


# --- responders (own processes) -----------------------------------------------------------------


async def _serve(kind: str, url: str, replicas: int) -> None:
    nc = await nats.connect(url.split(","), name=f"floor-{kind}")
    tasks: set[asyncio.Task[None]] = set()
    if kind == "tool":

        async def on_tool(msg: Msg) -> None:
            await msg.respond(TOOL_RESULT.encode())  # trivial: answer inline

        await nc.subscribe(TOOL_SUBJECT, queue="tool", cb=on_tool)
    else:
        js = nc.jetstream(timeout=TIMEOUT)
        cfg = api.StreamConfig(
            name=STREAM,
            subjects=[f"{HIST}.>"],
            storage=api.StorageType.FILE,
            num_replicas=replicas,
            allow_direct=True,
            duplicate_window=120.0,
        )
        for _ in range(60):
            try:
                await js.add_stream(cfg)
                break
            except Exception:
                await asyncio.sleep(0.5)
        # A new R3 stream may still be electing its leader: READY only once it takes a publish, so
        # the driver's first commits do not wait out the election (and their timeout).
        for _ in range(60):
            try:
                await js.publish(f"{HIST}.ready", b"", timeout=2.0)
                break
            except Exception:
                await asyncio.sleep(0.5)

        async def commit(msg: Msg) -> None:
            h = msg.headers or {}
            loop = h[H_LOOP]
            ack = await js.publish(
                f"{HIST}.{loop}",
                msg.data,
                headers={H_EXPECTED: h[H_EXPECT], H_MSG_ID: uuid.uuid4().hex},
                timeout=TIMEOUT,
            )
            await msg.respond(str(ack.seq).encode())

        async def on_commit(msg: Msg) -> None:
            # nats-py runs callbacks one at a time: spawn so 64 loops can commit at once.
            t = asyncio.create_task(commit(msg))
            tasks.add(t)
            t.add_done_callback(tasks.discard)

        await nc.subscribe(COMMIT_SUBJECT, queue="commit", cb=on_commit)
    await nc.flush()
    print("READY", flush=True)
    await asyncio.Event().wait()


# --- the driver (benchmark process) --------------------------------------------------------------


@dataclass
class FloorRun:
    loops: int
    steps: int
    latencies: list[float]
    seconds: float


async def run_floor(
    url: str,
    loops: int,
    steps: int,
    record: bytes,
    *,
    warmup: int = 50,
    on_start: Callable[[], None] | None = None,
    on_end: Callable[[], None] | None = None,
) -> FloorRun:
    """Run ``loops`` loops of ``steps`` steps after a warm-up; ``on_start``/``on_end`` bracket the measured part."""
    nc = await nats.connect(url.split(","), name="floor-driver")
    latencies: list[float] = []
    payload = ARGS.encode()

    async def one_loop(n: int, keep: bool) -> None:
        loop = uuid.uuid4().hex
        last = 0
        for _ in range(n):
            t = time.perf_counter()
            r = await nc.request(TOOL_SUBJECT, payload, timeout=TIMEOUT)
            assert r.data == TOOL_RESULT.encode()
            c = await nc.request(COMMIT_SUBJECT, record, timeout=TIMEOUT, headers={H_LOOP: loop, H_EXPECT: str(last)})
            last = int(c.data)
            if keep:
                latencies.append(time.perf_counter() - t)

    try:
        await asyncio.gather(*(one_loop(warmup, False) for _ in range(min(loops, 8))))
        if on_start is not None:
            on_start()
        t0 = time.perf_counter()
        await asyncio.gather(*(one_loop(steps, True) for _ in range(loops)))
        seconds = time.perf_counter() - t0
        if on_end is not None:
            on_end()
    finally:
        await nc.close()
    return FloorRun(loops, steps, latencies, seconds)


def floor_rows(runs: list[FloorRun], config: str) -> list[Row]:
    rows = []
    for r in runs:
        rows.append(
            Row.from_latencies(
                "floor",
                "nats-py floor",
                f"{config}, {r.loops} loop(s)",
                r.latencies,
                r.seconds,
                durability="JetStream file store (as loopwire)",
                loops=r.loops,
                steps_per_loop=r.steps,
            )
        )
    return rows


def describe(r: FloorRun) -> dict[str, Any]:
    return {
        "loops": r.loops,
        "steps": len(r.latencies),
        "p50_ms": pct(r.latencies, 0.5) * 1000,
        "p99_ms": pct(r.latencies, 0.99) * 1000,
        "steps_per_s": len(r.latencies) / r.seconds,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.floor")
    p.add_argument("mode", choices=("serve",))
    p.add_argument("kind", choices=("tool", "commit"))
    p.add_argument("--url", required=True)
    p.add_argument("--replicas", type=int, default=1)
    args = p.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(args.kind, args.url, args.replicas))
    return 0


if __name__ == "__main__":
    sys.exit(main())
