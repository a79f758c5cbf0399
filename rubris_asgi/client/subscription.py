"""What a consumer reads: subscriptions (with PushInfo and GapInfo) and streamed replies."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from .concurrency import _within
from .errors import SubscriptionEnded, _copy
from .stats import ClientStats

__all__ = ["GapInfo", "PushInfo", "Subscription"]

T = TypeVar("T")

QUEUE_SIZE = 10_000
"""Values a subscription without a callback keeps; items a streamed reply buffers; items a
queue consumer holds (:class:`~.consumer.Consumer`)."""
GAPS_KEPT = 1_000
"""``Subscription.gaps`` keeps the latest this many."""
NAK_LEVELS = (100, 87, 75, 50)
"""Fill percentages of a subscription queue at which NAK is sent (protocol.md section 8)."""


@dataclass(frozen=True)
class PushInfo:
    """Where a pushed value came from."""

    name: str
    topic: int
    seq: int
    compressed: bool


@dataclass(frozen=True)
class GapInfo:
    """Messages ``start … start+count-1`` of ``name`` will never arrive."""

    name: str
    start: int
    count: int


class _Topic:
    """What every subscribed topic has: the latest SUBSCRIBED, and the life of the subscription.

    :class:`Subscription` (PUSH topics) and :class:`~.consumer.Consumer` (queue topics) are
    both; the client keeps them in one table, so a reconnect subscribes both kinds again the
    same way.
    """

    def __init__(self, stats: ClientStats, name: str, params: bytes) -> None:
        self.name = name
        self.topic = 0
        self.mode = 0
        self.codec = 0
        self.epoch = 0
        self.head = 0
        self.recovered = False
        self.active = False  # between SUBSCRIBED and the end, and not waiting for a re-subscribe
        self.end_code: int | None = None
        self.end_reason = ""
        self._stats = stats  # the client's: counts go there, and it says whose this is
        self._params = params  # what every re-SUBSCRIBE carries
        # what SUBSCRIBE carries until the first SUBSCRIBED (params with ``last`` merged in): a
        # late joiner asks for history once; a re-subscribe goes on from epoch/since instead
        self._first_params: bytes | None = None
        self._wake = asyncio.Event()
        self._ended: BaseException | None = None
        self._wanted = True  # False once unsubscribe() (or a cancelled subscribe()) asked
        self._pending: asyncio.Future[None] | None = None  # subscribe() waiting for SUBSCRIBED
        self._unsub: asyncio.Future[None] | None = None  # unsubscribe() waiting

    @property
    def ended(self) -> bool:
        return self._ended is not None

    _nak_level = 0
    """The NAK level last sent for this topic's queue (``Subscription``, tables): 0 again once
    it is taken down to half."""

    async def _next_in(self, queue: deque[T], timeout: float | None) -> T:
        """The next of ``queue`` (a subscription's values, a table's changes): waits for one
        up to ``timeout`` s, raises the end once the queue is empty; a queue taken down to half
        says so (the NAK level goes back to 0)."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            if queue:
                item = queue.popleft()
                if self._nak_level and len(queue) * 2 < QUEUE_SIZE:
                    self._nak_level = 0
                return item
            if self._ended is not None:
                raise _copy(self._ended)
            self._wake.clear()
            if deadline is None:
                await self._wake.wait()
            else:
                await _within(self._wake.wait(), max(0.0, deadline - loop.time()))

    def _subscribe_params(self) -> bytes:
        """The params of the next SUBSCRIBE (``last`` only while never answered)."""
        return self._params if self._first_params is None else self._first_params

    def _end(self, exc: BaseException) -> None:
        if self._ended is None:
            self._ended = exc
            if isinstance(exc, SubscriptionEnded):
                self.end_code = exc.code
                self.end_reason = exc.reason
            else:
                self.end_code = 0
                self.end_reason = str(exc)
        self.active = False
        self._wake.set()
        unsub, self._unsub = self._unsub, None
        if unsub is not None and not unsub.done():
            unsub.set_result(None)


