"""One turn of a new loop, then its history: LW_NATS_URL=nats://... python examples/one_loop.py PROMPT"""

import asyncio
import sys

from loopwire import LoopClient, Settings, connect, read_deployment, replay, wait_for_turn


async def main(prompt: str) -> None:
    settings = Settings.from_env()  # LW_NATS_URL, LW_PREFIX, credentials
    nc = await connect(settings, name="one-loop")
    settings = await read_deployment(nc, settings)  # the deployment's shard count
    client = LoopClient(nc, settings.names)
    loop = await client.start()  # a new loop, on the committer's default model (LW_MODEL)
    sent = await client.input(loop.loop_id, prompt)
    # Follows the history (replay with follow=True) until the turn this input started ends.
    turn = await wait_for_turn(nc, settings.names, loop.loop_id, sent.command_id, sent.seq)
    print(turn.outcome, turn.answer)
    async for seq, event in replay(nc, loop.loop_id, settings=settings):  # the committed history, in order
        print(seq, type(event).__name__)
    await nc.close()


try:
    asyncio.run(main(sys.argv[1]))
except KeyboardInterrupt:  # Ctrl-C: stop without a traceback
    raise SystemExit(130) from None
