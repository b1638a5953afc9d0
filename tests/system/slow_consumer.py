"""A deliberately slow consumer of everything: ``python -m tests.system.slow_consumer``.

Follows every live event (``<prefix>.live.>``) and every history record, as a core subscriber of
``<prefix>.hist.>`` and as an ordered JetStream consumer of the history stream, and handles each
message with a *blocking* sleep (``LW_SLOW_SECONDS``, default 0.05 s): the whole process stalls, its
socket is not read, so the server sees a real slow TCP client. It prints READY once subscribed, writes
how many messages it handled to ``LW_SLOW_STATUS`` (every 10) and ends at once on SIGTERM.
Used by test_backpressure to show the services do not wait for such a reader.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time

from nats.aio.msg import Msg
from nats.js import api

from shared.connect import connect
from shared.settings import Settings


async def main() -> None:
    settings = Settings.from_env()
    delay = float(os.environ.get("LW_SLOW_SECONDS", "0.05"))
    n = settings.names

    async def on_error(e: Exception) -> None:
        pass  # slow-consumer and reconnect errors are expected here

    status = os.environ.get("LW_SLOW_STATUS", "")
    handled = 0

    def slow(_: Msg) -> None:
        nonlocal handled
        handled += 1
        if status and handled % 10 == 0:  # how far it got, for the test to compare with what was sent
            with open(status, "w") as f:
                f.write(str(handled))
        time.sleep(delay)  # blocks the event loop on purpose: nothing is read from the socket meanwhile

    async def cb(m: Msg) -> None:
        slow(m)

    nc = await connect(settings, name="slow-consumer", error_cb=on_error)
    await nc.subscribe(n.live_all, cb=cb)
    await nc.subscribe(n.hist_all, cb=cb)
    js = nc.jetstream()
    await js.subscribe(
        n.hist_all,
        stream=n.history_stream,
        ordered_consumer=True,
        cb=cb,
        config=api.ConsumerConfig(deliver_policy=api.DeliverPolicy.ALL),
    )
    await nc.flush()
    print("READY", flush=True)
    await asyncio.Event().wait()  # until SIGTERM (its default action ends the process mid-sleep)


if __name__ == "__main__":
    asyncio.run(main())
    sys.exit(0)
