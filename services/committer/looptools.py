"""The tools of a loop being started or forked, against which its per-tool rules are checked
(:mod:`shared.toolrules`): a start's policy, a fork's policy changes and re-execution rules."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import nats.errors
from nats.aio.client import Client as NATS

from services.toolcaller.registry import registered_names
from shared.errors import ErrorKind, LoopwireError
from shared.protocol import WireError
from shared.settings import Settings
from shared.toolrules import needs_known, unknown_rule


@dataclass(frozen=True, slots=True)
class LoopTools:
    """``names``: the tools a rule may name; ``listed``: they are the loop's allow-list."""

    names: frozenset[str]
    listed: bool

    def check(self, field: str, rules: Iterable[str]) -> None:
        """Refuse (``invalid``, naming ``field``) the first rule naming no tool of the loop."""
        problem = unknown_rule(field, rules, self.names, listed=self.listed)
        if problem:
            raise WireError(ErrorKind.INVALID, problem, field=field)


async def loop_tools(
    nc: NATS, settings: Settings, allow_list: Iterable[str] | None, rules: Iterable[str], called: Iterable[str] = ()
) -> LoopTools:
    """The tools ``rules`` may name: the loop's allow-list, else the tools live in the tools bucket
    and those ``called`` (a fork's source's calls). The bucket is read only when a rule names a tool."""
    if allow_list is not None:
        return LoopTools(frozenset(allow_list), listed=True)
    if not needs_known(rules):
        return LoopTools(frozenset(), listed=False)
    try:
        live = await registered_names(nc, settings.names, replicas=settings.replicas)
    except (nats.errors.Error, TimeoutError, LoopwireError) as e:
        raise WireError(ErrorKind.UNAVAILABLE, f"cannot read the tools bucket to check the loop's rules: {e}") from None
    return LoopTools(live | frozenset(called), listed=False)
