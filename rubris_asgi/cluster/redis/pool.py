"""The connection pool every Redis client of a node uses: capped, and waited on.

redis-py 8 caps its asyncio pool at 100 connections by default and raises ``MaxConnectionsError``
(a ``ConnectionError``) past it, which reads as Redis being away; redis-py 5 has no cap at all.
``connect`` gives a client whose commands wait for a free connection instead, up to a timeout,
and then fail with ``PoolBusy``: a local limit that names itself, never taken for an outage.
"""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import MaxConnectionsError

from ...errors import BrokerUnavailable

MAX_CONNECTIONS = 64
"""Connections to Redis one node opens at most, by default (``max_connections``): one is the
node's subscriber, the rest carry its commands; a command waits for a free one."""
POOL_TIMEOUT = 10.0
"""Seconds a command waits for a free connection at most, by default (``pool_timeout``)."""


class PoolBusy(BrokerUnavailable):
    """No connection to Redis came free within ``pool_timeout``: every one this node may open
    carries a command Redis has not answered yet. A local limit, never taken for Redis being
    away (nothing is marked down, nothing retried as an outage); what raises it was not sent."""


class Pool(aioredis.ConnectionPool):
    """redis-py's pool, capped by a semaphore: a command waits for a free connection instead
    of failing (redis-py 8 raises ``MaxConnectionsError`` past its cap, 100 by default; 5 has
    none), at most ``timeout`` seconds, then raises ``PoolBusy`` rather than the
    ``ConnectionError`` that reads as Redis being away.

    Not redis-py's ``BlockingConnectionPool``: in redis-py 5.0.8 its waiters miss wake-ups
    under load (seen: 50 commands waiting out their timeout beside 31 free connections), and
    its timeout raises a ``ConnectionError``."""

    _named = (
        inspect.signature(aioredis.ConnectionPool.get_connection).parameters["command_name"].default
        is inspect.Parameter.empty
    )
    """Whether redis-py's ``get_connection`` needs a command name (before 5.3; later ones warn
    when given one)."""

    def __init__(self, *, timeout: float, max_connections: int, **options: Any) -> None:
        super().__init__(max_connections=max_connections, **options)
        self.timeout = timeout
        self._free = asyncio.Semaphore(max_connections)
        self._lent: set[Any] = set()
        """The connections ``get_connection`` handed out, each holding one permit until its
        ``release``. A permit goes back exactly once per connection lent: redis-py also calls
        ``release`` for a connection that failed to connect inside ``get_connection`` (never
        lent), and releasing a permit for that too gave one more on every failed connect,
        until the cap was gone."""

    async def get_connection(self, command_name: Any = None, *keys: Any, **options: Any) -> Any:
        await self._take()
        get = super().get_connection  # untyped in redis-py
        try:
            if command_name is None and not keys and not options:
                conn = await (get("_") if self._named else get())  # type: ignore[no-untyped-call]
            else:
                conn = await get(command_name, *keys, **options)  # type: ignore[no-untyped-call]
        except MaxConnectionsError as exc:  # the semaphore keeps below the cap: not expected
            self._free.release()
            raise self._busy() from exc
        except BaseException:
            # redis-py gave a connection that failed to connect back through ``release``
            # already, which returned no permit (it was not lent): this is its one return
            self._free.release()
            raise
        self._lent.add(conn)
        return conn

    async def _take(self) -> None:
        """A free connection's permit within ``timeout``, else ``PoolBusy``. A wait given up
        (timed out, or its command cancelled) never keeps a permit it got at the last moment:
        that one goes back as soon as the wait ends."""
        if not self._free.locked():  # the common case: a permit at once, no task
            await self._free.acquire()
            return
        waiter = asyncio.ensure_future(self._free.acquire())
        try:
            done, _ = await asyncio.wait((waiter,), timeout=self.timeout)
        except BaseException:
            self._give_up(waiter)
            raise
        if not done:
            self._give_up(waiter)
            raise self._busy()

    def _give_up(self, waiter: asyncio.Future[Any]) -> None:
        waiter.cancel()
        waiter.add_done_callback(self._return)

    def _return(self, waiter: asyncio.Future[Any]) -> None:
        if not waiter.cancelled() and waiter.exception() is None:
            self._free.release()

    @property
    def available(self) -> int:
        """Permits free now: connections a command may still take or open at once."""
        return self._free._value  # asyncio.Semaphore keeps its count there (no public reader)

    @property
    def in_use(self) -> int:
        """Connections handed out and not given back."""
        return len(self._lent)

    async def release(self, connection: Any) -> None:
        lent = connection in self._lent
        self._lent.discard(connection)
        try:
            await super().release(connection)  # raises for a connection not in use
        finally:
            if lent:
                self._free.release()

    def _busy(self) -> PoolBusy:
        return PoolBusy(
            f"no free connection to Redis within {self.timeout:g} s: all "
            f"max_connections={self.max_connections} of this node carry commands Redis has "
            "not answered yet; try again shortly"
        )


def connect(url: str, max_connections: int, pool_timeout: float, **options: Any) -> aioredis.Redis:
    """A client of the Redis at ``url`` on a pool of at most ``max_connections`` (redis-py 5
    has no cap by default, redis-py 8 one of 100 whose overflow raises): a command waits up to
    ``pool_timeout`` for a free connection, then raises ``PoolBusy``."""
    pool = Pool.from_url(url, max_connections=max_connections, timeout=pool_timeout, **options)
    return aioredis.Redis.from_pool(pool)  # closed with the client


def check_pool(max_connections: int, pool_timeout: float) -> None:
    if max_connections < 2:
        raise ValueError("max_connections must be at least 2 (one is the node's subscriber)")
    if pool_timeout <= 0:
        raise ValueError("pool_timeout must be positive")
