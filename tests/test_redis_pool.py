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
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from rubris_asgi import Rubris
from rubris_asgi.cluster import RedisBroker
from rubris_asgi.cluster.nodes import Head
from rubris_asgi.cluster.redis.batch_store import RedisBatchStore

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
