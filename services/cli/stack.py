"""``loopwire demo`` and ``loopwire up``: an embedded stack (:mod:`services.embedded`) in the foreground.

Signals: SIGINT (Ctrl-C) and SIGTERM interrupt start-up or the demo at any moment; the clean-up
then runs with both ignored, so a second Ctrl-C cannot cut it short.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import socket
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from types import FrameType
from typing import TYPE_CHECKING, Final

from services.cli.errors import CliError
from services.embedded import BUILTIN_TOOLS, EmbeddedStack
from services.lifecycle import raise_single
from shared.natsserver import NatsServerError, free_port
from shared.procs import ServiceStartError
from shared.settings import split_list

if TYPE_CHECKING:
    from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
    from nats.aio.client import Client as NATS
    from rich.console import Console

    from shared.events import Event
    from shared.turns import TurnOutcome, TurnTracker

# --- signals --------------------------------------------------------------------------------------


class Interrupts:
    """SIGINT and SIGTERM raise KeyboardInterrupt and are remembered.

    Remembering matters: library code that swallows the exception (a bare ``except:`` during an
    import, say) cannot make us miss a Ctrl-C, because :meth:`check` raises it again.
    """

    def __init__(self) -> None:
        self.received = False
        self._old: dict[int, object] = {}

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        self.received = True
        raise KeyboardInterrupt

    def install(self) -> None:
        for s in (signal.SIGINT, signal.SIGTERM):
            old = signal.signal(s, self._handler)
            self._old.setdefault(s, old)

    def check(self) -> None:
        if self.received:
            raise KeyboardInterrupt

    def __enter__(self) -> Interrupts:
        self.install()
        return self

    def __exit__(self, *exc: object) -> None:
        for s, h in self._old.items():
            signal.signal(s, h)  # type: ignore[arg-type]


@contextlib.contextmanager
def _signals_ignored() -> Iterator[None]:
    old = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


@contextlib.contextmanager
def running(stack: EmbeddedStack, interrupts: Interrupts) -> Iterator[EmbeddedStack]:
    """Start ``stack``; always stop it on the way out, whatever interrupts (Ctrl-C, SIGTERM, errors)."""
    try:
        interrupts.check()
        try:
            stack.start()
        except (ServiceStartError, NatsServerError) as e:
            stack.keep_data = True  # the logs explain it
            raise CliError(f"could not start: {e} (logs kept in {stack.log_dir})") from None
        interrupts.check()
        yield stack
    finally:
        with _signals_ignored():
            stack.stop()


def _tool_list(value: str | None) -> list[str]:
    if value is None:
        return list(BUILTIN_TOOLS)
    names = list(split_list(value))
    unknown = [t for t in names if t not in BUILTIN_TOOLS]
    if unknown:
        raise CliError(f"unknown built-in tool(s): {', '.join(unknown)} (built-ins: {', '.join(BUILTIN_TOOLS)})")
    return names


# --- loopwire demo --------------------------------------------------------------------------------


def run_demo(args: argparse.Namespace) -> int:
    with Interrupts() as interrupts:
        try:
            return _run_demo(args, interrupts)
        except KeyboardInterrupt:
            print("interrupted: everything stopped", file=sys.stderr, flush=True)
            return 130
        except Exception:
            if not interrupts.received:
                raise
            # The Ctrl-C came inside code that wrapped it (Python turns an exception raised while a
            # class is being created, e.g. during an import, into a RuntimeError): still an interrupt.
            print("interrupted: everything stopped", file=sys.stderr, flush=True)
            return 130


def _run_demo(args: argparse.Namespace, interrupts: Interrupts) -> int:
    import anyio

    from services.cli.output import make_console
    from services.cli.valuechecks import checked_model

    args.model = checked_model(args.model, "--model")  # before anything starts

    console = make_console()
    plain = args.plain or not console.is_terminal
    stack = EmbeddedStack(
        tools=_tool_list(args.tools),
        data_dir=args.data_dir or "",
        chunk_delay=max(0.0, args.chunk_delay),
        log_level="WARNING",
    )
    t0 = time.monotonic()
    say = _say(console, plain)
    say(f"starting an embedded nats-server, the committer, the model-step and {len(stack.tools)} tool workers…")
    with running(stack, interrupts):
        say(
            f"ready in {time.monotonic() - t0:.1f} s: NATS at {stack.url}, "
            f"{len(stack.processes)} service processes (logs in {stack.log_dir})"
        )
        code: int = anyio.run(_demo_main, stack, args, console, plain, interrupts)
        interrupts.install()  # the event loop left SIGINT to Python's default handler
        interrupts.check()
        say("stopping every service and the nats-server…")
    say(f"done in {time.monotonic() - t0:.1f} s")
    return code


async def _demo_main(
    stack: EmbeddedStack, args: argparse.Namespace, console: object, plain: bool, interrupts: Interrupts
) -> int:
    """The demo loop, cancelled cleanly by SIGINT/SIGTERM (then KeyboardInterrupt once out of the loop)."""
    import anyio

    code = 130
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        try:
            async with anyio.create_task_group() as tg:

                async def watch() -> None:
                    async for _ in signals:
                        interrupts.received = True
                        tg.cancel_scope.cancel()
                        return

                tg.start_soon(watch)
                interrupts.check()
                code = await _demo_loop(stack, args, console, plain)
                tg.cancel_scope.cancel()
        except BaseExceptionGroup as group:
            raise_single(group)  # the demo's own error (one line), not a group of one
    interrupts.check()
    return code


def _say(console: object, plain: bool) -> Callable[[str], None]:
    from rich.console import Console
    from rich.text import Text

    assert isinstance(console, Console)

    def say(text: str) -> None:
        if plain:
            print(f"{'demo':<7}| {text}", flush=True)
        else:
            console.print(Text(text, style="dim"), highlight=False)  # a path or an error may hold "[...]"

    return say


async def _demo_loop(stack: EmbeddedStack, args: argparse.Namespace, console: object, plain: bool) -> int:
    """One loop of ``args.model``: shown live until its turn ends, then its answer and its history."""
    import anyio
    from nats.aio.msg import Msg
    from rich.console import Console
    from rich.text import Text

    from services.cli.historycmds import print_history
    from services.cli.render import describe
    from services.cli.session import session
    from shared.client import LoopClient
    from shared.codec import decode_live_frame
    from shared.errors import LoopwireError
    from shared.events import Event
    from shared.replay import replay
    from shared.turns import TurnTracker

    assert isinstance(console, Console)
    settings = stack.settings()
    names = settings.names
    loop_id = str(uuid.uuid4())
    send, receive = anyio.create_memory_object_stream[tuple[int | None, Event]](100_000)

    async def on_live(msg: Msg) -> None:
        with contextlib.suppress(LoopwireError, anyio.WouldBlock):
            for e in decode_live_frame(msg.data):
                send.send_nowait((None, e))

    async with session(settings) as nc:
        await nc.subscribe(names.live(loop_id), cb=on_live)
        client = LoopClient(nc, names)
        await client.start(loop_id, model=args.model)
        res = await client.input(loop_id, args.prompt)
        if plain:
            print(f"{'loop':<7}| {loop_id}\n{'user':<7}| {args.prompt}", flush=True)
        else:
            console.print(Text.assemble(("loop ", "bold"), loop_id, "\n", ("you: ", "bold"), args.prompt))
        tracker = TurnTracker(loop_id, res.command_id)
        await _show_turn(stack, args, console, plain, nc, tracker, res.seq, send, receive)
        result = tracker.result
        assert result is not None
        records = [r async for r in replay(nc, loop_id, names=names)]

    _show_answer(console, plain, result)
    print_history(console, records, title=f"history of loop {loop_id}, replayed from JetStream")
    if result.outcome != "done":
        stack.keep_data = True
        why = f": {describe(result.event, limit=2000)}" if result.event is not None else ""
        raise CliError(f"the turn ended {result.outcome}{why} (logs kept in {stack.log_dir})")
    return 0


async def _show_turn(
    stack: EmbeddedStack,
    args: argparse.Namespace,
    console: Console,
    plain: bool,
    nc: NATS,
    tracker: TurnTracker,
    after_seq: int,
    send: MemoryObjectSendStream[tuple[int | None, Event]],
    receive: MemoryObjectReceiveStream[tuple[int | None, Event]],
) -> None:
    """Show the loop live (its live events and its history) until ``tracker`` has the turn's end."""
    import anyio

    from services.cli.live import LoopView
    from shared.events import LoopClosed, LoopIdle, TurnStarted
    from shared.turns import follow

    names = stack.settings().names

    async def pump_history() -> None:
        async with follow(nc, names, tracker.loop_id, after_seq) as records:
            async for seq, e in records:
                await send.send((seq, e))

    with LoopView(console, plain=plain) as view:
        try:
            with anyio.fail_after(args.timeout):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(pump_history)
                    async for seq, e in receive:
                        view.apply(e, seq)
                        if seq is None:
                            continue
                        if tracker.result is None:
                            tracker.feed(e, seq)
                        # The turn's end and the loop's LoopIdle are separate commits: the table
                        # below shows the history once the loop is at rest.
                        if tracker.result is not None and isinstance(e, LoopIdle | TurnStarted | LoopClosed):
                            break
                    tg.cancel_scope.cancel()
        except TimeoutError:
            stack.keep_data = True
            raise CliError(
                f"the loop did not finish within {args.timeout:g} s (logs kept in {stack.log_dir})"
            ) from None


