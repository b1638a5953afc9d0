"""A bad command line is one ``error:`` line and exit status 2, for every option of every command.

The cases are walked from the parser itself: every sub-command, every option that takes a value (given
none, and, where argparse checks it, a bad one), an unknown option, and each option given to a command
it does not belong to (the line names the command it belongs to).
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import pytest

from services.cli import build_parser
from services.cli.parsing import parsers

PARSER = build_parser()
SHARED = {"-h", "--help", "--nats-url", "--prefix", "--json"}  # on (nearly) every command: checked once


def _path(p: argparse.ArgumentParser) -> list[str]:
    return p.prog.split()[1:]


def _positionals(p: argparse.ArgumentParser) -> list[str]:
    """What ``p`` requires: its positionals (a loop or gate prefix, a tool name: the parser takes it) and
    required options (``serve agent --model``)."""
    words = []
    for a in p._actions:
        if a.option_strings and a.required:
            words += [a.option_strings[0], "demo"]
        elif not a.option_strings and not isinstance(a, argparse._SubParsersAction) and a.nargs not in ("?", "*"):
            words.append("abcd")
    return words


def _is_leaf(p: argparse.ArgumentParser) -> bool:
    return not any(isinstance(a, argparse._SubParsersAction) for a in p._actions)


def _valued(p: argparse.ArgumentParser) -> Iterator[argparse.Action]:
    for a in p._actions:
        if (
            a.option_strings
            and a.nargs is None
            and not isinstance(a, argparse._StoreConstAction | argparse._HelpAction)
        ):
            yield a


COMMANDS = [p for p in parsers(PARSER) if p is not PARSER]
LEAVES = [p for p in COMMANDS if _is_leaf(p)]


def one_error_line(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        PARSER.parse_args(argv)
    out = capsys.readouterr()
    assert exc.value.code == 2, (argv, out.err)
    assert out.out == "" and "usage:" not in out.err, (argv, out.err)
    lines = out.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: loopwire"), (argv, out.err)
    return lines[0]


def _cases() -> Iterator[tuple[str, list[str], str]]:
    """(the command, its argv, what its line says)."""
    for p in LEAVES:
        base = [*_path(p), *_positionals(p)]
        yield p.prog, [*base, "--no-such-option"], "unrecognized arguments: --no-such-option"
        for a in _valued(p):
            if a.option_strings[0] in SHARED and p is not LEAVES[0]:
                continue
            option = a.option_strings[0]
            yield p.prog, [*base, option], f"argument {option}: expected one argument"
            if a.choices is not None or a.type is not None:
                yield p.prog, [*base, option, "abc"], f"argument {option}: "
    for p in [PARSER, *COMMANDS]:
        if not _is_leaf(p):  # a command of commands: without its sub-command, and with an unknown one
            yield p.prog, _path(p), "the following arguments are required"
            yield p.prog, [*_path(p), "nope"], "invalid choice: 'nope'"


CASES = list(_cases())


@pytest.mark.parametrize(("prog", "argv", "says"), CASES, ids=[" ".join(a) or "(none)" for _, a, _ in CASES])
def test_every_bad_option_is_one_error_line(
    prog: str, argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    line = one_error_line(argv, capsys)
    assert line.startswith(f"error: {prog}: ") and says in line, line
    assert line.endswith(f"({prog} --help shows the usage)"), line


def test_the_walk_covers_every_command_and_option() -> None:
    assert len(LEAVES) >= 25 and {"loopwire start", "loopwire serve agent", "loopwire fork"} <= {p.prog for p in LEAVES}
    checked = {(p, a[a.index(o)]) for p, a, _ in CASES for o in a if o.startswith("--")}
    for p in LEAVES:
        for a in _valued(p):
            if a.option_strings[0] not in SHARED:
                assert (p.prog, a.option_strings[0]) in checked


def _misplaced() -> Iterator[tuple[list[str], str, list[str]]]:
    """Each option once, given to a command that lacks it: (argv, the option, the commands that have it)."""
    owners: dict[str, list[str]] = {}
    flags: set[str] = set()
    for p in LEAVES:
        for a in p._actions:
            for s in a.option_strings:
                owners.setdefault(s, []).append(p.prog)
                if a.nargs == 0:
                    flags.add(s)
    for option, progs in sorted(owners.items()):
        lacking = next((p for p in LEAVES if p.prog not in progs), None)
        if lacking is not None and option not in SHARED:
            value = [] if option in flags else ["x"]
            yield [*_path(lacking), *_positionals(lacking), option, *value], option, progs


MISPLACED = list(_misplaced())


@pytest.mark.parametrize(("argv", "option", "owners"), MISPLACED, ids=[" ".join(a) for a, _, _ in MISPLACED])
def test_an_option_of_another_command_says_whose_it_is(
    argv: list[str], option: str, owners: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    line = one_error_line(argv, capsys)
    assert f"{option} is an option of {owners[0]}" in line, line


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["start", "--max-cost-usd", "abc"], "argument --max-cost-usd: invalid float value: 'abc'"),
        (["start", "--max-total-tokens", "12k"], "argument --max-total-tokens: invalid int value: '12k'"),
        (["budget", "abcd", "--max-steps-per-turn", "1.5"], "argument --max-steps-per-turn: invalid int value: '1.5'"),
        (["start", "--context-window", "abc"], "argument --context-window: invalid int value: 'abc'"),
        (["start", "--on-budget", "maybe"], "argument --on-budget: invalid choice: 'maybe'"),
        (
            ["start", "--reexecute", "calculator=reuse"],
            "unrecognized arguments: --reexecute calculator=reuse; --reexecute is an option of loopwire fork, "
            "not of loopwire start",
        ),
        (["start", "--maxcost", "1"], "did you mean --max-cost-usd?"),
        (["send"], "error: loopwire send: the following arguments are required: LOOP, TEXT"),
        (["up", "--port", "70000"], "argument --port: a port from 0 to 65535, got '70000'"),
        (["console", "--port", "-1"], "argument --port: a port from 0 to 65535, got '-1'"),
        (["start", "--max-iterations", "-1"], "argument --max-iterations: a count of 0 or more, got '-1'"),
        (["history", "abcd", "--from", "0"], "argument --from: a stream sequence from 1, got '0'"),
        (["send", "abcd", "hi", "--timeout", "nan"], "argument --timeout: a finite number, got 'nan'"),
        (["demo", "--timeout", "0"], "argument --timeout: seconds above 0, got '0'"),
        (["demo", "--chunk-delay", "-1"], "argument --chunk-delay: seconds of 0 or more, got '-1'"),
    ],
)
def test_the_reported_lines(argv: list[str], says: str, capsys: pytest.CaptureFixture[str]) -> None:
    line = one_error_line(argv, capsys)
    assert says in line and line.endswith(f"({' '.join(['loopwire', *argv[:1]])} --help shows the usage)"), line
