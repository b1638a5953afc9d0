"""Follow every loop's committed StepDone events: LW_NATS_URL=nats://... python examples/follow_steps.py"""

import asyncio

from nats.js.api import ConsumerConfig, DeliverPolicy

from loopwire import AIMessage, Settings, StepDone, connect, decode_event, text_of, tool_uses


async def main() -> None:
    settings = Settings.from_env()  # LW_NATS_URL, LW_PREFIX, credentials (a read-only user is enough)
    n = settings.names
    nc = await connect(settings, name="follow-steps")
    new = ConsumerConfig(deliver_policy=DeliverPolicy.NEW)  # from now on; DeliverPolicy.ALL replays everything
    sub = await nc.jetstream().subscribe(n.hist_all, stream=n.history_stream, ordered_consumer=True, config=new)
    async for msg in sub.messages:  # every loop's committed records, in stream order
        event = decode_event(msg.data)  # strict decode and validation
        if isinstance(event, StepDone) and isinstance(ai := event.messages[0], AIMessage):
            calls = [u.name for u in tool_uses(ai)]
            print(f"{event.loop_id} {event.step_id[:8]} {text_of(ai)!r} calls={calls}", flush=True)


try:
    asyncio.run(main())
except KeyboardInterrupt:  # Ctrl-C: stop without a traceback
    raise SystemExit(130) from None
