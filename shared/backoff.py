"""Exponential backoff for retry loops: the one place their delays grow and their deadlines end them.

:class:`Backoff` paces a loop written by hand (its own exception handling); :func:`retry` is the
whole loop for the common case "call again while it raises one of these".
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import anyio

T = TypeVar("T")


class Backoff:
    """Delays ``first``, doubled after each wait up to ``cap``.

    With a deadline (``within`` seconds from now, or ``deadline`` on the :func:`anyio.current_time`
    clock) a wait that would end past it is not made: :meth:`fits` is False and :meth:`wait` returns
    False, and the caller gives up with its last error.
    """

    def __init__(
        self,
        first: float,
        cap: float,
        *,
        within: float | None = None,
        deadline: float | None = None,
        least: float = 0.0,
    ) -> None:
        self.delay = first
        self.cap = cap
        self.least = least  # the smallest delay after the first (a first delay of 0 still grows)
        self.deadline = anyio.current_time() + within if within is not None else deadline

    def fits(self) -> bool:
        """Would the next wait end by the deadline?"""
        return self.deadline is None or anyio.current_time() + self.delay <= self.deadline

    async def sleep(self) -> None:
        """Wait the current delay (whatever the deadline), then grow it."""
        await anyio.sleep(self.delay)
        self.delay = min(max(self.delay * 2, self.least), self.cap)

    async def wait(self) -> bool:
        """Wait the current delay and grow it, if that fits the deadline; else return False at once."""
        if not self.fits():
            return False
        await self.sleep()
        return True


async def retry(
    fn: Callable[[], Awaitable[T]],
    *,
    on: type[Exception] | tuple[type[Exception], ...],
    first: float,
    cap: float,
    within: float,
    before_wait: Callable[[Exception], None] | None = None,
) -> T:
    """``await fn()``, called again while it raises ``on`` for up to ``within`` seconds (then that error).

    ``before_wait(error)`` runs, inside the ``except`` block, before each wait (e.g. to log it).
    """
    started = time.monotonic()
    backoff: Backoff | None = None  # made at the first failure: most calls succeed at once
    while True:
        try:
            return await fn()
        except on as e:
            if backoff is None:
                backoff = Backoff(first, cap, within=within - (time.monotonic() - started))
            if not backoff.fits():
                raise
            if before_wait is not None:
                before_wait(e)
            await backoff.sleep()