def _show_answer(console: Console, plain: bool, result: TurnOutcome) -> None:
    from rich.panel import Panel
    from rich.text import Text

    if not result.answer and result.outcome != "done":
        return  # nothing answered: the error that follows says why
    if plain:
        print(f"{'answer':<7}| " + result.answer.replace("\n", "\n" + " " * 7 + "| "), flush=True)
    else:
        console.print(
            Panel(Text(result.answer or "(no text)"), title="answer", title_align="left", border_style="green")
        )


# --- loopwire up ----------------------------------------------------------------------------------


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a listener could bind ``host:port`` now."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        # As servers bind (uvicorn, nats-server): a port whose last connections linger in TIME_WAIT is
        # free to listen on again; one with a listener is not.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def run_up(args: argparse.Namespace) -> int:
    with Interrupts() as interrupts:
        try:
            return _run_up(args, interrupts)
        except KeyboardInterrupt:
            print("stopped", flush=True)
            return 0
        except Exception:
            if not interrupts.received:
                raise
            print("stopped", flush=True)  # a Ctrl-C that surfaced wrapped (see run_demo)
            return 0


DEFAULT_NATS_PORT: Final = 4222
DEFAULT_CONSOLE_PORT: Final = 8080


def require_free(port: int, option: str, host: str = "127.0.0.1") -> None:
    """A port asked for explicitly must be free (0: any free port): a clear error, never another port."""
    if port and not port_free(port, host):
        raise CliError(f"{option} {port} is in use; choose another, or 0 for a free one")


