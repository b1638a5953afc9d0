"""The ``loopwire`` command line: the argument parser (one function per command) and the entry point.

Every sub-command is bound to its handler (``set_defaults(handler=...)``, see :mod:`services.cli.handlers`).
Exit status: 0 ok, 1 an error (printed as one ``error: ...`` line), 2 a usage error, 130 interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Final, TypeAlias

from services.cli.handlers import (
    ClientCommand,
    handle_auth_config,
    handle_console,
    handle_demo,
    handle_schema,
    handle_serve,
    handle_up,
)
from shared.settings import ENV_VARS
from shared.wiretypes import ON_UNKNOWN_OUTCOMES, POLICY_EFFECTS

DEMO_PROMPT: Final = "what is 17*23 and what time is it in Tokyo?"
PROG: Final = "loopwire"

Handler = Callable[[argparse.Namespace], int]
if TYPE_CHECKING:
    Commands: TypeAlias = argparse._SubParsersAction[argparse.ArgumentParser]


class _Formatter(argparse.RawDescriptionHelpFormatter):
    def __init__(self, prog: str) -> None:
        super().__init__(prog, max_help_position=32, width=min(100, max(60, _columns())))


def _columns() -> int:
    try:
        return int(os.environ.get("COLUMNS", "")) or os.get_terminal_size().columns
    except (ValueError, OSError):
        return 100


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("loopwire")
    except Exception:  # not installed as a distribution (running from a checkout)
        return "unknown"


def _connection_options(parser: argparse.ArgumentParser, *, top: bool) -> None:
    # On sub-commands the defaults are SUPPRESSed, so `loopwire --nats-url X history ...` and
    # `loopwire history ... --nats-url X` both work.
    default = None if top else argparse.SUPPRESS
    parser.add_argument(
        "--nats-url", metavar="URL", default=default, help="NATS server URL(s), comma-separated (env LW_NATS_URL)"
    )
    parser.add_argument("--prefix", default=default, help="subject/stream prefix (env LW_PREFIX, default lw)")


def _json_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON (one object per line) instead of text")


def _command(
    sub: Commands, name: str, help_: str, description: str = "", *, connects: bool = True
) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        name, help=help_, description=description or help_, formatter_class=_Formatter
    )
    if connects:
        _connection_options(p, top=False)
    return p


def build_parser() -> argparse.ArgumentParser:
    """The whole command line (also used by tests to check compose.yaml's commands)."""
    env_help = "\n".join(f"  {k:<30} {v}" for k, v in ENV_VARS.items())
    parser = argparse.ArgumentParser(
        prog=PROG,
        formatter_class=_Formatter,
        description="loopwire: LLM agent loops as a distributed system on NATS.\n\n"
        "Try it:  loopwire demo\n"
        "Develop: loopwire up   (then, in another shell: loopwire start; loopwire send LOOP 'hi' --wait)",
        epilog=f"Configuration comes from the environment:\n{env_help}",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    _connection_options(parser, top=True)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for add in (
        # all in one, then one service in the foreground
        _add_demo,
        _add_up,
        _add_serve,
        _add_console,
        # client commands
        _add_start,
        _add_budget,
        _add_send,
        _add_history,
        _add_tail,
        _add_loops,
        _add_gates,
        _add_answers,
        _add_interrupt_and_close,
        _add_fork,
        _add_lineage_and_diff,
        _add_tools,
        _add_streams,
        _add_shards,
        _add_auth_config,
        _add_schema,
    ):
        add(sub)
    return parser


def _add_demo(sub: Commands) -> None:
    p = _command(
        sub,
        "demo",
        "run a loop on an embedded NATS server with every service, live, then stop everything",
        "Start an embedded nats-server (free port, data in a temporary directory unless --data-dir), the "
        "committer, the model-step (demo model: rule-based, not an LLM) and every built-in tool worker, each "
        "as its own process; run one loop on PROMPT showing the model's text and the tool calls live; print "
        "the final answer and the history replayed from JetStream; stop everything.",
        connects=False,
    )
    p.add_argument("prompt", nargs="?", default=DEMO_PROMPT, metavar="PROMPT", help=f"default: {DEMO_PROMPT!r}")
    p.add_argument("--data-dir", metavar="DIR", help="keep NATS data and service logs here (default: a temp dir)")
    p.add_argument("--model", default="demo", help="model of the loop (default demo; see docs/models.md)")
    p.add_argument("--tools", metavar="A,B", help="built-in tool workers to start (default: all)")
    p.add_argument("--plain", action="store_true", help="plain lines even on a terminal")
    p.add_argument(
        "--chunk-delay", type=float, default=0.04, metavar="S", help="pause between demo-model chunks (0.04)"
    )
    p.add_argument("--timeout", type=float, default=60.0, metavar="S", help="give up after S seconds (60)")
    p.set_defaults(handler=handle_demo)


def _add_up(sub: Commands) -> None:
    p = _command(
        sub,
        "up",
        "run NATS and every service until Ctrl-C (for development)",
        "Start an embedded nats-server and every service as its own process and keep them running. Prints the "
        "NATS URL; use the client commands from another shell. Ctrl-C (or SIGTERM) stops everything.",
        connects=False,
    )
    p.add_argument(
        "--port", type=int, help="NATS client port (default 4222, or a free one while 4222 is taken; 0 = a free port)"
    )
    p.add_argument("--data-dir", metavar="DIR", help="keep NATS data and logs here (default: a temp dir)")
    p.add_argument("--prefix", default="lw", help="subject/stream prefix the services use (default lw)")
    p.add_argument("--model", default="", help="default model of new loops (env LW_MODEL, default demo)")
    p.add_argument("--tools", metavar="A,B", help="built-in tool workers to start (default: all)")
    p.add_argument("--chunk-delay", type=float, default=0.0, metavar="S", help="pause between demo-model chunks")
    p.add_argument(
        "--console-port",
        type=int,
        metavar="N",
        help="operator console port (8080, or a free one while 8080 is taken; 0 = a free port)",
    )
    p.add_argument("--no-console", action="store_true", help="do not start the operator console")
    p.add_argument("--no-metrics", action="store_true", help="do not serve Prometheus /metrics from the services")
    p.set_defaults(handler=handle_up)


def _add_serve(sub: Commands) -> None:
    p = _command(
        sub,
        "serve",
        "run one service in the foreground (what a container runs)",
        "Run one service until SIGTERM/SIGINT, then drain and exit 0. Configuration: LW_* variables.",
    )
    which = p.add_subparsers(dest="service", metavar="SERVICE", required=True)
    s = which.add_parser("committer", help="the only writer of loop history", formatter_class=_Formatter)
    _connection_options(s, top=False)
    s.add_argument("--replicas", type=int, choices=(1, 3), help="stream and bucket replicas (env LW_REPLICAS)")
    s = which.add_parser("model-step", help="drives loops: model, tools, commits", formatter_class=_Formatter)
    _connection_options(s, top=False)
    s = which.add_parser("tool", help="serve tools: built-in names or module:attr", formatter_class=_Formatter)
    _connection_options(s, top=False)
    s.add_argument("tools", nargs="+", metavar="NAME", help="built-in tool name or module:attr")
    _add_serve_mcp(which)
    _add_serve_agent(which)
    p.set_defaults(handler=handle_serve)


def _add_serve_mcp(which: Commands) -> None:
    s = which.add_parser(
        "mcp",
        usage="loopwire serve mcp [options] NAME (-- COMMAND [ARGS...] | --url URL)",
        help="serve an MCP server's tools: NAME -- COMMAND [ARGS...] or NAME --url URL",
        description="Serve every tool of one MCP server as the loopwire tool NAME_<tool>. With -- COMMAND the "
        "server runs as a supervised child over stdio (restarted with backoff when it exits or stops answering; "
        "it gets this environment minus LW_* variables); with --url it is reached over streamable HTTP. Several "
        "bridges with the same NAME share the calls. Exits 1 when the server never completes initialize.",
        formatter_class=_Formatter,
    )
    _connection_options(s, top=False)
    s.add_argument("name", metavar="NAME", help="server name, the tools' prefix: 1-40 of A-Z a-z 0-9 - (no _)")
    s.add_argument("--url", help="streamable HTTP endpoint of the server (instead of a command)")
    s.add_argument(
        "--header-env",
        action="append",
        default=[],
        metavar="HEADER=VAR",
        help="with --url: send HTTP header HEADER with the value of environment variable VAR (repeatable), "
        "e.g. Authorization=MCP_AUTH",
    )
    s.add_argument("--timeout", type=float, metavar="S", help="deadline of each call (env LW_TOOL_TIMEOUT_SECONDS)")
    s.add_argument(
        "--init-timeout", type=float, default=10.0, metavar="S", help="wait this long for initialize (default 10)"
    )
    s.set_defaults(command=[])  # what follows "--" (see parse_args): argparse would read its options as ours


def _add_serve_agent(which: Commands) -> None:
    s = which.add_parser(
        "agent",
        help="serve a sub-agent: tool NAME whose every call runs a child loop",
        description='Serve the tool NAME (input {"task": string}, kind agent). Each call starts a child loop '
        "(its own id and history, its LoopStarted naming the parent's call) with --model, --tools, the "
        "--instructions file as system prompt and --policy, submits the task, and answers with the child's final "
        "answer (a failed or interrupted child: an error result). The child's tool calls, steps and gates show as "
        "the call's progress in the parent; its gates are listed by `loopwire gates PARENT`. A call sent again "
        "(worker or model-step crash) finds the same child; interrupting or closing the parent interrupts and "
        "closes the child. Several workers with the same NAME share the calls.",
        formatter_class=_Formatter,
    )
    _connection_options(s, top=False)
    s.add_argument("name", metavar="NAME", help="the tool's name: 1-64 of A-Z a-z 0-9 _ -")
    s.add_argument("--model", required=True, help="the child loops' model, e.g. demo or openai:gpt-4o")
    s.add_argument("--tools", metavar="A,B", help="the child loops' tools, comma-separated (default: every tool)")
    s.add_argument("--instructions", metavar="FILE", help="a text file: the child loops' system prompt")
    s.add_argument("--description", metavar="TEXT", help="what the parent's model reads about the tool")
    s.add_argument(
        "--policy", action="append", metavar="TOOL=EFFECT", help="allow | deny | ask for a child's tool (repeatable)"
    )
    s.add_argument(
        "--timeout",
        type=float,
        metavar="S",
        help="deadline of each call in seconds (default 86400: a child may wait at gates)",
    )


def _add_console(sub: Commands) -> None:
    p = _command(
        sub,
        "console",
        "serve the operator console: a web page to watch loops live, answer gates, steer and inspect",
        "Serve the console (pages and server-sent events; it alone talks to NATS) until Ctrl-C. A host that "
        "is not loopback needs LW_CONSOLE_TOKEN, which the page then sends with every request.",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8080, help="port (default 8080)")
    p.set_defaults(handler=handle_console)


def _add_start(sub: Commands) -> None:
    from services.cli import budgets, contextopts, loopcmds

    p = _command(sub, "start", "start a loop; prints its id")
    p.add_argument("--model", help="model spec: demo, scripted:PATH, openai:NAME, anthropic:NAME (default LW_MODEL)")
    p.add_argument("--system", help="system prompt")
    p.add_argument("--tools", metavar="A,B", help="tool allow-list (default: every live tool; '' = none)")
    p.add_argument(
        "--policy",
        action="append",
        metavar="TOOL=EFFECT",
        help="allow | deny | ask for a tool (repeatable; TOOL * sets every tool)",
    )
    p.add_argument("--default-policy", choices=POLICY_EFFECTS, help="effect for unlisted tools (allow)")
    p.add_argument(
        "--on-unknown",
        choices=ON_UNKNOWN_OUTCOMES,
        help="a call that may have run but left no result when its step runs again, of a tool neither "
        "read-only nor idempotent: error (the model is told, default) or ask (an operator gate)",
    )
    p.add_argument(
        "--retry",
        action="append",
        metavar="TOOL=N[:INITIAL[:MAX]]",
        help="retry policy of a read-only or idempotent tool: attempts, initial and maximum backoff "
        "seconds (repeatable; overrides the tool's own)",
    )
    p.add_argument("--max-iterations", type=int, metavar="N", help="tool steps per turn (25)")
    p.add_argument("--max-tokens", type=int, metavar="N", help="tokens per model response (provider default)")
    p.add_argument("--loop-id", metavar="UUID", help="use this loop id instead of a new one")
    budgets.add_budget_options(p)
    contextopts.add_context_options(p)
    _json_option(p)
    p.set_defaults(handler=ClientCommand(loopcmds.cmd_start))


def _add_budget(sub: Commands) -> None:
    from services.cli import budgetcmd, budgets

    p = _command(
        sub,
        "budget",
        "show or change a loop's budget",
        "Without options: print LOOP's budget and what it has spent (tokens and cost of the loop, steps and "
        "seconds of the running turn). With options: change those limits (the others stay) from the next "
        "model step on; committed as BudgetChanged (docs/budgets.md).",
    )
    p.add_argument("loop", metavar="LOOP", help="loop id")
    budgets.add_budget_options(p)
    _json_option(p)
    p.set_defaults(handler=ClientCommand(budgetcmd.cmd_budget))


def _add_send(sub: Commands) -> None:
    from services.cli import loopcmds

    p = _command(sub, "send", "send user input to a loop")
    p.add_argument("loop", metavar="LOOP", help="loop id")
    p.add_argument("text", metavar="TEXT", help="the user's message")
    p.add_argument("--wait", action="store_true", help="wait until the turn ends and print the answer")
    p.add_argument("--timeout", type=float, default=300.0, metavar="S", help="with --wait: give up after S s (300)")
    _json_option(p)
    p.set_defaults(handler=ClientCommand(loopcmds.cmd_send))


def _add_history(sub: Commands) -> None:
    from services.cli import historycmds

    p = _command(sub, "history", "print a loop's committed history (replayed from JetStream)")
    p.add_argument("loop", metavar="LOOP", help="loop id")
    p.add_argument("--from", dest="from_seq", type=int, default=1, metavar="SEQ", help="first stream sequence")
    _json_option(p)
    p.set_defaults(handler=ClientCommand(historycmds.cmd_history))


def _add_tail(sub: Commands) -> None:
    from services.cli import historycmds

    p = _command(
        sub,
        "tail",
        "follow live and committed events (of one loop, or of all) until Ctrl-C",
        "Print live events (marked ~) and committed ones (with their sequence) as they happen. With LOOP "
        "the history so far is printed first (--new skips it); without LOOP only new events are shown.",
    )
    p.add_argument("loop", metavar="LOOP", nargs="?", help="loop id (default: every loop)")
    p.add_argument("--from", dest="from_seq", type=int, metavar="SEQ", help="start at this stream sequence")
    p.add_argument("--new", action="store_true", help="with LOOP: only events from now on")
    p.add_argument("--no-tokens", action="store_true", help="hide TokenDelta events")
    _json_option(p)
    p.set_defaults(handler=ClientCommand(historycmds.cmd_tail))


def _add_loops(sub: Commands) -> None:
    from services.cli import loopcmds

    p = _command(sub, "loops", "list loops with their state")
    _json_option(p)
    p.set_defaults(handler=ClientCommand(loopcmds.cmd_loops))


def _add_gates(sub: Commands) -> None:
    from services.cli import gatecmds

    p = _command(sub, "gates", "list open gates (permission requests and questions) waiting for an operator")
    p.add_argument("loop", metavar="LOOP", nargs="?", help="only this loop and its sub-agents' child loops")
    _json_option(p)
    p.set_defaults(handler=ClientCommand(gatecmds.cmd_gates))


def _add_answers(sub: Commands) -> None:
    """approve, deny and reply: the answers to a gate."""
    from services.cli import gatecmds

    p = _command(sub, "approve", "approve a permission gate")
    p.add_argument("gate", metavar="GATE", help="gate id (see loopwire gates)")
    p.add_argument("--always", action="store_true", help="also allow this tool for the rest of the loop")
    p.add_argument("--loop", metavar="LOOP", help="the gate's loop (default: found by scanning loops)")
    _json_option(p)
    p.set_defaults(handler=ClientCommand(gatecmds.cmd_approve))

    p = _command(sub, "deny", "deny a permission gate")
    p.add_argument("gate", metavar="GATE", help="gate id")
    p.add_argument("--reason", help="why (shown to the model)")
    p.add_argument("--loop", metavar="LOOP", help="the gate's loop (default: found by scanning loops)")
    _json_option(p)
    p.set_defaults(handler=ClientCommand(gatecmds.cmd_deny))

    p = _command(sub, "reply", "answer a question gate (ask_user)")
    p.add_argument("gate", metavar="GATE", help="gate id")
    p.add_argument("text", metavar="TEXT", help="the answer (the tool call's result)")
    p.add_argument("--loop", metavar="LOOP", help="the gate's loop (default: found by scanning loops)")
    _json_option(p)
    p.set_defaults(handler=ClientCommand(gatecmds.cmd_reply))


def _add_interrupt_and_close(sub: Commands) -> None:
    from services.cli import loopcmds

    p = _command(sub, "interrupt", "interrupt a loop's running turn")
    p.add_argument("loop", metavar="LOOP", help="loop id")
    _json_option(p)
    p.set_defaults(handler=ClientCommand(loopcmds.cmd_interrupt))

    p = _command(sub, "close", "close a loop (no more input)")
    p.add_argument("loop", metavar="LOOP", help="loop id")
    _json_option(p)
    p.set_defaults(handler=ClientCommand(loopcmds.cmd_close))


def _add_fork(sub: Commands) -> None:
    from services.cli import forks

    p = _command(
        sub,
        "fork",
        "branch a loop from a committed point; prints the new loop's id",
        "Create a new loop from LOOP's records up to --at (after an input, a step or a turn's end; default the "
        "last such point); the source is never written to. A call of the new branch equal to one the source "
        "made after the point is reused, run again or asked about (--reexecute; default: read-only tools run "
        "again, idempotent ones reuse the recorded result, others ask).",
    )
    p.add_argument("loop", metavar="LOOP", help="the source loop id")
    # Parsed by the command: a bad value is its one error line, not argparse's usage text.
    p.add_argument("--at", metavar="SEQ", help="fork point: a stream sequence of LOOP (see loopwire history)")
    p.add_argument("--input", metavar="TEXT", help="replace the input the fork point ends with (else add it)")
    p.add_argument("--model", help="model of the new branch")
    p.add_argument("--system", help="system prompt of the new branch")
    p.add_argument(
        "--policy", action="append", metavar="TOOL=EFFECT", help="allow | deny | ask for a tool (repeatable)"
    )
    p.add_argument(
        "--reexecute", action="append", metavar="TOOL=WAY", help="reuse | rerun | ask for a repeated call (repeatable)"
    )
    p.add_argument("--loop-id", metavar="UUID", help="use this id for the new loop")
    _json_option(p)
    p.set_defaults(handler=ClientCommand(forks.cmd_fork))


def _add_lineage_and_diff(sub: Commands) -> None:
    from services.cli import forks

    p = _command(
        sub, "lineage", "show a loop's tree: its root, every fork with its fork point, and sub-agents' child loops"
    )
    p.add_argument("loop", metavar="LOOP", help="loop id")
    _json_option(p)
    p.set_defaults(handler=ClientCommand(forks.cmd_lineage))

    p = _command(sub, "diff", "compare two branches: common prefix, first divergence, the rest side by side")
    p.add_argument("a", metavar="A", help="loop id")
    p.add_argument("b", metavar="B", help="loop id")
    _json_option(p)
    p.set_defaults(handler=ClientCommand(forks.cmd_diff))


def _add_tools(sub: Commands) -> None:
    from services.cli import toolcmds

    p = _command(sub, "tools", "list live tools: replicas, kind, version, arguments")
    _json_option(p)
    p.set_defaults(handler=ClientCommand(toolcmds.cmd_tools))


def _add_streams(sub: Commands) -> None:
    from services.cli import streamscmd

    p = _command(
        sub,
        "streams",
        "every shard's streams and buckets: leader, followers, messages",
        "For every shard (LW_SHARDS): its history and work streams and its leases and results buckets, each "
        "with the node that leads it, its followers and its message count. --balance first moves leaders so "
        "each node leads about as many shards as the others and a shard's four leaders sit on one node.",
    )
    p.add_argument("--balance", action="store_true", help="move leaders to spread the shards over the nodes")
    _json_option(p)
    p.set_defaults(handler=ClientCommand(streamscmd.cmd_streams))


def _add_shards(sub: Commands) -> None:
    from services.cli import shardscmd

    p = _command(
        sub,
        "shards",
        "the deployment's shard count; `shards grow N` grows a one-shard deployment",
        "Every process reads the shard count from the deployment. `loopwire shards grow N` records N and "
        "creates the new shards' streams; it refuses while any service runs (docs/scaling.md).",
    )
    which = p.add_subparsers(dest="action", metavar="ACTION")
    g = which.add_parser("grow", help="grow a one-shard deployment to N shards", formatter_class=_Formatter)
    _connection_options(g, top=False)
    g.add_argument("grow", type=int, metavar="N", help="the new shard count")
    _json_option(p)
    p.set_defaults(handler=ClientCommand(shardscmd.cmd_shards), grow=None)


def _add_auth_config(sub: Commands) -> None:
    p = _command(
        sub,
        "auth-config",
        "print the NATS users and permissions (auth.conf) for an N-shard deployment",
        "One user per service kind (committer, model-step, each built-in tool, an MCP bridge, operator, "
        "reader), each granted every shard's subjects, streams and buckets; deploy/nats/auth.conf is its output.",
        connects=False,
    )
    p.add_argument("--shards", type=int, default=1, metavar="N", help="the deployment's shard count (default 1)")
    p.add_argument("--prefix", default="lw", help="the deployment's LW_PREFIX (default lw)")
    p.set_defaults(handler=handle_auth_config)


def _add_schema(sub: Commands) -> None:
    p = _command(
        sub,
        "schema",
        "write the JSON Schemas (and the AsyncAPI document) of the wire contract",
        "Without options: every JSON Schema as one JSON object on stdout. --out DIR writes one file per "
        "type; --asyncapi FILE writes the AsyncAPI 3 document; --check compares instead of writing.",
        connects=False,
    )
    p.add_argument("--out", metavar="DIR", help="write schema files here (e.g. schemas)")
    p.add_argument("--asyncapi", metavar="FILE", help="write the AsyncAPI document here (e.g. docs/asyncapi.yaml)")
    p.add_argument("--check", action="store_true", help="exit 1 if the files differ from the code")
    p.set_defaults(handler=handle_schema)


# --- running ------------------------------------------------------------------------------------


def _dispatch(args: argparse.Namespace) -> int:
    handler: Handler = args.handler
    return handler(args)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse a command line; for ``serve mcp`` everything after the first ``--`` is the server's command."""
    words = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    if "--" in words:
        cut = words.index("--")
        head = words[:cut]
        if "serve" in head and "mcp" in head[head.index("serve") + 1 :]:
            args = parser.parse_args(head)
            if getattr(args, "service", None) == "mcp":
                args.command = words[cut + 1 :]
                return args
    return parser.parse_args(words)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``loopwire`` console script."""
    from services.cli.errors import CliError

    with contextlib.suppress(AttributeError, ValueError):  # a replaced stdout (tests) may not support it
        sys.stdout.reconfigure(errors="replace")  # type: ignore[union-attr]
    try:
        # Parsing imports the commands: a Ctrl-C that lands there is an interrupt like any other.
        return _dispatch(parse_args(argv))
    except CliError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # Output piped into `head` and the like: not an error.
        _silence_stdout()
        return 0


def _silence_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
