"""The history commands: history (a loop's committed records) and tail (live and committed events as they come)."""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys

import anyio
import nats.errors
from nats.aio.msg import Msg
from rich.console import Console
from rich.table import Table
from rich.text import Text

from services.cli.errors import CliError
from services.cli.folds import fold_loop
from services.cli.ids import loop_ref, require_known_loop, resolve_loop
from services.cli.output import make_console, out
from services.cli.render import clock_of, describe, event_json, short
from services.cli.resume import reconnected, resumed_line, watch_connection
from services.cli.session import session
from shared.codec import decode_live_frame
from shared.errors import LoopwireError
from shared.events import Event, TokenDelta
from shared.follow import Follower, Record, follow_all
from shared.jserrors import JetStreamUnavailableError
from shared.replay import replay
from shared.settings import Settings
from shared.turns import follow


async def cmd_history(args: argparse.Namespace, settings: Settings) -> int:
    ref = loop_ref(args.loop, "LOOP")
    async with session(settings) as nc:
        loop_id = await resolve_loop(nc, settings, ref)
        records = [r async for r in replay(nc, loop_id, names=settings.names, from_seq=args.from_seq)]
    if not records and args.from_seq <= 1:
        raise CliError(f"loop {loop_id} has no history (unknown loop?)")
    if args.json:
        for seq, e in records:
            out(event_json(e, seq))
        return 0
    print_history(make_console(), records, title=f"history of loop {loop_id}")
    return 0


def print_history(console: Console, records: list[tuple[int, Event]], *, title: str = "") -> None:
    table = Table(title=title or None, show_lines=False, expand=False)
    table.add_column("seq", justify="right", style="dim")
    table.add_column("time", style="dim", no_wrap=True)
    table.add_column("event", style="bold", no_wrap=True)
    table.add_column("turn/step", style="dim", no_wrap=True)
    table.add_column("details", overflow="fold")
    for seq, e in records:
        where = "/".join(short(x) for x in (e.turn_id, e.step_id) if x)
        table.add_row(
            str(seq), clock_of(e.created_at), type(e).__name__, where, Text(describe(e, limit=240, multiline=True))
        )
    console.print(table)


async def cmd_tail(args: argparse.Namespace, settings: Settings) -> int:
    names = settings.names
    ref = loop_ref(args.loop, "LOOP") if args.loop else ""
    send, receive = anyio.create_memory_object_stream[tuple[int | None, Event]](4096)

    async def on_live(msg: Msg) -> None:
        with contextlib.suppress(LoopwireError, anyio.WouldBlock):
            for e in decode_live_frame(msg.data):
                send.send_nowait((None, e))

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    async with session(settings, follow=True) as nc:
        loop_id = await resolve_loop(nc, settings, ref) if ref else ""
        if loop_id:
            await require_known_loop(nc, settings, loop_id)  # else it would wait in silence for ever
        await nc.subscribe(names.live(loop_id) if loop_id else names.live_all, cb=on_live)

        async def follow_one() -> None:
            start = args.from_seq if args.from_seq is not None else 1
            if args.new:
                h, _ = await fold_loop(nc, names, loop_id)
                start = h.last_seq + 1

            async def pump() -> None:
                nonlocal start
                seen = nc.stats["reconnects"]
                while True:
                    try:
                        async with follow(nc, names, loop_id, start) as it:
                            async for seq, e in it:
                                start = seq + 1
                                await send.send((seq, e))
                    except (JetStreamUnavailableError, nats.errors.Error, TimeoutError):
                        if nc.is_connected and nc.stats["reconnects"] == seen:
                            raise  # not a connection that was lost: say what failed
                        await anyio.sleep(0.5)  # JetStream may still be recovering after a restart

            while True:  # followed again after the connection came back: the consumer may be gone
                seen = nc.stats["reconnects"]
                async with anyio.create_task_group() as tg:
                    tg.start_soon(pump)
                    await reconnected(nc, seen)
                    tg.cancel_scope.cancel()
                say(resumed_line({0: start - 1}))

        async def on_record(r: Record) -> None:
            with contextlib.suppress(LoopwireError):
                await send.send((r.seq, r.event()))

        async def on_resume(f: Follower) -> None:
            say(resumed_line(f.positions))

        async def tail_every_loop() -> None:
            # --from SEQ: from that sequence of each history stream (one per shard).
            async with await follow_all(nc, names, on_record, from_seq=args.from_seq, on_resume=on_resume):
                await anyio.sleep_forever()

        async with anyio.create_task_group() as tg:
            tg.start_soon(_cancel_on_interrupt, tg.cancel_scope)
            tg.start_soon(watch_connection, nc, settings)
            tg.start_soon(follow_one if loop_id else tail_every_loop)
            await nc.flush(timeout=5)  # the live subscription is in place before we say so
            what = f"loop {loop_id}" if loop_id else "every loop"
            print(f"following {what} (Ctrl-C to stop)", file=sys.stderr, flush=True)
            async for seq, e in receive:
                if isinstance(e, TokenDelta) and args.no_tokens:
                    continue
                if args.json:
                    out(event_json(e, seq))
                    continue
                where = "" if loop_id else f"{short(e.loop_id)} "
                mark = f"{seq:>5}" if seq is not None else "  ~  "
                when = clock_of(e.created_at) or " " * 12
                out(f"{mark} {when} {where}{type(e).__name__:<18} {describe(e)}")
    return 0


async def _cancel_on_interrupt(scope: anyio.CancelScope) -> None:
    """Ctrl-C (or SIGTERM) ends ``scope``. asyncio's own Ctrl-C handling cancels the main task
    once, and a library's ``wait_for`` racing that cancellation can lose it (the command then
    never stops); an anyio scope's cancellation is delivered again until it is honoured."""
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for _ in signals:
            scope.cancel()
            return
