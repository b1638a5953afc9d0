"""Which tools a loop's per-tool rules may name: its policy (``TOOL=allow|deny|ask``) and a fork's
re-execution rules (``TOOL=reuse|rerun|ask``).

A rule naming no tool of the loop would never apply, so a misspelt ``calculater=ask`` would leave
calculator ungated: every place that takes such rules (the loop API, the CLI, the console) refuses
it, naming the closest tool. The tools of a loop are its allow-list when it has one, else the tools
known where it is started (the live tools of the tools bucket, and for a fork also every tool its
source called). ``*`` (every other tool) is always allowed.
"""

from __future__ import annotations

import difflib
from collections.abc import Collection, Iterable
from typing import Final

WILDCARD: Final = "*"
_SHOWN: Final = 12  # tools named in a refusal without a close match


def unknown_rule(option: str, rules: Iterable[str], known: Collection[str], *, listed: bool) -> str:
    """The refusal of the first rule of ``rules`` naming none of ``known`` ("" when every one names a
    tool). ``option``: how the caller names the rules (``policy``, ``--reexecute``...); ``listed``:
    ``known`` is the loop's own allow-list (else the tools live where it is started)."""
    for name in rules:
        if name == WILDCARD or name in known:
            continue
        close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.6)
        if close:
            hint = f"did you mean {close[0]}?"
        elif not known:
            hint = "the loop has no tools" if listed else "no tool is live: start its worker first"
        else:
            names = sorted(known)
            shown = ", ".join(names[:_SHOWN]) + (", …" if len(names) > _SHOWN else "")
            hint = f"its tools: {shown}" if listed else f"live tools: {shown}"
        shown_name = name if len(name) <= 64 else name[:64] + "…"
        return f"{option}: {shown_name!r} is not a tool of the loop ({hint})"
    return ""


def needs_known(rules: Iterable[str]) -> bool:
    """Whether checking ``rules`` needs the loop's tools (only ``*`` needs none)."""
    return any(name != WILDCARD for name in rules)
