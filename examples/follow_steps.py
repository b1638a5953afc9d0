"""Follow every loop's committed StepDone events: LW_NATS_URL=nats://... python examples/follow_steps.py"""

import asyncio

from loopwire import AIMessage, Record, Settings, StepDone, connect, follow_all, read_deployment, text_of, tool_uses


async def main() -> None:
    settings = Settings.from_env()  # LW_NATS_URL, LW_PREFIX, credentials (a read-only user is enough)
    nc = await connect(settings, name="follow-steps")
    settings = await read_deployment(nc, settings)  # the deployment's shard count

    async def on_record(record: Record) -> None:  # every loop's committed records, in order per loop
        event = record.event()  # strict decode and validation
        if isinstance(event, StepDone) and isinstance(ai := event.messages[0], AIMessage):
            calls = [u.name for u in tool_uses(ai)]
            print(f"{event.loop_id} {event.step_id[:8]} {text_of(ai)!r} calls={calls}", flush=True)

    # One ordered consumer per shard's history stream; from_seq=None: from now on (1 replays everything).
    async with await follow_all(nc, settings.names, on_record, from_seq=None):
        await asyncio.Event().wait()


try:
    asyncio.run(main())
except KeyboardInterrupt:  # Ctrl-C: stop without a traceback
    raise SystemExit(130) from None
