"""The connection pool every Redis client of a node uses: capped, and waited on.

redis-py 8 caps its asyncio pool at 100 connections by default and raises ``MaxConnectionsError``
(a ``ConnectionError``) past it, which reads as Redis being away; redis-py 5 has no cap at all.
``connect`` gives a client whose commands wait for a free connection instead, up to a timeout,
and then fail with ``PoolBusy``: a local limit that names itself, never taken for an outage.
"""

from __future__ import annotations

import asyncio
import inspect
import os
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import redis.asyncio as aioredis
from redis.asyncio.sentinel import MasterNotFoundError, SentinelConnectionPool
from redis.exceptions import (
    AuthenticationError,
    BusyLoadingError,
    MasterDownError,
    MaxConnectionsError,
    NoPermissionError,
    OutOfMemoryError,
    ReadOnlyError,
    ResponseError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ...errors import BrokerStartupError, BrokerUnavailable
from ..base import ENV
from .nodes import DOWN

MAX_CONNECTIONS = 64
"""Connections to Redis one node opens at most, by default (``max_connections``): one is the
node's subscriber, the rest carry its commands; a command waits for a free one."""
POOL_TIMEOUT = 10.0
"""Seconds a command waits for a free connection at most, by default (``pool_timeout``)."""


class PoolBusy(BrokerUnavailable):
    """No connection to Redis came free within ``pool_timeout``: every one this node may open
    carries a command Redis has not answered yet. A local limit, never taken for Redis being
    away (nothing is marked down, nothing retried as an outage); what raises it was not sent."""


class Capped:
    """A redis-py pool capped by a semaphore (a mixin before the pool's class): a command
    waits for a free connection instead of failing (redis-py 8 raises ``MaxConnectionsError``
    past its cap, 100 by default; 5 has none), at most ``timeout`` seconds, then raises
    ``PoolBusy`` rather than the ``ConnectionError`` that reads as Redis being away.

    Not redis-py's ``BlockingConnectionPool``: in redis-py 5.0.8 its waiters miss wake-ups
    under load (seen: 50 commands waiting out their timeout beside 31 free connections), and
    its timeout raises a ``ConnectionError``."""

    max_connections: int

    _named = (
        inspect.signature(aioredis.ConnectionPool.get_connection).parameters["command_name"].default
        is inspect.Parameter.empty
    )
    """Whether redis-py's ``get_connection`` needs a command name (before 5.3; later ones warn
    when given one)."""

    def __init__(self, *args: Any, timeout: float, max_connections: int, **options: Any) -> None:
        super().__init__(*args, max_connections=max_connections, **options)  # type: ignore[call-arg]
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
        get = super().get_connection  # type: ignore[misc]  # the pool's, untyped in redis-py
        try:
            if command_name is None and not keys and not options:
                conn = await (get("_") if self._named else get())
            else:
                conn = await get(command_name, *keys, **options)
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
            await super().release(connection)  # type: ignore[misc]  # raises if not in use
        finally:
            if lent:
                self._free.release()

    def _busy(self) -> PoolBusy:
        return PoolBusy(
            f"no free connection to Redis within {self.timeout:g} s: all "
            f"max_connections={self.max_connections} of this node carry commands Redis has "
            "not answered yet; try again shortly"
        )


class Pool(Capped, aioredis.ConnectionPool):
    """redis-py's pool for one Redis server, capped (``Capped``)."""


class SentinelPool(Capped, SentinelConnectionPool):
    """redis-py's pool for the master a set of Sentinels names, capped (``Capped``): each new
    connection asks the Sentinels where the master is, so after a failover the next ones
    reach the promoted replica; one still open to a demoted master fails its next write
    (``READONLY``, which redis-py turns into a lost connection) and is made again.

    The Sentinels are asked here, one short connection each time (``ask_sentinels``), rather
    than through redis-py's ``Sentinel`` clients, whose pooled connections a failover could
    leave open and unreachable (seen: sockets to a Sentinel left to the garbage collector)."""

    def __init__(self, *args: Any, target: SentinelTarget, ask_timeout: float, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.target = target
        self.ask_timeout = ask_timeout
        self._closed = False

    async def get_master_address(self) -> Any:
        if self._closed:  # a connection of a closed client asks no Sentinel
            raise RedisConnectionError("the client is closed")
        address = await ask_sentinels(self.target, self.ask_timeout)
        if self.master_address != address:
            self.master_address = address
            # the idle connections go: the next ones reach the new master
            await self.disconnect(inuse_connections=False)
        return address

    async def disconnect(self, inuse_connections: bool = True) -> None:
        if inuse_connections:
            self._closed = True  # the client closing (a change of master: idle ones only)
        await super().disconnect(inuse_connections)


async def ask_sentinels(target: SentinelTarget, timeout: float) -> tuple[str, int]:
    """The master's address as the first Sentinel that answers names it (``SENTINEL
    GET-MASTER-ADDR-BY-NAME``), each asked on a connection of its own, closed after; raises
    ``MasterNotFoundError`` (a ``ConnectionError``: Redis away) when none does."""
    failures = []
    for host, port in target.sentinels:
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
        except (OSError, asyncio.TimeoutError) as exc:
            failures.append(f"{host}:{port}: {exc!r}")
            continue
        try:
            commands: list[tuple[str, ...]] = []
            if target.sentinel_password:
                commands.append(("AUTH", target.sentinel_password))
            commands.append(("SENTINEL", "GET-MASTER-ADDR-BY-NAME", target.service))
            writer.write(b"".join(_resp(c) for c in commands))
            replies = [await asyncio.wait_for(_read(reader), timeout) for _ in commands]
        except (OSError, asyncio.TimeoutError, ValueError) as exc:
            failures.append(f"{host}:{port}: {exc!r}")
            continue
        finally:
            writer.close()
        answer = replies[-1]
        if isinstance(answer, list) and len(answer) == 2:
            return answer[0].decode(), int(answer[1])
        failures.append(f"{host}:{port}: {answer!r}")
    raise MasterNotFoundError(f"no Sentinel names a master {target.service!r}: {failures}")


def _resp(args: tuple[str, ...]) -> bytes:
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        data = a.encode()
        out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


async def _read(reader: asyncio.StreamReader) -> Any:
    """One RESP2 reply: an array, a bulk or simple string, nil (None), or an error (str)."""
    line = await reader.readline()
    if not line.endswith(b"\r\n"):
        raise ValueError("the Sentinel closed the connection")
    kind, rest = line[:1], line[1:-2]
    if kind == b"*":
        n = int(rest)
        return None if n < 0 else [await _read(reader) for _ in range(n)]
    if kind == b"$":
        n = int(rest)
        return None if n < 0 else (await reader.readexactly(n + 2))[:-2]
    if kind in (b"+", b":"):
        return rest
    return rest.decode(errors="replace")  # an error


def connect(url: str, max_connections: int, pool_timeout: float, **options: Any) -> aioredis.Redis:
    """A client of the Redis at ``url`` on a pool of at most ``max_connections`` (redis-py 5
    has no cap by default, redis-py 8 one of 100 whose overflow raises): a command waits up to
    ``pool_timeout`` for a free connection, then raises ``PoolBusy``. ``url`` is
    ``redis://``, ``rediss://``, ``unix://``, or ``redis+sentinel://`` (``sentinel_url``)."""
    target = sentinel_url(url)
    if target is None:
        pool: Any = Pool.from_url(
            url, max_connections=max_connections, timeout=pool_timeout, **options
        )
    else:
        pool = SentinelPool(
            target.service,
            None,  # redis-py's Sentinel manager: not used (SentinelPool.get_master_address)
            target=target,
            ask_timeout=float(options.get("socket_connect_timeout") or 5.0),
            max_connections=max_connections,
            timeout=pool_timeout,
            db=target.db,
            username=target.username,
            password=target.password,
            **options,
        )
    return aioredis.Redis.from_pool(pool)  # closed with the client


@dataclass(frozen=True)
class SentinelTarget:
    """What a ``redis+sentinel://`` URL names."""

    sentinels: list[tuple[str, int]]
    service: str
    db: int
    username: str | None
    password: str | None
    sentinel_password: str | None


def sentinel_url(url: str) -> SentinelTarget | None:
    """``redis+sentinel://[:PASSWORD@]HOST:PORT[,HOST:PORT...]/SERVICE[/DB]`` (Sentinels'
    port 26379 when none is given; ``?sentinel_password=`` for Sentinels that ask for one):
    the master the Sentinels name ``SERVICE``, followed through failovers. None for any other
    URL. Raises ``ValueError`` for a Sentinel URL without Sentinels or service."""
    parts = urlsplit(url)
    if parts.scheme != "redis+sentinel":
        return None
    netloc = parts.netloc
    username = password = None
    if "@" in netloc:
        auth, _, netloc = netloc.rpartition("@")
        user, colon, secret = auth.partition(":")
        username, password = (
            (unquote(user) or None, unquote(secret) or None)
            if colon
            else (
                None,
                unquote(user) or None,
            )
        )
    sentinels = []
    for hostport in filter(None, netloc.split(",")):
        host, _, port = hostport.rpartition(":") if ":" in hostport else (hostport, "", "")
        sentinels.append((host or hostport, int(port) if port else 26379))
    path = [p for p in parts.path.split("/") if p]
    if not sentinels or not path:
        raise ValueError(
            f"{url!r}: a Sentinel URL names its Sentinels and the master's service, "
            "redis+sentinel://host:26379,host2:26379/mymaster[/db]"
        )
    query = parse_qs(parts.query)
    return SentinelTarget(
        sentinels,
        unquote(path[0]),
        int(path[1]) if len(path) > 1 else 0,
        username,
        password,
        query["sentinel_password"][0] if "sentinel_password" in query else None,
    )


def redacted(url: str) -> str:
    """``url`` without its password, for logs and errors."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return parts._replace(netloc="***@" + parts.netloc.rpartition("@")[2]).geturl()


def redis_cli(url: str) -> str | None:
    """The ``redis-cli`` command line that reaches the Redis at ``url`` (``--askpass`` where
    it needs a password: never the password itself); None for a Sentinel URL, whose master
    changes, or one that cannot be read."""
    parts = urlsplit(url)
    try:
        if parts.scheme == "unix":
            args = ["-s", parts.path]
        elif parts.scheme in ("redis", "rediss"):
            host = parts.hostname or "127.0.0.1"
            args = [] if host in ("127.0.0.1", "localhost") else ["-h", host]
            args += ["-p", str(parts.port or 6379)]
            if parts.scheme == "rediss":
                args.append("--tls")
        else:
            return None
    except ValueError:  # a port that is no number
        return None
    if parts.password:
        if parts.username:
            args += ["--user", unquote(parts.username)]
        args.append("--askpass")
    return " ".join(["redis-cli", *args])


def startup_error(url: str, exc: BaseException, timeout: float) -> BrokerStartupError | None:
    """What ``exc``, raised while starting on the Redis at ``url``, tells its user in one line:
    what failed and what to do. None when it says nothing of Redis or of its settings (a bug,
    whose traceback must stay)."""
    while isinstance(exc, BrokerUnavailable) and exc.__cause__ is not None:
        exc = exc.__cause__  # a wrapper of ours ("cannot use Redis at start"): its cause says
    where = redacted(url)
    setting = ENV if os.environ.get(ENV) == url else "the Redis URL given to rubris"
    if isinstance(exc, AuthenticationError):  # before ConnectionError, its base
        why = f"Redis at {where} refused this node's credentials ({exc})"
        fix = f"put the right user and password in {setting} (redis://USER:PASSWORD@HOST:PORT/DB)"
    elif isinstance(exc, BusyLoadingError):
        why, fix = f"Redis at {where} is loading its data ({exc})", "start again once it answers"
    elif isinstance(exc, MasterNotFoundError):
        why = f"cannot reach Redis at {where} ({exc})"
        fix = f"start the Sentinels and their master, or fix {setting}"
    elif isinstance(exc, (*DOWN, asyncio.TimeoutError)):
        why = f"cannot reach Redis at {where} ({_unreachable(exc, timeout)})"
        fix = f"start redis-server there or fix {setting}"
    elif isinstance(exc, ReadOnlyError):
        why = f"Redis at {where} takes no writes, a replica ({exc})"
        fix = f"point {setting} at the master, or at its Sentinels (redis+sentinel://...)"
    elif isinstance(exc, OutOfMemoryError):
        why = f"Redis at {where} is out of memory ({exc})"
        fix = "raise its maxmemory or free memory there"
    elif isinstance(exc, (MasterDownError, TryAgainError)):
        why, fix = f"Redis at {where} refuses writes for now ({exc})", "start again shortly"
    elif isinstance(exc, NoPermissionError):
        why = f"Redis at {where} refused a command to this node's user ({exc})"
        fix = "allow that user the commands, keys and channels rubris uses (ACL SETUSER)"
    elif isinstance(exc, ResponseError):
        why = f"Redis at {where} refused a command at start ({exc})"
        fix = "rubris needs Redis 5.0 or later, standalone or under Sentinel"
    else:
        return None
    return BrokerStartupError(f"{why}: {fix}")


def _unreachable(exc: BaseException, timeout: float) -> str:
    """Why a connection failed, in a few words: the socket's own reason where there is one
    ("Connection refused", "Name or service not known"), which redis-py buries in its own."""
    if isinstance(exc, (asyncio.TimeoutError, RedisTimeoutError)):
        return f"no answer within {timeout:g} s"
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError):
            # asyncio's own loop words it "Connect call failed (...)", uvloop as the system
            if isinstance(seen.errno, int) and seen.errno > 0:
                return os.strerror(seen.errno)
            if seen.strerror:  # a resolver's (gaierror: negative codes of its own)
                return str(seen.strerror)
        seen = seen.__cause__ or seen.__context__
    return str(exc) or type(exc).__name__


def check_pool(max_connections: int, pool_timeout: float) -> None:
    if max_connections < 2:
        raise ValueError("max_connections must be at least 2 (one is the node's subscriber)")
    if pool_timeout <= 0:
        raise ValueError("pool_timeout must be positive")
