"""Where each append's chain link comes from: the stored record its OCC check is against.

The committer appends right after ``expected_last_seq`` (JetStream refuses it otherwise), so the
record at that sequence is the one the new records chain to. Its link is known without a read when
this process knows that very record (an LRU of each loop's last known record, keyed by the
sequence: a sequence is never reused, so an entry is never wrong, only missing): one it stored or
read, or one another committer stored and told (``Names.chain_tip``, sent once JetStream
acknowledged the record, so a loop's steps spread over several committers need no reads either).
Otherwise one leader read of that record gives it (after a restart, or a tip not heard yet). Any
number of committers alive at once stay correct: none trusts a link for anything but the record at
the sequence it names.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from typing import Final

import nats.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from shared.chain import START, Link, link_after
from shared.connection import subscribe_quick
from shared.shards import Home
from shared.streamreads import get_msg
from shared.subjects import Names

TIPS_KEPT: Final = 20_000  # one entry is about 430 bytes: at most ~9 MB for the loops being written


class ChainTips:
    """The last known (sequence, link) of each loop this process appended to or read."""

    def __init__(self, nc: NATS, names: Names, size: int = TIPS_KEPT) -> None:
        self._nc = nc
        self._names = names
        self._size = size
        self._tips: OrderedDict[str, tuple[int, Link]] = OrderedDict()

    def put(self, loop_id: str, seq: int, link: Link) -> None:
        known = self._tips.get(loop_id)
        if known is not None and known[0] > seq:
            return  # a newer record of the loop is known already (a tip told late)
        self._tips[loop_id] = (seq, link)
        self._tips.move_to_end(loop_id)
        while len(self._tips) > self._size:
            self._tips.popitem(last=False)

    async def stored(self, loop_id: str, seq: int, link: Link) -> None:
        """Keep the link of a record this process just stored, and tell the other committers."""
        self.put(loop_id, seq, link)
        tip = f"{seq} {link.index} {link.digest}".encode("ascii")
        with contextlib.suppress(nats.errors.Error):  # only a speed-up: else the next committer reads it
            await self._nc.publish(self._names.chain_tip(loop_id), tip)

    async def listen(self) -> Subscription:
        """Keep the tips other committers tell (a malformed one is ignored)."""

        def on_tip(m: Msg) -> None:
            parts = m.data.split(b" ")
            if len(parts) == 3 and parts[0].isdigit() and parts[1].isdigit() and len(parts[2]) == 64:
                link = Link(int(parts[1]), parts[2].decode("ascii", "replace"))
                self.put(self._names.loop_of_hist(m.subject), int(parts[0]), link)

        return await subscribe_quick(self._nc, self._names.chain_tip_all, on_tip)

    async def link_at(self, loop_id: str, home: Home, seq: int, *, request_timeout: float = 2.0) -> Link:
        """The link of the loop's record at ``seq`` (START for 0, a record without digest, or none).

        A record that is not the loop's (or not there) gets START: the append after it fails its
        OCC check anyway, since ``seq`` cannot then be the loop's last sequence.
        """
        if seq <= 0:
            return START
        known = self._tips.get(loop_id)
        if known is not None and known[0] == seq:
            self._tips.move_to_end(loop_id)
            return known[1]
        stored = await get_msg(self._nc, home.stream, seq=seq, request_timeout=request_timeout)
        if stored is None or stored.subject != home.subject:
            return START
        link = link_after(stored.headers)
        self.put(loop_id, seq, link)
        return link