class Subscription(_Topic):
    """One subscribed topic. Without a callback it is an async iterator of ``(value, PushInfo)``.

    The attributes mirror the latest SUBSCRIBED (``topic``, ``mode``, ``codec``, ``epoch``,
    ``head``, ``recovered``) and are updated in place when a reconnect subscribes again, and
    when a resumed session restates a ring topic's position (``recovered`` then says whether
    the server still held everything after ``last_seq``); ``last_seq`` is the latest sequence
    number received (or named by a GAP), ``gaps`` the GAPs seen (latest :data:`GAPS_KEPT`).
    Iteration ends when the subscription ends (``end_code``/``end_reason`` say how); it raises
    :class:`ConnectionLost` when the client lost its connection for good.

    >>> async def show(sub: Subscription) -> None:  # doctest: +SKIP
    ...     value, info = await sub.get(timeout=5)
    ...     async for value, info in sub:
    ...         print(info.seq, value)
    """

    def __init__(
        self,
        stats: ClientStats,
        name: str,
        callback: Callable[[Any, PushInfo], Any] | None,
        params: bytes,
        on_gap: Callable[[GapInfo], Any] | None,
        last: int = 0,
        first_params: bytes | None = None,
    ) -> None:
        super().__init__(stats, name, params)
        self._first_params = first_params
        self._last = last  # the late joiner's n (protocol.md section 5), 0 when not asked
        self.last_seq = 0
        self.gaps: list[GapInfo] = []
        self._callback = callback
        self._on_gap = on_gap
        self._queue: deque[tuple[Any, PushInfo]] = deque()
        self._acked = 0  # private topics: the last upto sent in an ACK
        self._unacked = 0  # private topics: messages since that ACK
        self._ack_due = False  # a duplicate came: the server may have missed our ACK
        self._nak_level = 0

    def __repr__(self) -> str:
        return (
            f"Subscription({self.name!r}, topic={self.topic}, mode={self.mode},"
            f" last_seq={self.last_seq}, ended={self.ended})"
        )

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> tuple[Any, PushInfo]:
        try:
            return await self.get()
        except SubscriptionEnded:
            raise StopAsyncIteration from None

    async def get(self, timeout: float | None = None) -> tuple[Any, PushInfo]:
        """The next ``(value, PushInfo)``.

        Raises:
            asyncio.TimeoutError: nothing came within ``timeout`` seconds.
            SubscriptionEnded: the subscription is over and every value has been taken.
            ConnectionLost: the client lost its connection for good.
        """
        return await self._next_in(self._queue, timeout)

    def qsize(self) -> int:
        """Values waiting to be taken."""
        return len(self._queue)

    # the client's side

    def _put(self, value: Any, info: PushInfo) -> int:
        """Queue a value (dropping the oldest when full); returns a NAK level to send or 0."""
        q = self._queue
        if len(q) >= QUEUE_SIZE:
            q.popleft()
            self._stats.dropped += 1
        q.append((value, info))
        self._wake.set()
        fill = len(q) * 100 // QUEUE_SIZE
        for level in NAK_LEVELS:
            if fill >= level:
                if level > self._nak_level:
                    self._nak_level = level
                    return level
                break
        return 0


class _StreamBox:
    """Items of one streamed reply between the reader and the consumer; pushes back when full."""

    def __init__(self) -> None:
        self.items: deque[Any] = deque()
        self.readable = asyncio.Event()
        self.writable = asyncio.Event()
        self.done = False
        self.error: BaseException | None = None
        self.abandoned = False

    async def put(self, item: Any) -> None:
        while len(self.items) >= QUEUE_SIZE and not self.abandoned:
            self.writable.clear()
            await self.writable.wait()
        if not self.abandoned:
            self.items.append(item)
            self.readable.set()

    def finish(self, error: BaseException | None = None) -> None:
        if not self.done:
            self.done = True
            self.error = error
            self.readable.set()

    def abandon(self) -> None:
        self.abandoned = True
        self.writable.set()

    async def get(self) -> tuple[bool, Any]:
        while True:
            if self.items:
                item = self.items.popleft()
                self.writable.set()
                return True, item
            if self.done:
                if self.error is not None:
                    raise self.error
                return False, None
            self.readable.clear()
            await self.readable.wait()
