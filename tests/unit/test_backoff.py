"""The backoff helper: delays double up to the cap, and a wait past the deadline is never made."""

from __future__ import annotations

import anyio
import pytest

from shared.backoff import Backoff, retry

pytestmark = pytest.mark.anyio


async def test_delays_double_up_to_the_cap() -> None:
    b = Backoff(0.001, 0.004)
    seen = []
    for _ in range(4):
        seen.append(b.delay)
        assert await b.wait()
    assert seen == [0.001, 0.002, 0.004, 0.004]


async def test_a_wait_past_the_deadline_is_refused_at_once() -> None:
    b = Backoff(10.0, 10.0, within=1.0)
    began = anyio.current_time()
    assert not b.fits()
    assert not await b.wait()
    assert anyio.current_time() - began < 0.5
    assert Backoff(0.01, 0.01, deadline=anyio.current_time() + 1.0).fits()


async def test_retry_returns_once_the_call_succeeds() -> None:
    calls: list[int] = []
    errors: list[Exception] = []

    async def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionError("not yet")
        return "done"

    assert (
        await retry(flaky, on=ConnectionError, first=0.001, cap=0.002, within=5.0, before_wait=errors.append) == "done"
    )
    assert len(calls) == 3 and len(errors) == 2


async def test_retry_gives_up_with_the_last_error_and_lets_others_through() -> None:
    calls: list[int] = []

    async def down() -> None:
        calls.append(1)
        raise ConnectionError(f"attempt {len(calls)}")

    with pytest.raises(ConnectionError, match="attempt"):
        await retry(down, on=ConnectionError, first=0.01, cap=0.02, within=0.05)
    assert 2 <= len(calls) <= 5

    async def broken() -> None:
        raise ValueError("not retried")

    with pytest.raises(ValueError):
        await retry(broken, on=ConnectionError, first=0.01, cap=0.01, within=5.0)
