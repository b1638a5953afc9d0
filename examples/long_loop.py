"""A loop kept within a small context window: LW_NATS_URL=nats://... python examples/long_loop.py"""

import asyncio

from loopwire import ContextPolicy, LoopClient, Settings, connect, load, read_deployment, wait_for_turn


async def main() -> None:
    settings = Settings.from_env()
    nc = await connect(settings, name="long-loop")
    settings = await read_deployment(nc, settings)  # the deployment's shard count
    client = LoopClient(nc, settings.names)
    # A 1,024-token window: once a request would not fit, the model summarises the older messages.
    context = ContextPolicy(strategy="compact", window=1024)
    loop = await client.start(model="demo", tools=["calculator"], context=context)
    for n in range(1, 13):
        sent = await client.input(loop.loop_id, f"what is {n}*{n + 10}")
        turn = await wait_for_turn(nc, settings.names, loop.loop_id, sent.command_id, sent.seq)
        print(turn.outcome, turn.answer.splitlines()[-1])
    h = await load(nc, settings.names, loop.loop_id)  # every message is kept; requests send the summary
    upto = h.compaction.upto if h.compaction else 0
    print(f"{len(h.messages)} messages in the history, the first {upto} summarised, {len(h.model_messages)} sent")
    await nc.close()


try:
    asyncio.run(main())
except KeyboardInterrupt:  # Ctrl-C: stop without a traceback
    raise SystemExit(130) from None
