"""The pieces every sub-command's parser is made of: the help formatter, the connection and --json
options, and one sub-command with its examples (the parser itself is :mod:`services.cli.app`)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeAlias

from services.cli.helpexamples import epilog
from services.cli.parsing import Parser

Handler = Callable[[argparse.Namespace], int]
if TYPE_CHECKING:
    Commands: TypeAlias = argparse._SubParsersAction[Parser]


class Formatter(argparse.RawDescriptionHelpFormatter):
    def __init__(self, prog: str) -> None:
        super().__init__(prog, max_help_position=32, width=min(100, max(60, columns())))


def columns() -> int:
    try:
        return int(os.environ.get("COLUMNS", "")) or os.get_terminal_size().columns
    except (ValueError, OSError):
        return 100


def connection_options(parser: argparse.ArgumentParser, *, top: bool) -> None:
    # On sub-commands the defaults are SUPPRESSed, so `loopwire --nats-url X history ...` and
    # `loopwire history ... --nats-url X` both work.
    default = None if top else argparse.SUPPRESS
    parser.add_argument(
        "--nats-url", metavar="URL", default=default, help="NATS server URL(s), comma-separated (env LW_NATS_URL)"
    )
    parser.add_argument("--prefix", default=default, help="subject/stream prefix (env LW_PREFIX, default lw)")


def json_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON (one object per line) instead of text")


def command(sub: Commands, name: str, help_: str, description: str = "", *, connects: bool = True) -> Parser:
    p: Parser = sub.add_parser(
        name, help=help_, description=description or help_, epilog=epilog(name), formatter_class=Formatter
    )
    if connects:
        connection_options(p, top=False)
    return p
