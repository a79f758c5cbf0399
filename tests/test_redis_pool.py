"""The connection pools to Redis: sized by a setting, a command waits for a free connection,
and a local limit is never taken for Redis being away (issue 25, item 2).

redis-py 8 caps its asyncio pool at 100 connections by default and raises
``MaxConnectionsError`` (a ``ConnectionError``) for the 101st concurrent command; redis-py 5
has no cap. Each test here runs far more concurrent commands than either pool holds, against a
real ``redis-server`` on 127.0.0.1, and must pass on both (.ci/run runs this module again with
redis 5.0.8).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from rubris_asgi import Rubris
from rubris_asgi.cluster import RedisBroker
from rubris_asgi.cluster.nodes import Head
from rubris_asgi.cluster.redis.batch_store import RedisBatchStore
from rubris_asgi.cluster.redis.nodes import DOWN
from rubris_asgi.cluster.redis.pool import Pool, PoolBusy, connect

from .apps import make_rubris, starlette_app
from .rediskit import RedisServer, redis_server  # noqa: F401 (the fixture)
from .server import run_server

pytestmark = pytest.mark.redis  # every test here runs a real redis-server

TOKEN = "secret"
N = 300
"""Concurrent operations of each kind: three times redis-py 8's default cap."""


@pytest.fixture
def url(redis_server: RedisServer) -> str:  # noqa: F811 (the fixture)
    redis_server.flush()
    return redis_server.url


@contextlib.asynccontextmanager
async def nodes(url: str, **broker: Any) -> AsyncIterator[list[tuple[Rubris, str]]]:
    rubrises = [
        make_rubris(broker=RedisBroker(url, **broker), api_token=TOKEN, batches=False)
        for _ in range(2)
    ]
    async with contextlib.AsyncExitStack() as stack:
        bases = [await stack.enter_async_context(run_server(starlette_app(r))) for r in rubrises]
        yield list(zip(rubrises, bases, strict=True))


class UpWatch:
    """Samples the brokers' ``up`` every millisecond while it runs: a single moment a local
    limit is taken for Redis being away is caught."""

    def __init__(self, *rubrises: Rubris) -> None:
        self.rubrises = rubrises
        self.downs = 0
        self.samples = 0
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            for r in self.rubrises:
                self.samples += 1
                if not r.stats().broker.up:
                    self.downs += 1
            await asyncio.sleep(0.001)

    async def __aenter__(self) -> UpWatch:
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


async def test_hundreds_of_concurrent_commands_wait_for_a_connection_and_redis_stays_up(
    url: str,
) -> None:
    """300 requests to another node, 300 topic reads that each make the node follow a new
    topic (a script call each), 300 awaited publishes and 300 commands that hold a connection
    for 50 ms, all at once on one node: every one succeeds, and neither node ever reports
    Redis down nor refuses anything."""
    async with nodes(url) as [(a, base_a), (b, _)]:
        assert isinstance(a.broker, RedisBroker) and isinstance(b.broker, RedisBroker)
        assert a.broker.redis.connection_pool.max_connections == a.broker.max_connections == 64

        async def echo(head: Head, body: bytes) -> tuple[Head, bytes]:
            await asyncio.sleep(0.01)
            return {"n": head["n"]}, body

        b.broker.nodes.on("echo", echo)
        node_b = b.broker.node

        async def ask(i: int) -> int:
            assert isinstance(a.broker, RedisBroker)
            head, body = await a.broker.nodes.ask(node_b, "echo", {"n": i}, b"x%d" % i, 20.0)
            assert body == b"x%d" % i
            return int(head["n"])

        async def hold(i: int) -> Any:
            assert isinstance(a.broker, RedisBroker)
            return await a.broker.redis.blpop([f"nothing:{i}"], timeout=0.05)

        auth = {"Authorization": f"Bearer {TOKEN}"}
        limits = httpx.Limits(max_connections=N, max_keepalive_connections=N)
        async with httpx.AsyncClient(timeout=30, limits=limits) as http, UpWatch(a, b) as watch:

            async def read(i: int) -> int:
                r = await http.get(f"{base_a}/rubris/api/topics/ring.t{i}", headers=auth)
                return r.status_code

            began = time.monotonic()
            asks, reads, seqs, held = await asyncio.wait_for(
                asyncio.gather(
                    asyncio.gather(*(ask(i) for i in range(N))),
                    asyncio.gather(*(read(i) for i in range(N))),
                    asyncio.gather(*(a.publish_async("ring.p", i) for i in range(N))),
                    asyncio.gather(*(hold(i) for i in range(N))),
                ),
                60,
            )
            took = time.monotonic() - began
        assert asks == list(range(N))
        assert reads == [200] * N
        assert sorted(seqs) == list(range(1, N + 1))
        assert held == [None] * N  # each waited its 50 ms for nothing, holding a connection
        assert watch.samples > 0 and watch.downs == 0
        for r in (a, b):
            st = r.stats().broker
            assert st.up and st.outages == 0 and st.refused == 0, st
        assert a.stats().broker.following == N  # the topics read (a publish follows none)
        # what the pool costs: 300 holds of 50 ms over 64 connections, about 0.25 s
        assert took < 30, took


