"""DBOS on Postgres: the workload as a durable workflow whose model and tool calls are steps.

``agent_loop`` (``@DBOS.workflow``, async) calls ``model`` (``@DBOS.step``: the instant model) and
``tool`` (``@DBOS.step``: the calculator) per step. DBOS's default durability: every step's output
is committed to the system database (Postgres, ``synchronous_commit`` as configured, on by default)
before the workflow goes on. Workflow ids are fixed (``SetWorkflowID``), so a crashed process's
workflows are recovered by the next ``DBOS.launch()`` (executor ``local``), which re-runs the
workflow function and skips recorded steps.

Worker: ``python -m bench.peers.dbos_peer --dsn DSN --loops N --steps S --prefix P [--resume]``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from typing import Any

from bench.peers.proto import emit, now
from bench.workload import instant_model, instant_tool

TABLES = [
    "dbos.workflow_status",
    "dbos.operation_outputs",
    "dbos.notifications",
    "dbos.workflow_events",
    "dbos.streams",
    "dbos.event_dispatch_kv",
    "dbos.workflow_schedules",
]


def setup(dsn: str) -> Any:
    from dbos import DBOS, DBOSConfig

    config: DBOSConfig = {
        "name": "lwbench",
        "system_database_url": dsn,
        "log_level": "WARNING",
        "console_log_level": "WARNING",
    }
    DBOS(config=config)

    @DBOS.step()
    async def model(k: int, steps: int) -> dict[str, Any]:
        return instant_model(k, steps)

    @DBOS.step()
    async def tool(args: dict[str, Any]) -> str:
        return instant_tool(args)

    @DBOS.workflow()
    async def agent_loop(loop: str, steps: int) -> str:
        k = 0
        while True:
            r = await model(k, steps)
            if "tool_call" not in r:
                emit("DONE", loop, now())
                return str(r["text"])
            await tool(r["tool_call"]["args"])
            emit("STEP", loop, k, now())  # a recovered run prints replayed steps again: the first time counts
            k += 1

    return DBOS, agent_loop


async def worker(dsn: str, loops: int, steps: int, prefix: str, resume: bool) -> None:
    from dbos import SetWorkflowID

    logging.getLogger("dbos").setLevel(logging.WARNING)
    dbos_cls, agent_loop = setup(dsn)
    dbos_cls.launch()  # recovers this executor's pending workflows (after a crash)
    emit("READY")
    if not resume:  # warm the connection pool and the code paths
        warm = []
        for i in range(min(loops, 4)):
            with SetWorkflowID(f"warm{prefix}-{i}"):
                warm.append(await dbos_cls.start_workflow_async(agent_loop, f"warm{prefix}-{i}", 5))
        await asyncio.gather(*(h.get_result() for h in warm))
    emit("BEGIN", now())
    handles = []
    for i in range(loops):
        wid = f"{prefix}-{i}"
        if resume:
            handles.append(await dbos_cls.retrieve_workflow_async(wid))
        else:
            with SetWorkflowID(wid):
                handles.append(await dbos_cls.start_workflow_async(agent_loop, wid, steps))
    await asyncio.gather(*(h.get_result() for h in handles))
    dbos_cls.destroy()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.peers.dbos_peer")
    p.add_argument("--dsn", required=True)
    p.add_argument("--loops", type=int, default=1)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--prefix", default="dbos")
    p.add_argument("--resume", action="store_true")
    a = p.parse_args(argv)
    asyncio.run(worker(a.dsn, a.loops, a.steps, a.prefix, a.resume))
    return 0


if __name__ == "__main__":
    sys.exit(main())