def _port_for(asked: int | None, default: int, option: str, what: str) -> int:
    """The port to listen on: the one asked for (see :func:`require_free`); without one the default,
    or a free port (said) while the default is taken."""
    if asked is not None:
        require_free(asked, option)
        return asked
    if port_free(default):
        return default
    port = free_port()
    print(f"port {default} is in use: {what} uses {port} instead", flush=True)
    return port


def _run_up(args: argparse.Namespace, interrupts: Interrupts) -> int:
    from services.cli.valuechecks import checked_model

    if args.model:  # else the committer's LW_MODEL
        args.model = checked_model(args.model, "--model")
    port = _port_for(args.port, DEFAULT_NATS_PORT, "--port", "NATS (another nats-server?)")
    console_port: int | None = None
    if not args.no_console:
        console_port = (
            _port_for(args.console_port, DEFAULT_CONSOLE_PORT, "--console-port", "the console") or free_port()
        )
    stack = EmbeddedStack(
        tools=_tool_list(args.tools),
        port=port,
        console_port=console_port,
        data_dir=args.data_dir or "",
        prefix=args.prefix,
        model=args.model,
        chunk_delay=max(0.0, args.chunk_delay),
        metrics=not args.no_metrics,
    )
    print(f"starting nats-server, committer, model-step and {len(stack.tools)} tool workers…", flush=True)
    with running(stack, interrupts):
        env = ""
        if stack.url != "nats://127.0.0.1:4222":
            env += f"export LW_NATS_URL={stack.url}\n  "
        if stack.prefix != "lw":
            env += f"export LW_PREFIX={stack.prefix}\n  "
        print(
            f"loopwire is up.\n"
            f"NATS URL: {stack.url}\n"
            f"prefix:   {stack.prefix}\n"
            f"data:     {stack.data_dir}{' (temporary)' if not args.data_dir else ''}\n"
            f"logs:     {stack.log_dir}\n"
            f"services: committer, model-step, tools: {', '.join(stack.tools)}\n"
            f"console:  {stack.console_url or 'off (--no-console)'}\n"
            f"metrics:  {_metrics_lines(stack)}\n\n"
            f"In another shell:\n"
            f"  {env}LOOP=$(loopwire start)\n"
            f'  loopwire send $LOOP "what is 17*23 and what time is it in Tokyo?" --wait\n'
            f"  loopwire history $LOOP\n"
            f"  loopwire tail            # every loop, live\n"
            f"  LOOP=$(loopwire start --policy calculator=ask); loopwire send $LOOP 'what is 2+3?'\n"
            f"  loopwire gates; loopwire approve GATE\n\n"
            f"Ctrl-C stops everything.",
            flush=True,
        )
        while True:
            interrupts.check()
            found = stack.supervise()  # every child alike: restarted, or the stack stops (its logs kept)
            for line in found.said:
                print(line, flush=True)
            if found.fatal:
                raise CliError(found.fatal)
            time.sleep(0.5)


def _metrics_lines(stack: EmbeddedStack) -> str:
    urls = stack.metrics_urls
    if not urls:
        return "off (--no-metrics)"
    return "\n          ".join(f"{name}: {url}" for name, url in urls.items())
