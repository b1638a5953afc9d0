"""The ``loopwire`` command line: the argument parser (one function per command) and the entry point.

Every sub-command is bound to its handler (``set_defaults(handler=...)``, see :mod:`services.cli.handlers`).
Exit status: 0 ok, 1 an error (printed as one ``error: ...`` line), 2 a usage error (one such line too,
see :mod:`services.cli.parsing`), 130 interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

from services.cli import opsparser
from services.cli.handlers import (
    ClientCommand,
    handle_console,
    handle_demo,
    handle_serve,
    handle_up,
)
from services.cli.helpexamples import epilog
from services.cli.parserkit import Formatter, Handler, command, connection_options, json_option
from services.cli.parsing import Parser, count, port, positive_seconds, seconds, sequence
from shared.settings import ENV_VARS
from shared.wiretypes import ON_UNKNOWN_OUTCOMES, POLICY_EFFECTS

if TYPE_CHECKING:
    from services.cli.parserkit import Commands

DEMO_PROMPT: Final = "what is 17*23 and what time is it in Tokyo?"
PROG: Final = "loopwire"


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("loopwire")
    except Exception:  # not installed as a distribution (running from a checkout)
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    """The whole command line (also used by tests to check compose.yaml's commands)."""
    env_help = "\n".join(f"  {k:<30} {v}" for k, v in ENV_VARS.items())
    parser = Parser(
        prog=PROG,
        formatter_class=Formatter,
        description="loopwire: LLM agent loops as a distributed system on NATS.\n\n"
        "Try it:  loopwire demo\n"
        "Develop: loopwire up   (then, in another shell: loopwire start; loopwire send LOOP 'hi' --wait)",
        epilog=f"Configuration comes from the environment:\n{env_help}",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    connection_options(parser, top=True)
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
        opsparser.add_streams,
        opsparser.add_verify,
        opsparser.add_shards,
        opsparser.add_auth_config,
        opsparser.add_schema,
    ):
        add(sub)
    return parser


def _add_demo(sub: Commands) -> None:
    p = command(
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
        "--chunk-delay", type=seconds, default=0.04, metavar="S", help="pause between demo-model chunks (0.04)"
    )
    p.add_argument("--timeout", type=positive_seconds, default=60.0, metavar="S", help="give up after S seconds (60)")
    p.set_defaults(handler=handle_demo)


def _add_up(sub: Commands) -> None:
    p = command(
        sub,
        "up",
        "run NATS and every service until Ctrl-C (for development)",
        "Start an embedded nats-server and every service as its own process and keep them running. Prints the "
        "NATS URL; use the client commands from another shell. Ctrl-C (or SIGTERM) stops everything. Every "
        "child (the nats-server too) that exits is started again, with one line that names it and its log; "
        "one that exits a 4th time within 60 s stops everything with one error line naming it and its log, "
        "which is kept (exit 1).",
        connects=False,
    )
    p.add_argument(
        "--port", type=port, help="NATS client port (default 4222, or a free one while 4222 is taken; 0 = a free port)"
    )
    p.add_argument("--data-dir", metavar="DIR", help="keep NATS data and logs here (default: a temp dir)")
    p.add_argument("--prefix", default="lw", help="subject/stream prefix the services use (default lw)")
    p.add_argument("--model", default="", help="default model of new loops (env LW_MODEL, default demo)")
    p.add_argument("--tools", metavar="A,B", help="built-in tool workers to start (default: all)")
    p.add_argument("--chunk-delay", type=seconds, default=0.0, metavar="S", help="pause between demo-model chunks")
    p.add_argument(
        "--console-port",
        type=port,
        metavar="N",
        help="operator console port (8080, or a free one while 8080 is taken; 0 = a free port)",
    )
    p.add_argument("--no-console", action="store_true", help="do not start the operator console")
    p.add_argument("--no-metrics", action="store_true", help="do not serve Prometheus /metrics from the services")
    p.set_defaults(handler=handle_up)


def _served(service: str) -> dict[str, Any]:
    """The help layout and examples of ``serve SERVICE``."""
    return {"formatter_class": Formatter, "epilog": epilog(f"serve {service}")}


def _add_serve(sub: Commands) -> None:
    p = command(
        sub,
        "serve",
        "run one service in the foreground (what a container runs)",
        "Run one service until SIGTERM/SIGINT, then drain and exit 0. Configuration: LW_* variables.",
    )
    which = p.add_subparsers(dest="service", metavar="SERVICE", required=True)
    s = which.add_parser("committer", help="the only writer of loop history", **_served("committer"))
    connection_options(s, top=False)
    s.add_argument("--replicas", type=int, choices=(1, 3), help="stream and bucket replicas (env LW_REPLICAS)")
    s = which.add_parser("model-step", help="drives loops: model, tools, commits", **_served("model-step"))
    connection_options(s, top=False)
    s = which.add_parser("tool", help="serve tools: built-in names or module:attr", **_served("tool"))
    connection_options(s, top=False)
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
        **_served("mcp"),
    )
    connection_options(s, top=False)
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
    s.add_argument(
        "--timeout", type=positive_seconds, metavar="S", help="deadline of each call (env LW_TOOL_TIMEOUT_SECONDS)"
    )
    s.add_argument(
        "--init-timeout",
        type=positive_seconds,
        default=10.0,
        metavar="S",
        help="wait this long for initialize (default 10)",
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
        "closes the child. A call from a loop that already runs under NAME (a cycle, e.g. ping -> pong -> ping) or "
        "whose child would nest deeper than LW_AGENT_MAX_DEPTH (8) gets an error result instead of a child. "
        "Several workers with the same NAME share the calls.",
        **_served("agent"),
    )
    connection_options(s, top=False)
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
        type=positive_seconds,
        metavar="S",
        help="deadline of each call in seconds (default 86400: a child may wait at gates)",
    )


