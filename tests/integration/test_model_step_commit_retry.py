"""An unanswered commit may have been stored: the model-step retries it with the same event ids."""

from __future__ import annotations

import msgspec
import pytest
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from services.model_step.drive import Drive
from services.model_step.driver import LoopDriver
from shared import events as ev
from shared.client import CommitClient
from shared.events import Event, make, new_id
from shared.history import LoopHistory
from shared.protocol import CommitReply, CommitRequest, ErrorBody, encode
from shared.settings import Settings

pytestmark = pytest.mark.anyio


async def test_an_unavailable_commit_is_retried_with_the_same_events(settings: Settings, nc: NATS) -> None:
    loop_id = new_id()
    attempts: list[list[str]] = []

    async def committer(msg: Msg) -> None:
        # A committer that times out the first attempt (its reply says "unavailable"), then stores it.
        req = msgspec.json.decode(msg.data, type=CommitRequest)
        attempts.append([msgspec.json.decode(bytes(e))["event_id"] for e in req.events])
        if len(attempts) == 1:
            reply = CommitReply(ok=False, error=ErrorBody(kind="unavailable", message="no ack within 10s"))
        else:
            reply = CommitReply(ok=True, seqs=[1, 2], last_seq=2)
        await msg.respond(encode(reply))

    await nc.subscribe(settings.names.commit(loop_id), cb=committer)
    driver = LoopDriver(
        nc=nc, settings=settings, commits=CommitClient(nc, settings.names), models=None, tools=None, execute=None
    )
    builds = 0

    def build(_h: LoopHistory) -> list[Event]:
        nonlocal builds
        builds += 1  # a rebuild would mint new event ids
        return [make(ev.LoopIdle, loop_id=loop_id), make(ev.LoopIdle, loop_id=loop_id)]

    await Drive(driver, loop_id, None).commit(LoopHistory(loop_id=loop_id), build)
    assert len(attempts) == 2 and attempts[0] == attempts[1]
    assert builds == 1
