"""Keyed topics (live tables) as the client holds them (protocol.md section 5b).

:meth:`Client.subscribe_table` returns a :class:`TableSubscription`: its ``table`` (a read-only
:class:`~.table.Table`) is kept current by the ENTRY messages the reader folds into it (the
``_ServerMessages`` mixin of :mod:`.handlers`), and each change is handed to a callback or
queued for iteration. :class:`~.presence.Presence` is a table too, of the members of a topic.

A table goes on across reconnects as a ring does: a resuming client restates its epoch and last
seq (``table.seq``) in the frame of its HELLO, a new session subscribes again with them (the
``_Supervisor`` mixin of :mod:`.supervisor`), and the server answers with the keys changed since
(``recovered``) or, when it cannot, RESET and the whole table; either way ``table`` ends equal
to the server's.
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from collections.abc import Callable
from typing import Any, TypeVar

import orjson

from .concurrency import _invoke, _within
from .errors import SubscriptionEnded, _copy
from .stats import ClientStats
from .subscription import NAK_LEVELS, QUEUE_SIZE, Subscription, _Topic
from .table import Change, Table

__all__ = ["TableSubscription"]

_Leave = Callable[[_Topic], "asyncio.Future[None]"]
T = TypeVar("T", bound="_Table")


def _rate_params(max_rate: float | None) -> dict[str, float]:
    """``{"max_rate": r}`` for SUBSCRIBE params (empty without one), checked here: the server
    would refuse a bad one with code 1, far from the call that made it."""
    if max_rate is None:
        return {}
    if (
        isinstance(max_rate, bool)
        or not isinstance(max_rate, (int, float))
        or not math.isfinite(max_rate)
        or not max_rate > 0
    ):
        raise ValueError(
            f"max_rate must be a finite number > 0 (messages a second), got {max_rate!r}"
        )
    return {"max_rate": max_rate}


def _since(sub: _Topic) -> int:
    """The last seq a subscription holds: what a SUBSCRIBE restating it carries as ``since``."""
    if isinstance(sub, _Table):
        return sub.table.seq
    if isinstance(sub, Subscription):
        return sub.last_seq
    return 0


class _Table(_Topic):
    """A subscription to a keyed topic: its :class:`Table`, and the life every subscription
    has. The reader hands each ENTRY to :meth:`_entry`; what the application sees of the
    changes is the subclass's."""

    def __init__(self, stats: ClientStats, name: str, params: bytes, leave: _Leave) -> None:
        super().__init__(stats, name, params)
        self.table = Table(name)
        self._leave = leave  # the client's: UNSUBSCRIBE, and a future for UNSUBSCRIBED

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.name!r}, topic={self.topic}, keys={len(self.table)},"
            f" seq={self.table.seq}, synced={self.synced}, ended={self.ended})"
        )

    @property
    def synced(self) -> bool:
        """Whether the table is whole: its first state (or the state after a RESET) has come
        to its end (SYNCED). A resume that recovers keeps it so."""
        return self.table.synced

    async def wait_synced(self, timeout: float | None = None) -> None:
        """Return once :attr:`synced` (at once if it is).

        Raises:
            asyncio.TimeoutError: not synced within ``timeout`` seconds.
            SubscriptionEnded: the subscription ended first.
            ConnectionLost: the client lost its connection for good first.
        """
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while not self.table.synced:
            if self._ended is not None:
                raise _copy(self._ended)
            self._wake.clear()
            if deadline is None:
                await self._wake.wait()
            else:
                await _within(self._wake.wait(), max(0.0, deadline - loop.time()))

    async def unsubscribe(self) -> None:
        """UNSUBSCRIBE and wait for UNSUBSCRIBED (or the end of the session); the table keeps
        what it held. Safe to call twice; ``client.unsubscribe(sub)`` does the same."""
        if not self.ended:
            await asyncio.shield(self._leave(self))

    async def close(self) -> None:
        """The same as :meth:`unsubscribe` (as :meth:`Consumer.close`)."""
        await self.unsubscribe()

    async def __aenter__(self: T) -> T:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.unsubscribe()

    async def _entry(self, seq: int, op: int, key: str, value: Any) -> int:
        """One ENTRY, its payload decoded; returns a NAK level to send, or 0."""
        raise NotImplementedError


