"""LangGraph with its Postgres checkpointer (``langgraph-checkpoint-postgres``), the workload as a graph.

Graph: ``model`` (the instant model: an AIMessage with one tool call, or the final answer) →
``tools`` (the calculator, a ToolMessage) → ``model`` ..., state = ``MessagesState`` (the
``add_messages`` reducer every LangGraph agent uses). Checkpointer: ``AsyncPostgresSaver`` on a
connection pool; durability: LangGraph's default (``"async"``: the checkpoint of a super-step is
written while the next one runs). One process runs all loops of a run concurrently (asyncio).
A crashed run resumes with ``astream(None, config)`` from the last checkpoint.

Worker: ``python -m bench.peers.langgraph_peer --dsn DSN --loops N --steps S --prefix P [--resume]``.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

from bench.peers.proto import emit, now
from bench.workload import USER_TEXT, instant_model, instant_tool

TABLES = ["checkpoints", "checkpoint_blobs", "checkpoint_writes", "checkpoint_migrations"]


def build_graph() -> Any:
    from langchain_core.messages import AIMessage, ToolMessage
    from langgraph.graph import END, START, MessagesState, StateGraph

    def model(state, config):  # type: ignore[no-untyped-def]  (LangGraph reads node annotations at run time)
        k = sum(1 for m in state["messages"] if isinstance(m, AIMessage))
        r = instant_model(k, int(config["configurable"]["steps"]))
        calls = (
            [{"id": r["tool_call"]["id"], "name": r["tool_call"]["name"], "args": r["tool_call"]["args"]}]
            if "tool_call" in r
            else []
        )
        return {"messages": [AIMessage(content=r["text"], tool_calls=calls)]}

    def tools(state):  # type: ignore[no-untyped-def]
        last = state["messages"][-1]
        out = [
            ToolMessage(content=instant_tool(c["args"]), tool_call_id=c["id"], name=c["name"])
            for c in last.tool_calls  # type: ignore[attr-defined]
        ]
        return {"messages": out}

    def route(state):  # type: ignore[no-untyped-def]
        last = state["messages"][-1]
        return "tools" if getattr(last, "tool_calls", None) else END

    g = StateGraph(MessagesState)
    g.add_node("model", model)
    g.add_node("tools", tools)
    g.add_edge(START, "model")
    g.add_conditional_edges("model", route, ["tools", END])
    g.add_edge("tools", "model")
    return g


async def worker(dsn: str, loops: int, steps: int, prefix: str, resume: bool) -> None:
    from langchain_core.messages import HumanMessage
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
    from psycopg.rows import dict_row
    from psycopg_pool import AsyncConnectionPool

    async with AsyncConnectionPool(
        dsn,
        min_size=1,
        max_size=max(2, min(loops, 32)),
        kwargs={"autocommit": True, "row_factory": dict_row, "prepare_threshold": 0},
        open=False,
    ) as pool:
        saver = AsyncPostgresSaver(pool)  # type: ignore[arg-type]
        await saver.setup()
        graph = build_graph().compile(checkpointer=saver)
        emit("READY")

        async def one(i: int, prefix: str = prefix, steps: int = steps) -> None:
            loop = f"{prefix}-{i}"
            config = {"configurable": {"thread_id": loop, "steps": steps}, "recursion_limit": 2 * steps + 10}
            inp = None if resume else {"messages": [HumanMessage(content=USER_TEXT)]}
            k = 0
            if resume:
                state = await graph.aget_state(config)
                k = sum(1 for m in state.values.get("messages", []) if m.type == "tool")
            async for update in graph.astream(inp, config, stream_mode="updates"):
                if "tools" in update:
                    emit("STEP", loop, k, now())
                    k += 1
            emit("DONE", loop, now())

        if not resume:  # warm the pool, the prepared statements and the code paths
            await asyncio.gather(*(one(i, prefix=f"warm{prefix}", steps=5) for i in range(min(loops, 4))))
        emit("BEGIN", now())
        await asyncio.gather(*(one(i) for i in range(loops)))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.peers.langgraph_peer")
    p.add_argument("--dsn", required=True)
    p.add_argument("--loops", type=int, default=1)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--prefix", default="lg")
    p.add_argument("--resume", action="store_true")
    a = p.parse_args(argv)
    asyncio.run(worker(a.dsn, a.loops, a.steps, a.prefix, a.resume))
    return 0


if __name__ == "__main__":
    sys.exit(main())
