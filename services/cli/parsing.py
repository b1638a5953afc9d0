"""The argument parser class of every ``loopwire`` command: a usage error is one ``error:`` line.

argparse prints a command's whole usage before its error, which buries the one line that says what
is wrong (and a script's log gets a screenful per typo). Here an error is one line, exit status 2,
that names the command, says what is wrong, and where an unknown option is one of another command
says which (``start --reexecute``: ``--reexecute is an option of loopwire fork``); the usage stays
one ``--help`` away.
"""

from __future__ import annotations

import argparse
import difflib
import math
from collections.abc import Iterator, Sequence
from typing import NoReturn

USAGE_ERROR = 2  # the exit status of a bad command line (1 is a command that failed)
_COMMAND = "_parsed_by"  # the namespace attribute naming the sub-command that parsed the line


class Parser(argparse.ArgumentParser):
    """An :class:`argparse.ArgumentParser` whose errors are one line (sub-parsers are of this class too)."""

    def error(self, message: str) -> NoReturn:
        self.exit(USAGE_ERROR, one_line(self.prog, message))

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        ns, extras = super().parse_known_args(args, namespace)
        if not hasattr(ns, _COMMAND):  # the innermost sub-command parses first and names itself
            setattr(ns, _COMMAND, self.prog)
        return ns, extras

    def parse_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> argparse.Namespace:
        ns, extras = self.parse_known_args(args, namespace)
        prog = vars(ns).pop(_COMMAND, self.prog)
        if extras:
            # Reported by the top parser: name the command they were given to, and where they belong.
            command = next((p for p in parsers(self) if p.prog == prog), self)
            command.error(f"unrecognized arguments: {' '.join(extras)}{belongs_elsewhere(self, command, extras)}")
        return ns


def one_line(prog: str, message: str) -> str:
    text = " ".join(message.split())
    return f"error: {prog}: {text} ({prog} --help shows the usage)\n"


def parsers(top: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    """``top`` and every (nested) sub-command's parser."""
    yield top
    for action in top._actions:
        if isinstance(action, argparse._SubParsersAction):
            seen: set[int] = set()
            for sub in action.choices.values():
                if id(sub) not in seen:  # an alias is the same parser again
                    seen.add(id(sub))
                    yield from parsers(sub)


def _option_strings(parser: argparse.ArgumentParser) -> set[str]:
    return {s for a in parser._actions for s in a.option_strings}


def belongs_elsewhere(top: argparse.ArgumentParser, command: argparse.ArgumentParser, extras: list[str]) -> str:
    """For each unknown ``--option``: the commands that have it, else a close option of ``command``."""
    own = sorted(_option_strings(command))
    hints = []
    for word in extras:
        if not word.startswith("--"):
            continue
        option = word.split("=", 1)[0]
        elsewhere = [p.prog for p in parsers(top) if p is not command and option in _option_strings(p)]
        if elsewhere:
            where = " and ".join(elsewhere[:3]) + (" ..." if len(elsewhere) > 3 else "")
            hints.append(f"{option} is an option of {where}, not of {command.prog}")
        elif close := difflib.get_close_matches(option, own, n=1):
            hints.append(f"did you mean {close[0]}?")
    return "; " + "; ".join(hints) if hints else ""


# --- value types: a value out of range is a usage error, found before anything connects ------------


def _integer(raw: str) -> int:
    try:
        return int(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a whole number, got {raw!r}") from None


def _number(raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a number, got {raw!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"a finite number, got {raw!r}")
    return value


def port(raw: str) -> int:
    value = _integer(raw)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"a port from 0 to 65535, got {raw!r}")
    return value


def count(raw: str) -> int:
    value = _integer(raw)
    if value < 0:
        raise argparse.ArgumentTypeError(f"a count of 0 or more, got {raw!r}")
    return value


def sequence(raw: str) -> int:
    value = _integer(raw)
    if value < 1:
        raise argparse.ArgumentTypeError(f"a stream sequence from 1, got {raw!r}")
    return value


def seconds(raw: str) -> float:
    value = _number(raw)
    if value < 0:
        raise argparse.ArgumentTypeError(f"seconds of 0 or more, got {raw!r}")
    return value


def positive_seconds(raw: str) -> float:
    value = _number(raw)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"seconds above 0, got {raw!r}")
    return value
