"""Values of the command line checked when they are given, not at a loop's first turn: a model spec
(and a scripted model's file), tool names (live, with the close match of a misspelt one) and the
tools a policy names."""

from __future__ import annotations

import contextlib
import difflib
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Final

from nats.aio.client import Client as NATS

from services.cli.errors import CliError
from shared.modelspec import spec_problem
from shared.settings import Settings
from shared.toolrules import needs_known, unknown_rule

MODEL_VAR: Final = "LW_MODEL"
_SCRIPTED: Final = "scripted:"


def checked_model(spec: str, option: str) -> str:
    """``spec`` as sent to the loop API, or ``CliError`` naming ``option``: a known form, and for a
    scripted model a file that reads and parses as a script. Its path is sent absolute, so a
    model-step started in another directory finds the same file."""
    if problem := spec_problem(spec):
        raise CliError(f"{option}: {problem}")
    spec = spec.strip()
    if not spec.startswith(_SCRIPTED):
        return spec
    from services.model_step.models.scripted import ScriptError, load_script

    path = Path(spec[len(_SCRIPTED) :].strip()).expanduser()
    try:
        load_script(path)
    except ScriptError as e:
        raise CliError(f"{option}: {e}") from None
    return _SCRIPTED + str(path.resolve())


def model_from_env(settings: Settings) -> str | None:
    """LW_MODEL when this command's environment sets it (checked), else None: the committer's default."""
    if not os.environ.get(MODEL_VAR, "").strip():
        return None
    return checked_model(settings.model, MODEL_VAR)


def close_match(name: str, known: Iterable[str]) -> str:
    """`` (did you mean X?)`` for the tool name closest to ``name``, or ""."""
    close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


async def require_live_tools(
    nc: NATS, settings: Settings, names: list[str], option: str, wait: float = 0, *, later: bool = False
) -> list[str]:
    """Every tool ``names`` lists has a live worker (waiting up to ``wait`` seconds for the missing
    ones): a misspelt name is an error, not a loop without the tool. With ``later`` a missing name
    that is close to no live tool's is returned instead (a sub-agent may call a tool that starts
    after it: another sub-agent calling it back, say); one close to a live tool's is still an error."""
    from services.toolcaller.registry import ToolRegistry

    async with ToolRegistry(nc, settings.names, replicas=settings.replicas) as registry:
        if wait > 0:
            with contextlib.suppress(TimeoutError):  # the ones still missing are named below
                await registry.wait_until(lambda r: all(r.get(n) is not None for n in names), timeout=wait)
        missing = [n for n in names if registry.get(n) is None]
        live = [t.name for t in registry.live()]
    if not missing or (later and not any(close_match(n, live) for n in missing)):
        return missing
    known = ", ".join(live) if live else "none"
    misspelt = next((n for n in missing if close_match(n, live)), missing[0])
    raise CliError(
        f"{option}: no live tool named {', '.join(missing)}{close_match(misspelt, live)} "
        f"(live: {known}; loopwire tools lists them)"
    )


async def require_policy_tools(
    nc: NATS, settings: Settings, policy: Iterable[str], tools: list[str] | None, option: str, also: Iterable[str] = ()
) -> None:
    """Every tool a policy names is one of the loop's: ``tools``, else a live tool or one of ``also``."""
    rules = list(policy)
    if not needs_known(rules):
        return
    if tools is not None:
        known, listed = frozenset(tools), True
    else:
        from services.toolcaller.registry import registered_names

        live = await registered_names(nc, settings.names, replicas=settings.replicas)
        known, listed = live | frozenset(also), False
    if problem := unknown_rule(option, rules, known, listed=listed):
        raise CliError(problem)