async def test_a_small_pool_serves_many_commands_and_a_long_wait_names_the_pool(
    url: str,
) -> None:
    """``max_connections`` is what the node opens at most; a command waits for a free one.
    ``pool_timeout`` bounds a client's wait (a topic read here), refused as what it is, a local
    limit, with Redis up; the node's own work (the outbox) waits on and is sent."""
    async with nodes(url, max_connections=3, pool_timeout=0.3) as [(a, base_a), (b, _)]:
        assert isinstance(a.broker, RedisBroker)
        redis = a.broker.redis
        assert redis.connection_pool.max_connections == 3
        # one connection is the node's subscriber: two are left for commands
        got = await asyncio.gather(*(redis.incr("count") for _ in range(100)))
        assert sorted(got) == list(range(1, 101))
        async with UpWatch(a, b) as watch:
            hold = [asyncio.create_task(redis.blpop(["nothing"], timeout=1.0)) for _ in range(2)]
            await asyncio.sleep(0.1)
            publish = asyncio.create_task(a.publish_async("ring.waits", 1))
            async with httpx.AsyncClient(timeout=10) as http:
                r = await http.get(
                    f"{base_a}/rubris/api/topics/ring.new",
                    headers={"Authorization": f"Bearer {TOKEN}"},
                )
            assert r.status_code == 503, r.text
            assert "no free connection to Redis" in r.text and "max_connections=3" in r.text
            assert not publish.done()  # waiting for a connection, not refused
            assert await asyncio.gather(*hold) == [None, None]
            assert await asyncio.wait_for(publish, 5) == 1
            assert await a.publish_async("ring.waits", 2) == 2
        assert watch.downs == 0
        st = a.stats().broker
        assert st.up and st.outages == 0 and st.refused == 0, st
        with pytest.raises(ValueError, match="max_connections"):
            RedisBroker(url, max_connections=1)


async def test_the_batch_store_serves_hundreds_of_concurrent_operations(url: str) -> None:
    store = RedisBatchStore(url, prefix="pool:")
    await store.start()
    try:
        pool = (await store._redis()).connection_pool
        assert pool.max_connections == store.max_connections == 64
        now = time.time()
        opened = await asyncio.gather(*(store.open(f"b{i}", now) for i in range(N)))
        assert len(opened) == N
        groups = await asyncio.gather(*(store.add(f"b{i}", 3, now) for i in range(N)))
        assert groups == [0] * N
        statuses = await asyncio.gather(*(store.status(f"b{i}") for i in range(N)))
        assert {(s.total, s.done) for s in statuses} == {(3, 0)}
    finally:
        await store.close()


