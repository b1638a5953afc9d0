"""The context-window options of ``loopwire start`` (docs/context.md)."""

from __future__ import annotations

import argparse

from services.cli.budgets import count_range
from services.cli.errors import CliError
from shared.events import ContextPolicy
from shared.wiretypes import CONTEXT_STRATEGIES, MAX_LIMIT_COUNT

__all__ = ["add_context_options", "context_from_args"]

_COUNTS = ("window", "trigger", "keep", "clear_at_least")


def add_context_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--context",
        choices=CONTEXT_STRATEGIES,
        help="how model requests fit the model's context window: none (sent as built, default), "
        "clear_tool_results (old tool results become a placeholder) or compact (older messages summarised)",
    )
    p.add_argument(
        "--context-window", type=int, metavar="N", help="the model's context window in tokens (default: the model's)"
    )
    p.add_argument(
        "--context-trigger",
        type=int,
        metavar="N",
        help="input tokens above which the strategy acts (default 0: only when the window would be exceeded)",
    )
    p.add_argument("--context-keep", type=int, metavar="N", help="most recent tool results never cleared (3)")
    p.add_argument(
        "--context-clear-at-least",
        type=int,
        metavar="N",
        help="tokens one clearing must free below the window, else none is made (keeps the prompt cache; 0)",
    )
    p.add_argument(
        "--context-exclude-tool",
        action="append",
        metavar="TOOL",
        help="a tool whose results are never cleared (repeatable)",
    )
    p.add_argument(
        "--context-model", metavar="SPEC", help="compact: the model that writes the summaries (default: the loop's)"
    )


def context_from_args(args: argparse.Namespace) -> ContextPolicy | None:
    """The policy the options give (None: no option given, the loop API's default)."""
    given: dict[str, object] = {}
    for name in _COUNTS:
        value = getattr(args, f"context_{name}", None)
        if value is None:
            continue
        if not 0 <= value <= MAX_LIMIT_COUNT:
            raise CliError(f"--context-{name.replace('_', '-')}: {count_range(value)}")
        given[name] = value
    if getattr(args, "context_model", None):
        given["model"] = args.context_model
    if getattr(args, "context_exclude_tool", None):
        given["exclude_tools"] = list(args.context_exclude_tool)
    strategy = getattr(args, "context", None)
    if strategy is None and not given:
        return None
    if strategy is None:
        raise CliError("--context-* options need --context clear_tool_results or compact")
    return ContextPolicy(strategy=strategy, **given)  # type: ignore[arg-type]
