"""Work signals: a purge removes only the signals up to the sequence it names."""

from __future__ import annotations

import pytest
from nats.aio.client import Client as NATS

from shared.bus import ensure_all, get_msg, purge_work, signal_work
from shared.events import new_id
from shared.settings import Settings

pytestmark = pytest.mark.anyio


async def _pending(nc: NATS, settings: Settings, loop_id: str) -> int:
    """The stream sequence of the loop's pending signal (0: none)."""
    m = await get_msg(nc, settings.names.work_stream, last_by_subj=settings.names.work(loop_id))
    return m.seq if m is not None else 0


async def test_a_purge_keeps_a_signal_published_after_the_sequence_it_names(settings: Settings, nc: NATS) -> None:
    await ensure_all(nc.jetstream(timeout=10), settings)
    a, b = new_id(), new_id()
    await signal_work(nc, settings.names, a, within=2)
    await signal_work(nc, settings.names, b, within=2)
    first = await _pending(nc, settings, a)
    assert first > 0

    # A later signal for the same loop replaces the first one; a purge that names the first one's
    # sequence (what a replica saw during its drive) must leave the later one in place.
    await signal_work(nc, settings.names, a, within=2)
    later = await _pending(nc, settings, a)
    assert later > first
    assert await purge_work(nc, settings.names, a, through_seq=first) == 0
    assert await _pending(nc, settings, a) == later

    assert await purge_work(nc, settings.names, a, through_seq=later) == 1
    assert await _pending(nc, settings, a) == 0
    assert await _pending(nc, settings, b) > 0  # another loop's signal is untouched
