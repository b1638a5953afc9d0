"""Asking JetStream again while it does not answer: transient errors are asked again until the
deadline, then one JetStreamUnavailableError; any other error is raised at once."""

from __future__ import annotations

import anyio
import nats.errors
import nats.js.errors
import pytest

from shared.consumers import answered
from shared.jserrors import JetStreamUnavailableError

pytestmark = pytest.mark.anyio


async def test_a_request_unanswered_twice_is_asked_again_until_answered() -> None:
    calls = 0

    async def ask() -> int:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise nats.errors.TimeoutError
        return 7

    assert await answered("read S", ask, deadline=anyio.current_time() + 10) == 7
    assert calls == 3


async def test_an_error_that_will_not_go_away_is_raised_at_once() -> None:
    calls = 0

    async def ask() -> int:
        nonlocal calls
        calls += 1
        raise nats.js.errors.NotFoundError

    with pytest.raises(nats.js.errors.NotFoundError):
        await answered("read S", ask, deadline=anyio.current_time() + 10)
    assert calls == 1


async def test_past_the_deadline_it_is_jetstream_unavailable() -> None:
    async def ask() -> int:
        raise nats.js.errors.ServiceUnavailableError

    began = anyio.current_time()
    with pytest.raises(JetStreamUnavailableError, match=r"^cannot read S: JetStream did not answer for 0 s"):
        await answered("read S", ask, deadline=began + 0.3)
    assert anyio.current_time() - began < 1.0
