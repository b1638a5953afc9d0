"""Query and path parameters of the console's API: loop ids and integers, checked as the API takes them."""

from __future__ import annotations

import re
from typing import Final

from starlette.requests import Request

from services.console.errors import invalid
from shared.validate import is_uuid
from shared.wiretypes import INT64_MAX, exact

# An integer as the API takes it: ASCII digits only (str.isdigit() and int() also take other
# scripts' digits, and int() not all that isdigit() takes), short enough that int() never refuses it.
INTEGER_BODY: Final = "-?[0-9]{1,19}"
_INTEGER: Final = re.compile(exact(INTEGER_BODY))


def integer(raw: str, name: str, *, low: int = 0, high: int = INT64_MAX) -> int:
    """``raw`` as an integer in ``[low, high]``; anything else is an ``invalid`` naming ``name``."""
    if not _INTEGER.search(raw):
        raise invalid(name, f"{name} must be an integer (ASCII digits)")
    value = int(raw)
    if not low <= value <= high:
        raise invalid(name, f"{name} must be between {low} and {high}")
    return value


def int_param(request: Request, name: str, default: int, *, low: int = 0, high: int = INT64_MAX) -> int:
    """The query parameter ``name`` as an integer; ``default`` when it is absent or empty."""
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    return integer(raw, name, low=low, high=high)


def loop_id_of(request: Request) -> str:
    """The ``{loop_id}`` of the path, a lowercase UUID."""
    loop_id = str(request.path_params["loop_id"])
    if not is_uuid(loop_id):
        raise invalid("loop_id", f"loop id {loop_id!r} is not a lowercase UUID")
    return loop_id
