"""A fork in another shard than its source's does not depend on the source's shard once written.

The fork's first record carries what its source had done after the fork point, so its later steps
(and the re-execution decisions they take) complete with the source's stream gone. One nats-server,
three shards; every service its own process; checked from the stored records and the ledger.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from nats.aio.client import Client as NATS

from shared import events as ev
from shared.client import LoopClient
from shared.content import ToolResultMessage, text_of
from shared.natsserver import NatsServer
from shared.settings import Settings
from tests.syshelpers import history, wait_history
from tests.system.faultscript import write_model
from tests.system.test_fork import _call, finished, ledger_runs, ledger_stack

pytestmark = [pytest.mark.anyio, pytest.mark.system, pytest.mark.timeout(240)]


@pytest.fixture
async def env(nats_server: NatsServer, tmp_path: Path) -> AsyncIterator[tuple[NATS, Settings, LoopClient, Path]]:
    async with ledger_stack(nats_server, tmp_path, {"LW_SHARDS": "3"}) as stack:
        yield stack


def _id_in(settings: Settings, shard: int) -> str:
    return next(i for i in (str(uuid.uuid4()) for _ in range(1000)) if settings.names.shard_of(i) == shard)


async def test_a_fork_takes_its_sources_results_with_the_sources_shard_gone(
    env: tuple[NATS, Settings, LoopClient, Path], tmp_path: Path
) -> None:
    nc, settings, api, ledger = env
    # Turn 1 answers; turn 2 calls the ledger (after the fork point below) and answers.
    model = write_model(tmp_path, {"responses": ["one done", _call("ledger", "x"), "two done"]}, "m.json")
    source = (await api.start(_id_in(settings, 1), model=model)).loop_id
    await api.input(source, "one")
    await wait_history(nc, settings, source, lambda h: finished(h) and h.turns == 1, timeout=60)
    at = max(s for s, e in await history(nc, settings, source) if isinstance(e, ev.TurnDone))
    await api.input(source, "two")
    await wait_history(nc, settings, source, lambda h: finished(h) and h.turns == 2, timeout=60)
    assert ledger_runs(ledger, "ledger") == 1
    # The fork rests at the end of turn 1, in shard 2: nothing of it runs before its next input.
    fork = (await api.fork(source, at=at, reexecution={"ledger": "reuse"}, loop_id=_id_in(settings, 2))).loop_id
    first = (await history(nc, settings, fork))[0][1]
    assert isinstance(first, ev.LoopForked) and first.source_calls is not None
    assert [c.name for c in first.source_calls.calls] == ["ledger"] and not first.source_calls.busy

    await nc.jetstream().delete_stream(settings.names.history_stream_of(1))  # the source's shard is gone

    await api.input(fork, "two")
    h = await wait_history(nc, settings, fork, lambda h: finished(h) and h.turns == 2, timeout=60)
    # The repeated call took the source's recorded result (reuse): nothing ran again.
    assert ledger_runs(ledger, "ledger") == 1
    assert [text_of(m) for m in h.messages if isinstance(m, ToolResultMessage)] == ["recorded x"]
    assert text_of(h.messages[-1]) == "two done"
