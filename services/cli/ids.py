"""Ids on the command line: gate ids are whole UUIDs; a loop may be named by a unique prefix of its id."""

from __future__ import annotations

import re
from typing import Final

from nats.aio.client import Client as NATS

from services.cli.errors import CliError
from services.cli.render import short
from shared.replay import loops
from shared.settings import Settings
from shared.validate import is_uuid


def require_uuid(value: str, what: str) -> str:
    """``value`` as a canonical (lowercase) UUID; any case is taken, as ids are copied from anywhere."""
    lowered = value.strip().lower()
    if not is_uuid(lowered):
        raise CliError(f"{what} must be a UUID, got {value!r}")
    return lowered


_ID_PREFIX: Final = re.compile(r"[0-9a-f][0-9a-f-]{3,35}")


def loop_ref(value: str, what: str) -> str:
    """A loop id as the user gave it, checked: a UUID or a unique prefix of one (at least 4 characters,
    as tables show the first 8), any case. :func:`resolve_loop` finds the loop a prefix names."""
    lowered = value.strip().lower()
    if is_uuid(lowered) or _ID_PREFIX.fullmatch(lowered):
        return lowered
    raise CliError(f"{what} must be a loop id or the start of one (4+ of 0-9 a-f), got {value!r}")


async def resolve_loop(nc: NATS, settings: Settings, ref: str, what: str = "LOOP") -> str:
    """The loop id ``ref`` names: itself when whole, else the one loop whose id starts with it."""
    if is_uuid(ref):
        return ref
    found = [loop_id for loop_id in await loops(nc, settings.names) if loop_id.startswith(ref)]
    if not found:
        raise CliError(f"{what}: no loop id starts with {ref!r} (loopwire loops lists them)")
    if len(found) > 1:
        some = ", ".join(short(x) for x in found[:4]) + (", ..." if len(found) > 4 else "")
        raise CliError(f"{what}: {len(found)} loop ids start with {ref!r} ({some}): give more of it")
    return found[0]
