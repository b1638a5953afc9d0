"""The one service lifecycle (services.lifecycle): started, cancelled → drained, errors as themselves."""

from __future__ import annotations

import anyio
import pytest
from anyio.abc import TaskStatus

from services.lifecycle import drain_on_cancel

pytestmark = pytest.mark.anyio


class Draining:
    """A service whose stop lets its work in flight finish."""

    def __init__(self, startup: float = 0.0, fail: Exception | None = None, end_by_itself: bool = False) -> None:
        self.startup = startup
        self.fail = fail
        self.end_by_itself = end_by_itself
        self.steps: list[str] = []

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        await drain_on_cancel(self._serve, task_status=task_status)

    async def _serve(self, stop: anyio.Event, task_status: TaskStatus[None]) -> None:
        await anyio.sleep(self.startup)
        if self.fail is not None:
            raise self.fail
        task_status.started()
        self.steps.append("serving")
        if not self.end_by_itself:
            await stop.wait()
        self.steps.append("draining")
        await anyio.sleep(0.05)  # work in flight: a cancellation must not cut it
        self.steps.append("drained")


async def test_a_cancellation_drains_before_run_returns() -> None:
    svc = Draining()
    async with anyio.create_task_group() as tg:
        await tg.start(svc.run)
        assert svc.steps == ["serving"]
        tg.cancel_scope.cancel()
    assert svc.steps == ["serving", "draining", "drained"]


async def test_a_cancellation_during_start_up_stops_once_it_is_up() -> None:
    svc = Draining(startup=0.1)
    with anyio.move_on_after(0.02):
        await svc.run()
    assert svc.steps == ["serving", "draining", "drained"]


async def test_a_start_up_error_is_raised_as_itself() -> None:
    svc = Draining(fail=ValueError("no"))
    async with anyio.create_task_group() as tg:
        with pytest.raises(ValueError, match="no"):
            await tg.start(svc.run)


async def test_a_service_that_ends_by_itself_ends_run() -> None:
    svc = Draining(end_by_itself=True)
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            await tg.start(svc.run)
    assert svc.steps == ["serving", "draining", "drained"]
