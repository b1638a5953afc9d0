"""A loop with a budget: LW_NATS_URL=nats://... python examples/budget_loop.py PROMPT"""

import asyncio
import sys

from loopwire import Budget, LoopClient, Settings, TurnFailed, connect, load, read_deployment, wait_for_turn


async def main(prompt: str) -> None:
    settings = Settings.from_env()
    nc = await connect(settings, name="budget-loop")
    settings = await read_deployment(nc, settings)  # the deployment's shard count
    client = LoopClient(nc, settings.names)
    # One model step a turn and a cent for the whole loop; a spent budget fails the turn.
    loop = await client.start(model="demo", budget=Budget(max_steps_per_turn=1, max_cost_usd=0.01))
    for steps in (1, 4):
        if steps > 1:  # the budget command: from the next step on
            await client.budget(loop.loop_id, Budget(max_steps_per_turn=steps, max_cost_usd=0.01))
        sent = await client.input(loop.loop_id, prompt)
        turn = await wait_for_turn(nc, settings.names, loop.loop_id, sent.command_id, sent.seq)
        failed = turn.event.err if isinstance(turn.event, TurnFailed) else None
        print(turn.outcome, f"{failed.kind}: {failed.message}" if failed else turn.answer)
    h = await load(nc, settings.names, loop.loop_id)  # the fold: cost recorded per step
    print(f"cost ${h.cost_micro_usd / 1_000_000:.6f}, budget {h.budget.max_steps_per_turn} steps a turn")
    await nc.close()


try:
    asyncio.run(main(sys.argv[1]))
except KeyboardInterrupt:  # Ctrl-C: stop without a traceback
    raise SystemExit(130) from None
