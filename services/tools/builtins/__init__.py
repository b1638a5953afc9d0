"""The built-in tools, by name. Each can run as its own worker: ``python -m services.tools <name>``."""

from __future__ import annotations

from typing import Final

from services.tools.builtins.ask_user import ask_user
from services.tools.builtins.calculator import calculator
from services.tools.builtins.clock import clock
from services.tools.builtins.files import list_dir, read_file
from services.tools.builtins.http_get import http_get
from services.tools.builtins.kv_memory import kv_memory
from services.tools.builtins.sleep import sleep
from services.tools.sdk import Tool

BUILTINS: Final[dict[str, Tool]] = {
    t.name: t for t in (calculator, clock, kv_memory, read_file, list_dir, http_get, sleep, ask_user)
}

__all__ = ["BUILTINS"]