def _add_console(sub: Commands) -> None:
    p = command(
        sub,
        "console",
        "serve the operator console: a web page to watch loops live, answer gates, steer and inspect",
        "Serve the console (pages and server-sent events; it alone talks to NATS) until Ctrl-C. A host that "
        "is not loopback needs LW_CONSOLE_TOKEN, which the page then sends with every request.",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=port, default=8080, help="port (default 8080)")
    p.set_defaults(handler=handle_console)


def _add_start(sub: Commands) -> None:
    from services.cli import budgets, contextopts, loopcmds

    p = command(sub, "start", "start a loop; prints its id")
    p.add_argument(
        "--model",
        help="model spec: demo, scripted:PATH, openai:NAME, anthropic:NAME (default: LW_MODEL when set here, "
        "else the deployment's default model)",
    )
    p.add_argument("--system", help="system prompt")
    p.add_argument("--tools", metavar="A,B", help="tool allow-list (default: every live tool; '' = none)")
    p.add_argument(
        "--policy",
        action="append",
        metavar="TOOL=EFFECT",
        help="allow | deny | ask for a tool of the loop (repeatable; TOOL * sets every other tool)",
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
    p.add_argument("--max-iterations", type=count, metavar="N", help="tool steps per turn (25)")
    p.add_argument("--max-tokens", type=count, metavar="N", help="tokens per model response (provider default)")
    p.add_argument("--loop-id", metavar="UUID", help="use this loop id instead of a new one")
    budgets.add_budget_options(p)
    contextopts.add_context_options(p)
    json_option(p)
    p.set_defaults(handler=ClientCommand(loopcmds.cmd_start))


def _add_budget(sub: Commands) -> None:
    from services.cli import budgetcmd, budgets

    p = command(
        sub,
        "budget",
        "show or change a loop's budget",
        "Without options: print LOOP's budget and what it has spent (tokens and cost of the loop, steps and "
        "seconds of the running turn). With options: change those limits (the others stay) from the next "
        "model step on; committed as BudgetChanged (docs/budgets.md).",
    )
    p.add_argument("loop", metavar="LOOP", help="loop id")
    budgets.add_budget_options(p)
    json_option(p)
    p.set_defaults(handler=ClientCommand(budgetcmd.cmd_budget))


def _add_send(sub: Commands) -> None:
    from services.cli import loopcmds

    p = command(sub, "send", "send user input to a loop")
    p.add_argument("loop", metavar="LOOP", help="loop id")
    p.add_argument("text", metavar="TEXT", help="the user's message; - reads it from standard input")
    p.add_argument("--wait", action="store_true", help="wait until the turn ends and print the answer")
    p.add_argument(
        "--timeout", type=positive_seconds, default=300.0, metavar="S", help="with --wait: give up after S s (300)"
    )
    json_option(p)
    p.set_defaults(handler=ClientCommand(loopcmds.cmd_send))


def _add_history(sub: Commands) -> None:
    from services.cli import historycmds

    p = command(sub, "history", "print a loop's committed history (replayed from JetStream)")
    p.add_argument("loop", metavar="LOOP", help="loop id")
    p.add_argument("--from", dest="from_seq", type=sequence, default=1, metavar="SEQ", help="first stream sequence")
    json_option(p)
    p.set_defaults(handler=ClientCommand(historycmds.cmd_history))


def _add_tail(sub: Commands) -> None:
    from services.cli import historycmds

    p = command(
        sub,
        "tail",
        "follow live and committed events (of one loop, or of all) until Ctrl-C",
        "Print live events (marked ~) and committed ones (with their sequence) as they happen. With LOOP "
        "the history so far is printed first (--new skips it); without LOOP only new events are shown. "
        "When the NATS connection is lost (a server restart) tail follows on after the last record it "
        "printed once the server is back, saying so in one line on stderr (never a record twice, none "
        "missed); a server away longer than LW_CONNECT_SECONDS ends it with one error line, exit 1.",
    )
    p.add_argument("loop", metavar="LOOP", nargs="?", help="loop id (default: every loop)")
    p.add_argument("--from", dest="from_seq", type=sequence, metavar="SEQ", help="start at this stream sequence")
    p.add_argument("--new", action="store_true", help="with LOOP: only events from now on")
    p.add_argument("--no-tokens", action="store_true", help="hide TokenDelta events")
    json_option(p)
    p.set_defaults(handler=ClientCommand(historycmds.cmd_tail))


def _add_loops(sub: Commands) -> None:
    from services.cli import loopcmds

    p = command(sub, "loops", "list loops with their state")
    json_option(p)
    p.set_defaults(handler=ClientCommand(loopcmds.cmd_loops))


def _add_gates(sub: Commands) -> None:
    from services.cli import gatecmds

    p = command(sub, "gates", "list open gates (permission requests and questions) waiting for an operator")
    p.add_argument("loop", metavar="LOOP", nargs="?", help="only this loop and its sub-agents' child loops")
    json_option(p)
    p.set_defaults(handler=ClientCommand(gatecmds.cmd_gates))


def _add_answers(sub: Commands) -> None:
    """approve, deny and reply: the answers to a gate."""
    from services.cli import gatecmds

    p = command(sub, "approve", "approve a permission gate")
    p.add_argument("gate", metavar="GATE", help="gate id or a unique start of it (see loopwire gates)")
    p.add_argument("--always", action="store_true", help="also allow this tool for the rest of the loop")
    p.add_argument("--loop", metavar="LOOP", help="the gate's loop (default: found by scanning loops)")
    json_option(p)
    p.set_defaults(handler=ClientCommand(gatecmds.cmd_approve))

    p = command(sub, "deny", "deny a permission gate")
    p.add_argument("gate", metavar="GATE", help="gate id or a unique start of it")
    p.add_argument("--reason", help="why (shown to the model)")
    p.add_argument("--loop", metavar="LOOP", help="the gate's loop (default: found by scanning loops)")
    json_option(p)
    p.set_defaults(handler=ClientCommand(gatecmds.cmd_deny))

    p = command(sub, "reply", "answer a question gate (ask_user)")
    p.add_argument("gate", metavar="GATE", help="gate id or a unique start of it")
    p.add_argument("text", metavar="TEXT", help="the answer (the tool call's result)")
    p.add_argument("--loop", metavar="LOOP", help="the gate's loop (default: found by scanning loops)")
    json_option(p)
    p.set_defaults(handler=ClientCommand(gatecmds.cmd_reply))


def _add_interrupt_and_close(sub: Commands) -> None:
    from services.cli import loopcmds

    p = command(
        sub,
        "interrupt",
        "interrupt a loop's running turn",
        "Interrupt LOOP's running turn (exit 1, nothing written, when none runs).",
    )
    p.add_argument("loop", metavar="LOOP", help="loop id")
    json_option(p)
    p.set_defaults(handler=ClientCommand(loopcmds.cmd_interrupt))

    p = command(
        sub,
        "close",
        "close a loop (no more input)",
        "Close LOOP: no more input (exit 1, nothing written, when it is closed already).",
    )
    p.add_argument("loop", metavar="LOOP", help="loop id")
    json_option(p)
    p.set_defaults(handler=ClientCommand(loopcmds.cmd_close))


def _add_fork(sub: Commands) -> None:
    from services.cli import forks

    p = command(
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
    json_option(p)
    p.set_defaults(handler=ClientCommand(forks.cmd_fork))


def _add_lineage_and_diff(sub: Commands) -> None:
    from services.cli import forks

    p = command(
        sub, "lineage", "show a loop's tree: its root, every fork with its fork point, and sub-agents' child loops"
    )
    p.add_argument("loop", metavar="LOOP", help="loop id")
    json_option(p)
    p.set_defaults(handler=ClientCommand(forks.cmd_lineage))

    p = command(sub, "diff", "compare two branches: common prefix, first divergence, the rest side by side")
    p.add_argument("a", metavar="A", help="loop id")
    p.add_argument("b", metavar="B", help="loop id")
    json_option(p)
    p.set_defaults(handler=ClientCommand(forks.cmd_diff))


def _add_tools(sub: Commands) -> None:
    from services.cli import toolcmds

    p = command(sub, "tools", "list live tools: replicas, kind, version, arguments")
    json_option(p)
    p.set_defaults(handler=ClientCommand(toolcmds.cmd_tools))


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
