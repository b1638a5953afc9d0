"""Every command's ``--help`` ends with examples of that command, and every example is a valid command line."""

from __future__ import annotations

import argparse
import re
import shlex

import pytest

from services.cli import build_parser
from services.cli.app import parse_args
from services.cli.parsing import parsers

COMMANDS = [p.prog.removeprefix("loopwire ") for p in parsers(build_parser()) if p.prog != "loopwire"]


def _help(command: str, capsys: pytest.CaptureFixture[str]) -> str:
    capsys.readouterr()
    with pytest.raises(SystemExit):
        build_parser().parse_args([*command.split(), "--help"])
    return capsys.readouterr().out


def _examples(help_text: str) -> list[str]:
    assert "\nexamples:\n" in help_text, help_text
    section = help_text[help_text.index("\nexamples:\n") + 11 :]
    return [line.strip() for line in section.splitlines() if line.strip() and not line.strip().startswith("#")]


def _argv(example: str) -> list[str]:
    """The words after ``loopwire``, without the shell around them (VAR=$(...), redirections)."""
    command = example[example.index("loopwire ") :] if "loopwire " in example else example[example.index("loopwire") :]
    command = re.split(r"\s[<>|]\s|\)$", command)[0]
    return shlex.split(command)[1:]


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_s_help_ends_with_examples_of_it(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    examples = _examples(_help(command, capsys))
    assert examples
    for example in examples:
        argv = _argv(example)
        args: argparse.Namespace = parse_args(argv)  # a valid command line (SystemExit otherwise)
        chosen = f"serve {args.service}" if hasattr(args, "service") else args.command
        assert command.startswith(chosen) or chosen.startswith(command), (command, example)
        assert f"loopwire {command}" in example or command.startswith("serve"), (command, example)


def test_the_main_commands_are_covered() -> None:
    main = {"demo", "up", "serve", "console", "start", "send", "history", "tail", "loops", "gates", "approve", "deny"}
    assert main | {"fork", "serve agent", "serve mcp"} <= set(COMMANDS)
