"""``Reach``: whether Redis answers, shared by every part of a node (the broker's writer and
reader, the queues), and the retry of a call until it does.

One part finding Redis away (``lost``) makes the whole node refuse publishes and items at
once (``up`` is False), instead of each part learning it on its own; one call getting through
(``answered``) ends every part's pause between attempts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from ..base import BrokerStats
from .nodes import REFUSING, RETRIED
from .pool import PoolBusy

log = logging.getLogger("rubris_asgi.broker")

RETRY = (0.05, 0.25)
"""Seconds between attempts while Redis is unreachable: first, most (doubling). Short enough
that a node takes publishes again within a quarter of a second of Redis answering; an attempt
on a Redis that is away costs a refused connection."""

T = TypeVar("T")


def end_if_cancelled() -> None:
    """Raise ``CancelledError`` when the running task was asked to stop. A loop that carries on
    after a failure calls this first: a cancel that arrives during a Redis command can come out
    as redis-py's own error instead of ``CancelledError``, and the loop, taking it for Redis
    away, would retry for ever while ``stop()`` waits for it."""
    task = asyncio.current_task()
    cancelling = getattr(task, "cancelling", None)  # Python 3.11+; on 3.10 the cancel stays lost
    if cancelling is not None and cancelling():
        raise asyncio.CancelledError


class Reach:
    """Whether Redis answered the latest call of any part of this node."""

    def __init__(self, counters: BrokerStats, what: str = "Redis") -> None:
        """``what``: the Redis this reach is of, as the log names it (a Redis Cluster's
        broker keeps one per partition)."""
        self.counters = counters
        self.what = what
        self.up = True
        """Whether Redis answered the latest call of any part of this node: publishes and
        items are refused while it did not."""
        self.reason: str | None = None
        """Why, while not ``up``: Redis unreachable, or refusing writes (and what it said)."""
        self._answered = asyncio.Event()
        """Set (and replaced) when Redis answers after an outage: retries pause no longer."""

    def lost(self, who: str, exc: BaseException) -> None:
        """A call of ``who`` found Redis away, or refusing writes (``REFUSING``): publishes
        and items are refused until any call gets through."""
        if isinstance(exc, REFUSING):
            self.reason = f"{self.what} refuses writes ({exc})"
        else:
            self.reason = f"{self.what} is unreachable ({exc or type(exc).__name__})"
        if self.up:
            self.up = False
            self.counters.outages += 1
            log.warning("%s, seen by the %s; publishes refused until it is back", self.reason, who)

    def answered(self) -> None:
        """A call got through: Redis is back for every part of the node, whose retries
        stop pausing."""
        if not self.up:
            self.up = True
            self.reason = None
            log.warning("%s answers again: publishes taken", self.what)
        answered, self._answered = self._answered, asyncio.Event()
        answered.set()

    async def pause(self, delay: float) -> None:
        """Sleep ``delay`` seconds between attempts, or less if Redis answers meanwhile."""
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._answered.wait(), delay)

    async def until_answered(self, call: Callable[[], Awaitable[T]], who: str) -> T:
        """Await ``call()`` until Redis answers it (``call`` must be safe to repeat: the
        scripts answer a repeat from their first run). A failure (``RETRIED``: Redis away, or
        refusing writes) marks Redis away (``lost``)
        and the call is tried again after a pause (``RETRY``); ``PoolBusy`` only waited for a
        connection of this node's, so it is tried again after the shortest pause, Redis not
        taken for away."""
        delay = RETRY[0]
        while True:
            try:
                answer = await call()
            except PoolBusy:
                end_if_cancelled()
                # it waited pool_timeout, as a rule; but a retry never goes round without
                # awaiting: one that did (a permit leak made PoolBusy come at once) held the
                # event loop for good and froze the node
                await asyncio.sleep(RETRY[0])
                continue
            except RETRIED as exc:
                end_if_cancelled()
                self.lost(who, exc)
                await self.pause(delay)
                delay = min(2 * delay, RETRY[1])
                continue
            if not self.up:
                self.answered()
            return answer
