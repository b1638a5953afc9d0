"""Drive slots: a drive waiting on long calls gives its slot back (within the pool's bound) and takes
one again before it goes on; short calls keep theirs."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import pytest

from services.model_step.slots import STEP_OUT_AFTER_SECONDS, Slot, SlotPool

pytestmark = pytest.mark.anyio

LONG = STEP_OUT_AFTER_SECONDS + 0.4


@asynccontextmanager
async def running(pool: SlotPool) -> AsyncIterator[None]:
    async with anyio.create_task_group() as tg:
        tg.start_soon(pool.run)
        yield
        tg.cancel_scope.cancel()


async def taken(pool: SlotPool) -> Slot:
    """A slot as a pull loop takes it for an item."""
    await pool.free.acquire()
    return pool.slot()


async def test_a_long_wait_gives_the_slot_back_and_takes_it_again() -> None:
    pool = SlotPool(1, 4)
    async with running(pool):
        slot = await taken(pool)
        async with slot.waiting():
            await anyio.sleep(LONG)
            assert (pool.free.value, pool.waiting, slot.held) == (1, 1, False)
        assert (pool.free.value, pool.waiting, slot.held) == (0, 0, True)
        slot.release()
        assert pool.free.value == 1


async def test_a_short_call_keeps_its_slot() -> None:
    pool = SlotPool(1, 4)
    async with running(pool):
        slot = await taken(pool)
        async with slot.waiting():
            await anyio.sleep(STEP_OUT_AFTER_SECONDS / 5)
        assert (pool.free.value, pool.waiting, slot.held) == (0, 0, True)


async def test_at_most_the_bound_wait_outside_their_slots() -> None:
    pool = SlotPool(3, 1)
    async with running(pool):
        slots = [await taken(pool) for _ in range(2)]

        async def wait(slot: Slot) -> None:
            async with slot.waiting():
                await anyio.sleep(LONG + 0.3)

        async with anyio.create_task_group() as tg:
            for slot in slots:
                tg.start_soon(wait, slot)
            await anyio.sleep(LONG)
            assert (pool.waiting, pool.free.value) == (1, 2)  # one of the two waits in its slot
        assert sorted(s.held for s in slots) == [True, True] and pool.free.value == 1


async def test_a_wait_cut_short_leaves_the_slot_to_take() -> None:
    pool = SlotPool(1, 4)
    async with running(pool):
        slot = await taken(pool)
        with anyio.move_on_after(LONG):
            async with slot.waiting():
                await anyio.sleep(10)
        assert (pool.free.value, pool.waiting, slot.held) == (1, 0, False)
        await slot.take()
        assert (pool.free.value, slot.held) == (0, True)
        slot.release()
        slot.release()  # a handler's end releases only what it holds
        assert pool.free.value == 1
