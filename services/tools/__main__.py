"""``python -m services.tools NAME [NAME...]``: serve built-in (or ``module:attr``) tools as one worker."""

from __future__ import annotations

import argparse
import sys
from functools import partial

from services.runner import env_settings, run_service
from services.tools.builtins import BUILTINS
from services.tools.service import ToolService, resolve_tools
from shared.settings import ENV_VARS


def main(argv: list[str] | None = None) -> int:
    builtins = "\n".join(f"  {name:<11} {t.description}" for name, t in sorted(BUILTINS.items()))
    env = "\n".join(
        f"  {k:<24} {v}"
        for k, v in ENV_VARS.items()
        if k
        in (
            "LW_NATS_URL",
            "LW_PREFIX",
            "LW_TOOL_ROOT",
            "LW_HTTP_ALLOW",
            "LW_TOOL_TIMEOUT_SECONDS",
            "LW_HEARTBEAT_SECONDS",
            "LW_LOG_LEVEL",
        )
    )
    parser = argparse.ArgumentParser(
        prog="python -m services.tools",
        description="Run tool workers: each tool is served on <prefix>.tool.<name> in its own queue group, "
        "registered in KV <prefix>_tools while running. SIGTERM drains (in-flight calls finish).",
        epilog=f"built-in tools:\n{builtins}\n\nalso: module:attr (a @tool or a list of them)\n\nenvironment:\n{env}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("tools", nargs="+", metavar="NAME", help="built-in tool name or module:attr")
    args = parser.parse_args(argv)
    try:
        tools = resolve_tools(args.tools)
    except (ValueError, ImportError, AttributeError) as e:
        parser.error(str(e))
    settings = env_settings()
    return run_service("tools", partial(ToolService, tools), settings)


if __name__ == "__main__":
    sys.exit(main())
