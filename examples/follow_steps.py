"""Follow every loop's committed StepDone events: LW_NATS_URL=nats://... python examples/follow_steps.py"""

import asyncio
import sys

from loopwire import AIMessage, Follower, Record, Settings, StepDone, connect, follow_all, text_of, tool_uses


async def main() -> None:
    settings = Settings.from_env()  # LW_NATS_URL, LW_PREFIX, credentials (a read-only user is enough)
    nc = await connect(settings, name="follow-steps")

    async def on_record(record: Record) -> None:  # every loop's committed records, in order per loop
        event = record.event()  # strict decode and validation
        if isinstance(event, StepDone) and isinstance(ai := event.messages[0], AIMessage):
            calls = [u.name for u in tool_uses(ai)]
            print(f"{event.loop_id} {event.step_id[:8]} {text_of(ai)!r} calls={calls}", flush=True)

    async def on_resume(follower: Follower) -> None:  # the connection was lost and is back (a NATS restart)
        print(f"NATS connection back: following on after {follower.positions}", file=sys.stderr)

    async with await follow_all(nc, settings.names, on_record, from_seq=None, on_resume=on_resume):
        await asyncio.Event().wait()  # one ordered consumer per shard's stream, from now on (from_seq=1: all)


try:
    asyncio.run(main())
except KeyboardInterrupt:  # Ctrl-C: stop without a traceback
    raise SystemExit(130) from None
