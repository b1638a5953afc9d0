"""Where a loop's history lives in a sharded deployment, and the layout record of the shards.

A loop's history lives in its hash shard (:meth:`Names.shard_of`), except in a deployment that grew
from one shard: its loops from before stay in shard 0's stream (``LW_HISTORY``, unchanged), where they
are read and driven as before. :func:`home_of` finds the stream: the hash shard when it holds the loop,
else shard 0 when the deployment grew and shard 0 holds it, else (a loop not started yet) the hash
shard. A home never changes, so homes are kept for the life of the process. With one shard nothing
is read.

The shard count is chosen once: shard 0's history stream records it in its metadata
(:data:`META_SHARDS`), and a service started with another ``LW_SHARDS`` refuses to start. Growing from
one shard is the one change allowed; it is recorded too (:data:`META_GREW`).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Final

import nats.js.errors
from nats.aio.client import Client as NATS

from shared.streamreads import get_msg
from shared.subjects import Names

META_SHARDS: Final = "loopwire_shards"
META_GREW: Final = "loopwire_grown_from_one_shard"
# Homes kept per process (one entry is about 200 bytes).
HOMES_KEPT: Final = 200_000


@dataclass(frozen=True, slots=True)
class Home:
    """The stream a loop's history is in, and its subject there."""

    shard: int
    stream: str
    subject: str


def home_in(names: Names, shard: int, loop_id: str) -> Home:
    return Home(shard, names.history_stream_of(shard), names.hist_in(shard, loop_id))


_homes: OrderedDict[tuple[Names, str], int] = OrderedDict()
_grew: dict[Names, bool] = {}


def remember(names: Names, loop_id: str, shard: int) -> None:
    """Keep a loop's home (its history was just read or written there)."""
    if names.shards == 1:
        return
    _homes[(names, loop_id)] = shard
    if len(_homes) > HOMES_KEPT:
        _homes.popitem(last=False)


def grew(names: Names, grown: bool) -> None:
    """Record whether the deployment grew from one shard (read from shard 0's stream at start)."""
    _grew[names] = grown


async def _grown(nc: NATS, names: Names) -> bool:
    known = _grew.get(names)
    if known is not None:
        return known
    try:
        info = await nc.jetstream().stream_info(names.history_stream_of(0))
    except (nats.js.errors.Error, nats.errors.Error):
        return True  # not known yet: look in shard 0 too, which only costs a read
    grown = (info.config.metadata or {}).get(META_GREW) == "1"
    _grew[names] = grown
    return grown


async def home_of(nc: NATS, names: Names, loop_id: str) -> Home:
    """The stream holding ``loop_id``'s history (or, for a loop not started yet, the one that will)."""
    shard = names.shard_of(loop_id)
    if names.shards == 1 or shard == 0:
        return home_in(names, shard, loop_id)
    known = _homes.get((names, loop_id))
    if known is not None:
        return home_in(names, known, loop_id)
    own = home_in(names, shard, loop_id)
    if await get_msg(nc, own.stream, last_by_subj=own.subject) is not None:
        remember(names, loop_id, shard)
        return own
    if await _grown(nc, names):
        old = home_in(names, 0, loop_id)
        if await get_msg(nc, old.stream, last_by_subj=old.subject) is not None:
            remember(names, loop_id, 0)
            return old
    remember(names, loop_id, shard)  # a loop in neither stream is new: its home can only be its own shard
    return own


@dataclass(frozen=True, slots=True)
class HistoryStream:
    """One shard's history stream and the filter that takes all of its loops."""

    shard: int
    stream: str
    subjects: str


def history_streams(names: Names) -> list[HistoryStream]:
    """Every history stream of the deployment: a consumer of every loop follows each of them."""
    return [HistoryStream(k, names.history_stream_of(k), names.hist_all_of(k)) for k in names.shard_ids]
