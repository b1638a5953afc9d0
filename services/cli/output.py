"""Where the commands print: plain lines and rich tables."""

from __future__ import annotations

import os
import sys

from rich.console import Console
from rich.text import Text


def make_console() -> Console:
    # Off a terminal rich assumes 80 columns; history tables read better wider.
    wide = not sys.stdout.isatty() and not os.environ.get("COLUMNS")
    return Console(highlight=False, soft_wrap=False, width=120 if wide else None)


def cells(*values: str) -> list[Text]:
    """Table cells as plain text: never parsed as rich markup (model text contains [brackets])."""
    return [Text(v) for v in values]


def out(line: str) -> None:
    print(line, flush=True)
