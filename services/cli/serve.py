"""``loopwire serve ...`` and ``loopwire console``: one service in the foreground (services.runner).

The embedded mode starts each of its services as ``python -m services.cli serve ...``, so this is
also the entry a container runs.
"""

from __future__ import annotations

import argparse
import os
import sys
from functools import partial

import anyio

from services.cli.errors import CliError
from services.cli.stack import require_free
from services.runner import run_service
from shared.settings import Settings


def run_serve(args: argparse.Namespace, settings: Settings) -> int:
    if args.service == "committer":
        from services.committer.service import CommitterService

        if args.replicas:
            settings = Settings.from_env(
                None, nats_urls=settings.nats_urls, prefix=settings.prefix, replicas=args.replicas
            )
        return run_service("committer", CommitterService, settings)
    if args.service == "model-step":
        from services.model_step.service import ModelStepService

        return run_service("model-step", ModelStepService, settings)
    if args.service == "mcp":
        return _run_serve_mcp(args, settings)
    if args.service == "agent":
        return _run_serve_agent(args, settings)
    from services.tools.service import ToolService, resolve_tools

    if any(":" in spec for spec in args.tools) and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # module:attr resolves from here, as with `python -m`
    try:
        tools = resolve_tools(args.tools)
    except (ValueError, ImportError, AttributeError) as e:
        raise CliError(f"cannot load tool: {e}") from None
    label = ToolService(tools, settings).label
    return run_service(f"tool:{label}", partial(ToolService, tools), settings)


def _run_serve_mcp(args: argparse.Namespace, settings: Settings) -> int:
    from services.mcp.connect import McpStartError, McpTarget, headers_from_env
    from services.mcp.mapping import valid_server_name
    from services.mcp.service import McpService

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

    def service(s: Settings) -> McpService:
        return McpService(target, s, timeout_seconds=args.timeout, init_timeout=args.init_timeout)

    try:
        return run_service(f"mcp:{args.name}", service, settings)
    except McpStartError as e:
        raise CliError(str(e)) from None


def _run_serve_agent(args: argparse.Namespace, settings: Settings) -> int:
    from pathlib import Path

    from services.cli.policyopts import parse_policy
    from services.cli.valuechecks import checked_model
    from services.tools.agent import DEFAULT_AGENT_TIMEOUT_SECONDS, agent_tool
    from services.tools.service import ToolService
    from shared.settings import split_list

    instructions = ""
    if args.instructions:
        try:
            instructions = Path(args.instructions).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise CliError(f"cannot read --instructions {args.instructions}: {type(e).__name__}") from None
    if args.timeout is not None and not args.timeout > 0:
        raise CliError("--timeout must be > 0 seconds")
    model = checked_model(args.model, "--model")
    tools = list(split_list(args.tools)) if args.tools is not None else None
    policy = parse_policy(args.policy or [])
    try:
        tool = agent_tool(
            args.name,
            model=model,
            instructions=instructions,
            tools=tools,
            description=args.description or "",
            policy=policy,
            timeout=args.timeout or DEFAULT_AGENT_TIMEOUT_SECONDS,
        )
    except ValueError as e:
        raise CliError(str(e)) from None
    anyio.run(_check_agent_tools, settings, args.name, tools, list(policy))
    return run_service(f"agent:{args.name}", partial(ToolService, [tool]), settings)


# How long a sub-agent waits at start for the tools of its --tools (started with it, they may register
# a moment later) before it refuses to serve.
AGENT_TOOLS_WAIT_SECONDS = 5.0


async def _check_agent_tools(settings: Settings, name: str, tools: list[str] | None, policy: list[str]) -> None:
    """The child loops' tools are live and their policy names their tools (or, with every live tool,
    the agent itself, which registers once it serves): said now, not at the first call."""
    from services.cli.session import session
    from services.cli.valuechecks import require_live_tools, require_policy_tools
    from services.toolwire.spec import valid_tool_name

    for tool in tools or ():
        if not valid_tool_name(tool):
            raise CliError(f"--tools: {tool!r} is not a tool name (1 to 64 of A-Z a-z 0-9 _ -)")
    settings = await _deployment_checked(settings)  # the deployment first: it says what else is wrong
    async with session(settings) as nc:
        if tools:
            later = await require_live_tools(nc, settings, tools, "--tools", wait=AGENT_TOOLS_WAIT_SECONDS, later=True)
            if later:
                print(
                    f"warning: --tools: {', '.join(later)} not live yet: its calls fail until it serves",
                    file=sys.stderr,
                    flush=True,
                )
        await require_policy_tools(nc, settings, policy, tools, "--policy", also=[name])


async def _deployment_checked(settings: Settings) -> Settings:
    """``settings`` with the deployment's shard count; the CLI's one-line error unless a server of
    ``settings`` takes a connection and holds a deployment that fits them (waited for a moment:
    ``loopwire up`` starts its committer alongside)."""
    from services.cli.session import deployment_settings, open_nats
    from services.lifecycle import close_quietly
    from shared.errors import LoopwireError
    from shared.streams import require_deployment

    settings = await deployment_settings(settings)
    nc = await open_nats(settings, name="loopwire-console-check")
    try:
        await require_deployment(nc.jetstream(timeout=5), settings)
    except LoopwireError as e:
        raise CliError(str(e)) from None
    finally:
        await close_quietly(nc)
    return settings


def run_console(args: argparse.Namespace, settings: Settings) -> int:
    from services.console.service import TOKEN_VAR, ConsoleService, check_binding
    from shared.errors import ServiceStartError

    token = os.environ.get(TOKEN_VAR, "")
    problem = check_binding(args.host, token)
    if problem:
        raise CliError(problem)
    require_free(args.port, "--port", args.host)
    # Said at start, in one line: the console would otherwise serve pages about a deployment it
    # cannot reach, or one that is not there ("waiting for the history stream"), or another one's.
    anyio.run(_deployment_checked, settings)

    def service(s: Settings) -> ConsoleService:
        return ConsoleService(s, host=args.host, port=args.port, token=token)

    try:
        return run_service("console", service, settings)
    except ServiceStartError as e:
        raise CliError(str(e)) from None