class TableSubscription(_Table):
    """A keyed topic, subscribed: :attr:`table` is its entries, kept current.

    ``table`` is a read-only mapping of key to value (``dict(sub.table)`` or
    ``sub.table.snapshot()`` copies it); :attr:`synced` says it is whole, :meth:`wait_synced`
    waits for that. Each change is a :class:`Change` (``key``, ``op``, ``value``, ``seq``):
    ``"set"``, ``"patch"`` (``value`` the entry's new whole value), ``"delete"`` (``value`` the
    one it had), ``"reset"`` (the table was emptied: the server could not say what changed,
    the whole table follows as sets) and ``"synced"`` (the table is whole as of ``seq``).

    With ``on_change`` each change goes to it (sync or async, in the reader, in the order of
    the wire: the table already holds the change when it runs). Without, iterate:
    ``async for change in sub``. The changes wait in a queue of at most :data:`QUEUE_SIZE`
    from the subscribe on (so an iteration started after ``subscribe_table`` returns sees the
    first state); when it is full the oldest is dropped (counted in ``client.stats.dropped``;
    the table never misses a change). Once the application takes changes (``get()`` or
    iteration) a filling queue NAKs the server as a subscription's does, so that it sends
    this session less often (each key conflated to its latest state); a table that is only
    read never slows its session.

    The attributes of the latest SUBSCRIBED (``topic``, ``mode``, ``codec``, ``epoch``,
    ``head``, ``recovered``) are updated in place by every re-subscription; ``recovered`` is
    True when a resume or a new session got only what changed (no RESET).

    >>> async def show(client: Any) -> None:  # doctest: +SKIP
    ...     book = await client.subscribe_table("book.AAPL")
    ...     await book.wait_synced(timeout=5)
    ...     print(dict(book.table))
    ...     async for change in book:
    ...         print(change.op, change.key, change.value)
    """

    def __init__(
        self,
        stats: ClientStats,
        name: str,
        on_change: Callable[[Change], Any] | None,
        params: bytes,
        leave: _Leave,
    ) -> None:
        super().__init__(stats, name, params, leave)
        self._on_change = on_change
        self._queue: deque[Change] = deque()
        self._taking = False  # the application took a change: a full queue is its slowness
        self._nak_level = 0

    def __aiter__(self) -> TableSubscription:
        return self

    async def __anext__(self) -> Change:
        try:
            return await self.get()
        except SubscriptionEnded:
            raise StopAsyncIteration from None

    async def get(self, timeout: float | None = None) -> Change:
        """The next :class:`Change` (without ``on_change``).

        Raises:
            asyncio.TimeoutError: nothing came within ``timeout`` seconds.
            SubscriptionEnded: the subscription is over and every change has been taken.
            ConnectionLost: the client lost its connection for good.
        """
        self._taking = True
        return await self._next_in(self._queue, timeout)

    def qsize(self) -> int:
        """Changes waiting to be taken."""
        return len(self._queue)

    async def _entry(self, seq: int, op: int, key: str, value: Any) -> int:
        change = self.table.apply(seq, op, key, value)
        if change is None:
            return 0
        if self._on_change is not None:
            self._wake.set()  # wait_synced()
            await _invoke(self._on_change, change, what=f"on_change of {self.name!r}")
            return 0
        return self._put(change)

    def _put(self, change: Change) -> int:
        q = self._queue
        if len(q) >= QUEUE_SIZE:
            q.popleft()
            self._stats.dropped += 1
        q.append(change)
        self._wake.set()
        if not self._taking:
            return 0
        fill = len(q) * 100 // QUEUE_SIZE
        for level in NAK_LEVELS:
            if fill >= level:
                if level > self._nak_level:
                    self._nak_level = level
                    return level
                break
        return 0


def _body(params: dict[str, Any]) -> bytes:
    return orjson.dumps(params) if params else b""
