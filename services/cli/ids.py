"""Ids on the command line: a loop or a gate may be named by its whole UUID or by a unique prefix of it
(at least 4 characters, as tables show the first 8), in any case."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Final

from nats.aio.client import Client as NATS

from services.cli.errors import CliError
from services.cli.render import short
from shared import shards
from shared.replay import loops
from shared.settings import Settings
from shared.streamreads import get_msg
from shared.validate import is_uuid


def require_uuid(value: str, what: str) -> str:
    """``value`` as a canonical (lowercase) UUID; any case is taken, as ids are copied from anywhere."""
    lowered = value.strip().lower()
    if not is_uuid(lowered):
        raise CliError(f"{what} must be a UUID, got {value!r}")
    return lowered


_ID_PREFIX: Final = re.compile(r"[0-9a-f][0-9a-f-]{3,35}")


def id_ref(value: str, what: str, noun: str) -> str:
    """An id as the user gave it, checked: a UUID or the start of one (4+ characters), lowercased."""
    lowered = value.strip().lower()
    if is_uuid(lowered) or _ID_PREFIX.fullmatch(lowered):
        return lowered
    raise CliError(f"{what} must be a {noun} id or the start of one (4+ of 0-9 a-f), got {value!r}")


def loop_ref(value: str, what: str) -> str:
    """A loop id or a prefix of one, checked; :func:`resolve_loop` finds the loop a prefix names."""
    return id_ref(value, what, "loop")


def gate_ref(value: str, what: str = "GATE") -> str:
    """A gate id or a prefix of one, checked; the gate commands find the gate a prefix names."""
    return id_ref(value, what, "gate")


def pick(ref: str, ids: Iterable[str], what: str, noun: str, listed_by: str) -> str:
    """The one id of ``ids`` that starts with ``ref``; none or several is a :class:`CliError`."""
    found = sorted({x for x in ids if x.startswith(ref)})
    if not found:
        raise CliError(f"{what}: no {noun} id starts with {ref!r} ({listed_by} lists them)")
    if len(found) > 1:
        some = ", ".join(short(x) for x in found[:4]) + (", ..." if len(found) > 4 else "")
        raise CliError(f"{what}: {len(found)} {noun} ids start with {ref!r} ({some}): give more of it")
    return found[0]


async def resolve_loop(nc: NATS, settings: Settings, ref: str, what: str = "LOOP") -> str:
    """The loop id ``ref`` names: itself when whole, else the one loop whose id starts with it."""
    if is_uuid(ref):
        return ref
    return pick(ref, await loops(nc, settings.names), what, "loop", "loopwire loops")


async def require_known_loop(nc: NATS, settings: Settings, loop_id: str, what: str = "LOOP") -> None:
    """``loop_id`` has committed records: a command that would only watch an unknown loop says so instead
    (one read of the loop's last record)."""
    home = await shards.home_of(nc, settings.names, loop_id)
    if await get_msg(nc, home.stream, last_by_subj=home.subject) is None:
        raise CliError(f"{what}: no loop {loop_id} (never started; loopwire loops lists them)")