# ------------------------------------------------------------------ the permits, counted (issue 35)


@contextlib.asynccontextmanager
async def silent_server() -> AsyncIterator[str]:
    """A TCP server on 127.0.0.1 that accepts and reads but never answers: a stalled Redis, as
    a client meets it (the connect succeeds, the handshake or the command times out)."""
    held: list[asyncio.StreamWriter] = []
    server = await asyncio.start_server(lambda _r, w: held.append(w), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        for w in held:
            w.close()
        server.close()
        await server.wait_closed()


def closed_port_url() -> str:
    with socket.socket() as s:  # bound, then closed: nothing listens there
        s.bind(("127.0.0.1", 0))
        return f"redis://127.0.0.1:{s.getsockname()[1]}/0"


def small_client(url: str, timeout: float = 0.3) -> Any:
    return connect(
        url,
        4,
        10.0,  # pool_timeout: long enough that no command here gives up waiting for a permit
        socket_connect_timeout=timeout,
        socket_timeout=timeout,
        retry=Retry(NoBackoff(), 0),
    )


def assert_all_free(client: Any) -> None:
    pool = client.connection_pool
    assert isinstance(pool, Pool)
    assert pool.available == pool.max_connections == 4, (pool.available, pool.in_use)
    assert pool.in_use == 0


async def test_failed_connects_give_back_exactly_their_permits() -> None:
    """Nothing listens: every command fails connecting, as what it is (Redis away, never the
    pool's own limit), and afterwards the pool has exactly its 4 permits, not more (redis-py
    releases a connection that failed to connect through the pool's ``release``: counted once)."""
    client = small_client(closed_port_url())
    try:
        for _ in range(6):
            with pytest.raises(DOWN):
                await client.ping()
        assert_all_free(client)
        outcomes = await asyncio.gather(*(client.ping() for _ in range(40)), return_exceptions=True)
        assert all(isinstance(o, DOWN) and not isinstance(o, PoolBusy) for o in outcomes), outcomes
        assert not any("Too many connections" in str(o) for o in outcomes)
        assert_all_free(client)
    finally:
        await client.aclose()


async def test_timed_out_and_cancelled_commands_give_back_exactly_their_permits() -> None:
    """A server that accepts and never answers: commands time out in the handshake; others are
    cancelled while connecting or while waiting for a permit. Every permit comes back, once."""
    async with silent_server() as url:
        client = small_client(url, timeout=0.2)
        try:
            outcomes = await asyncio.gather(
                *(client.ping() for _ in range(12)), return_exceptions=True
            )
            assert all(isinstance(o, DOWN) for o in outcomes), outcomes
            assert_all_free(client)
            # 4 connecting (each holds a permit), 6 waiting for one: all cancelled
            tasks = [asyncio.create_task(client.ping()) for _ in range(10)]
            await asyncio.sleep(0.05)
            assert client.connection_pool.available == 0
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            assert_all_free(client)
        finally:
            await client.aclose()


async def test_after_an_outage_the_pool_still_caps_and_serves_every_waiting_command(
    redis_server: RedisServer,  # noqa: F811 (the fixture)
) -> None:
    """Redis down while 40 commands fail on a pool of 4, then back: 200 concurrent commands
    each wait for one of the 4 connections and succeed; none is refused for the pool."""
    client = small_client(redis_server.url, timeout=1.0)
    try:
        assert await client.ping()
        redis_server.kill()
        outcomes = await asyncio.gather(*(client.ping() for _ in range(40)), return_exceptions=True)
        assert all(isinstance(o, DOWN) for o in outcomes), outcomes
        assert_all_free(client)
        redis_server.restart()
        got = await asyncio.gather(*(client.incr("after") for _ in range(200)))
        assert sorted(got) == list(range(1, 201))
        assert_all_free(client)
        assert len(client.connection_pool._in_use_connections) == 0
    finally:
        await client.aclose()
