"""Where each append's chain link comes from: the stored record its OCC check is against.

The committer appends right after ``expected_last_seq`` (JetStream refuses it otherwise), so the
record at that sequence is the one the new records chain to. Its link is known without a read when
this process stored or read that very record (an LRU of each loop's last known record, keyed by
the sequence: a sequence is never reused, so an entry is never wrong, only missing); otherwise one
leader read of that record gives it (after a restart, or when another committer wrote it). Any
number of committers alive at once stay correct: none trusts its memory for anything but the
record at the sequence it names.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Final

from nats.aio.client import Client as NATS

from shared.chain import START, Link, link_after
from shared.shards import Home
from shared.streamreads import get_msg

TIPS_KEPT: Final = 100_000  # one entry is about 200 bytes


class ChainTips:
    """The last known (sequence, link) of each loop this process appended to or read."""

    def __init__(self, nc: NATS, size: int = TIPS_KEPT) -> None:
        self._nc = nc
        self._size = size
        self._tips: OrderedDict[str, tuple[int, Link]] = OrderedDict()

    def put(self, loop_id: str, seq: int, link: Link) -> None:
        self._tips[loop_id] = (seq, link)
        self._tips.move_to_end(loop_id)
        while len(self._tips) > self._size:
            self._tips.popitem(last=False)

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
