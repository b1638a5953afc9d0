"""Commit latency and throughput through the committer, next to the raw JetStream floor.

    python -m bench.commit_latency [--cluster] [--committers N] [--ops N] [--concurrent-ops N]

Starts its own nats-server (or a 3-node cluster with ``--cluster``, R3 streams) and N committer
processes, then measures, for 1 loop (sequential appends) and 64 loops (one append in flight per
loop, all loops at once):

* ``raw``: ``js.publish``-equivalent with ``Nats-Expected-Last-Subject-Sequence`` + ``Nats-Msg-Id``
  straight to the stream (the floor: no validation, no extra hop);
* ``commit``: the same record through ``CommitClient.commit`` (request → committer → validate →
  CAS publish → reply).

Each append is a one-event commit of a ~0.5 KB StepDone. Prints p50 / p99 latency, appends/s and
the commit/raw ratios. Not a test: numbers depend on the machine (see docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import anyio

from services.deployment import Deployment, service_command
from shared.client import CommitClient
from shared.codec import encode_event
from shared.connect import connect
from shared.content import Usage, ai_text
from shared.events import LoopStarted, StepDone, make
from shared.natsserver import NatsCluster, NatsServer
from shared.publish import js_publish
from shared.settings import Settings
from shared.streams import ensure_all
from shared.subjects import H_EXPECTED_LAST_SUBJECT_SEQ, H_EXPECTED_STREAM, H_MSG_ID


@dataclass
class Result:
    name: str
    loops: int
    latencies: list[float]
    seconds: float

    @property
    def rate(self) -> float:
        return len(self.latencies) / self.seconds

    def pct(self, p: float) -> float:
        xs = sorted(self.latencies)
        return xs[min(len(xs) - 1, int(p * len(xs)))] * 1000


def _step(loop_id: str, turn_id: str) -> StepDone:
    text = "The answer is 391. " * 20  # ~0.5 KB record
    return make(
        StepDone,
        loop_id=loop_id,
        turn_id=turn_id,
        step_id=str(uuid.uuid4()),
        messages=[ai_text(text, Usage(input_tokens=120, output_tokens=30))],
    )


AppendFn = Callable[[str, int, StepDone], Awaitable[int]]


async def _run(name: str, loops: int, ops: int, start: Callable[[str], Awaitable[int]], append: AppendFn) -> Result:
    ids = [str(uuid.uuid4()) for _ in range(loops)]
    lasts = {lid: await start(lid) for lid in ids}
    latencies: list[float] = []

    async def one_loop(lid: str) -> None:
        turn = str(uuid.uuid4())
        last = lasts[lid]
        for _ in range(ops):
            e = _step(lid, turn)
            t = time.perf_counter()
            last = await append(lid, last, e)
            latencies.append(time.perf_counter() - t)

    t0 = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for lid in ids:
            tg.start_soon(one_loop, lid)
    return Result(name, loops, latencies, time.perf_counter() - t0)


async def bench(settings: Settings, ops: int, concurrent_ops: int) -> list[Result]:
    nc = await connect(settings, name="bench")
    names = settings.names
    await ensure_all(nc.jetstream(timeout=10), settings)
    client = CommitClient(nc, names, 30)

    async def raw_start(lid: str) -> int:
        data = encode_event(make(LoopStarted, loop_id=lid, model="demo"))
        return await raw_append_bytes(lid, 0, data, str(uuid.uuid4()))

    async def raw_append_bytes(lid: str, last: int, data: bytes, msg_id: str) -> int:
        h = {H_EXPECTED_LAST_SUBJECT_SEQ: str(last), H_MSG_ID: msg_id, H_EXPECTED_STREAM: names.history_stream}
        return (await js_publish(nc, names.hist(lid), data, h, request_timeout=10)).seq

    async def raw_append(lid: str, last: int, e: StepDone) -> int:
        # Encoding is part of what any writer pays; validation and the extra hop are the committer's.
        return await raw_append_bytes(lid, last, encode_event(e), e.event_id)

    async def commit_start(lid: str) -> int:
        return (await client.commit(lid, 0, [make(LoopStarted, loop_id=lid, model="demo")])).last_seq

    async def commit_append(lid: str, last: int, e: StepDone) -> int:
        return (await client.commit(lid, last, [e])).last_seq

    results = []
    try:
        # warm-up (connections, first stream writes, code paths)
        await _run("warmup", 4, 50, raw_start, raw_append)
        await _run("warmup", 4, 50, commit_start, commit_append)
        for loops, n in ((1, ops), (64, concurrent_ops)):
            results.append(await _run("raw", loops, n, raw_start, raw_append))
            results.append(await _run("commit", loops, n, commit_start, commit_append))
    finally:
        await nc.close()
    return results


def report(results: list[Result], title: str) -> str:
    lines = [
        title,
        f"{'path':<8} {'loops':>5} {'appends':>8} {'p50 ms':>8} {'p99 ms':>8} {'appends/s':>10} "
        f"{'p50 x raw':>10} {'rate / raw':>11}",
    ]
    raw = {r.loops: r for r in results if r.name == "raw"}
    for r in results:
        base = raw[r.loops]
        lines.append(
            f"{r.name:<8} {r.loops:>5} {len(r.latencies):>8} {r.pct(0.5):>8.3f} {r.pct(0.99):>8.3f} "
            f"{r.rate:>10.0f} {r.pct(0.5) / base.pct(0.5):>10.2f} {r.rate / base.rate:>11.2f}"
        )
    mean = {r.loops: statistics.fmean(r.latencies) * 1000 for r in results if r.name == "commit"}
    lines.append("commit mean ms: " + ", ".join(f"{k} loop(s) {v:.3f}" for k, v in mean.items()))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.commit_latency", description=__doc__.split("\n\n")[0])
    p.add_argument("--cluster", action="store_true", help="3-node cluster with R3 streams (default: one server, R1)")
    p.add_argument("--committers", type=int, default=1, help="committer processes (default 1)")
    p.add_argument("--ops", type=int, default=2000, help="appends of the single loop (default 2000)")
    p.add_argument("--concurrent-ops", type=int, default=100, help="appends per loop with 64 loops (default 100)")
    args = p.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="lw-bench-"))
    cluster: NatsCluster | None = None
    server: NatsServer | None = None
    if args.cluster:
        cluster = NatsCluster(base_dir=str(work / "nats")).start()
        urls, replicas = cluster.urls, 3
    else:
        server = NatsServer(store_dir=str(work / "nats")).start()
        urls, replicas = [server.url], 1
    settings = Settings.from_env({}, nats_urls=tuple(urls), prefix="bench", replicas=replicas)
    committers = Deployment.for_settings(settings, work, log_level="WARNING")
    try:
        for _ in range(args.committers):
            committers.start("committer", service_command("committer"), timeout=60)
        results = anyio.run(bench, settings, args.ops, args.concurrent_ops)
        kind = "3-node cluster, R3" if args.cluster else "single server, R1 (file storage)"
        print(report(results, f"commit latency: {kind}, {args.committers} committer process(es)"))
    finally:
        committers.stop_all()
        if cluster is not None:
            cluster.cleanup()
        if server is not None:
            server.cleanup()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
