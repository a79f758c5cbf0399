"""Redis losing what it had numbered, and failing over (issue 35: high availability).

Redis replicates asynchronously: a master that dies may have numbered messages its replica never
received, and the promoted replica then numbers new messages with the same seqs. A node that
heard the old ones must not take the new ones for them (dropping them silently, as known): it
restarts the topic under a new epoch, its subscribers told (UNSUBSCRIBED 11, ``recovered``=0).
The first tests make Redis lose the tail by hand (one node, one ``redis-server``); the last runs
a real master, a replica and three Sentinels, kills the master and checks that a node follows
the promoted replica by itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from redis.asyncio import Redis

from rubris_asgi import BrokerUnavailable, Rubris, Session
from rubris_asgi.client import Client
from rubris_asgi.cluster import RedisBroker
from rubris_asgi.cluster.redis.pool import sentinel_url

from .apps import make_rubris, starlette_app
from .rediskit import RedisServer, redis_server  # noqa: F401 (the fixture)
from .sentinelkit import SentinelSet
from .server import run_server

pytestmark = pytest.mark.redis


@pytest.fixture
def url(redis_server: RedisServer) -> str:  # noqa: F811 (the fixture)
    redis_server.flush()
    return redis_server.url


@contextlib.asynccontextmanager
async def node(url: str, **broker: Any) -> AsyncIterator[tuple[Rubris, str]]:
    rubris = make_rubris(broker=RedisBroker(url, **broker), batches=False)

    @rubris.queue("jobs.{kind}", codel_target=None)  # a REVOKE of a started item: a repeat
    async def jobs(session: Session, kind: str) -> None:
        return None

    async with run_server(starlette_app(rubris)) as base:
        yield rubris, base + "/rubris"


async def until(cond: Any, what: str, timeout: float = 10.0) -> None:
    for _ in range(int(timeout / 0.02)):
        if cond():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"not reached in {timeout} s: {what}")


async def lose_tail(r: Redis, topic: str, n: int) -> None:
    """Make Redis forget the newest ``n`` messages of a ring topic, as a replica that had not
    received them does once promoted."""
    seq = int(await r.hget(f"rubris:t:{topic}", "s"))
    await r.hset(f"rubris:t:{topic}", "s", seq - n)
    await r.lpop(f"rubris:r:{topic}", n)


async def test_new_messages_renumbered_under_seqs_a_node_heard_restart_the_topic(url: str) -> None:
    """Redis forgets seqs 4-5 the node heard and numbers a new message 4: the node sees other
    bytes under a seq it holds, and the topic starts again under a new epoch (in Redis and
    here); the client is told (UNSUBSCRIBED 11, subscribes again) and gets what follows."""
    async with node(url) as (rubris, base), Redis.from_url(url) as r:
        async with Client(base) as c:
            got: list[tuple[int, Any]] = []
            sub = await c.subscribe("ring.lost", lambda v, i: got.append((i.seq, v)))
            for i in range(1, 6):
                assert await rubris.publish_async("ring.lost", i) == i
            await until(lambda: len(got) == 5, "five messages")
            epoch = sub.epoch
            await lose_tail(r, "ring.lost", 2)
            assert await rubris.publish_async("ring.lost", "renumbered") == 4
            await until(lambda: rubris.stats().broker.restarted == 1, "the topic restarted")
            await until(lambda: sub.epoch != epoch, "the client subscribed again, new epoch")
            assert await rubris.publish_async("ring.lost", "after") == 1
            await until(lambda: got[-1] == (1, "after"), "the next message, seq 1 of the new epoch")
            assert (4, "renumbered") not in got  # never passed off as the old seq 4
            assert got[:5] == [(i, i) for i in range(1, 6)]


async def test_a_node_catching_up_from_a_redis_behind_it_restarts_the_topic(url: str) -> None:
    """The node's subscriber connection is cut (its catch-up reads the history again) while
    Redis has lost the tail the node heard: the history read itself finds Redis behind and
    numbers the topic afresh; the node restarts it, nothing passed off as known."""
    async with node(url) as (rubris, base), Redis.from_url(url) as r:
        async with Client(base) as c:
            got: list[tuple[int, Any]] = []
            sub = await c.subscribe("ring.behind", lambda v, i: got.append((i.seq, v)))
            for i in range(1, 6):
                await rubris.publish_async("ring.behind", i)
            await until(lambda: len(got) == 5, "five messages")
            epoch = sub.epoch
            await lose_tail(r, "ring.behind", 3)
            await r.execute_command("CLIENT", "KILL", "TYPE", "pubsub")
            await until(lambda: rubris.stats().broker.restarted == 1, "the topic restarted")
            await until(lambda: sub.epoch != epoch, "the client subscribed again")
            assert await rubris.publish_async("ring.behind", "after") == 1
            await until(lambda: got[-1] == (1, "after"), "seq 1 of the new epoch")


def test_a_sentinel_url_names_its_sentinels_service_and_db() -> None:
    t = sentinel_url("redis+sentinel://:s3cret@10.0.0.1:26380,10.0.0.2/cache/2")
    assert t is not None
    assert t.sentinels == [("10.0.0.1", 26380), ("10.0.0.2", 26379)]
    assert (t.service, t.db, t.password, t.username) == ("cache", 2, "s3cret", None)
    assert sentinel_url("redis://127.0.0.1:6379/0") is None
    with pytest.raises(ValueError, match="names its Sentinels and the master's service"):
        sentinel_url("redis+sentinel://127.0.0.1:26379")


@pytest.mark.timeout(120)
async def test_a_node_follows_the_promoted_replica_when_the_master_dies() -> None:
    """A master, its replica and three Sentinels; the node is given the Sentinels' URL. The
    master is killed (SIGKILL) under a steady publish: the node refuses publishes while no
    master answers, then takes them again on the promoted replica with no manual step; its
    subscriber hears what follows, and whatever Redis lost in the failover it is told of."""
    with SentinelSet() as sentinels:
        async with node(sentinels.url, connect_timeout=1.0) as (rubris, base):
            async with Client(base) as c:
                got: list[tuple[int, int, Any]] = []
                sub = await c.subscribe("ring.ha", lambda v, i: got.append((sub.epoch, i.seq, v)))
                accepted: list[int] = []
                for i in range(20):
                    await rubris.publish_async("ring.ha", i)
                    accepted.append(i)
                await until(lambda: len(got) == 20, "before the failover")
                await asyncio.to_thread(sentinels.crash_master)
                crashed = time.monotonic()
                back = 0.0
                refused = 0
                while len(accepted) < 40 and time.monotonic() - crashed < 60:
                    i = len(accepted) + refused
                    try:  # waits while its batch is retried until a master answers
                        await asyncio.wait_for(rubris.publish_async("ring.ha", i), 20)
                    except (BrokerUnavailable, asyncio.TimeoutError):
                        refused += 1
                        await asyncio.sleep(0.05)
                        continue
                    accepted.append(i)
                    back = back or time.monotonic() - crashed
                assert len(accepted) == 40, f"{refused} refused, {len(accepted)} accepted"
                assert sentinels.master_port() == sentinels.replica.port
                assert rubris.stats().broker.up
                last = accepted[-1]
                await until(lambda: got and got[-1][2] == last, "the newest after the failover")
                # each value the client got, once; those after the failover in order
                values = [v for _, _, v in got]
                assert len(values) == len(set(values)), got
                missing = set(accepted) - set(values)
                # lost only what the old master had not replicated, told by a new epoch
                assert not missing or len({e for e, _, _ in got}) > 1, (missing, got)
                print(f"failover: publishes back after {back:.1f} s, {refused} refused")


@pytest.mark.timeout(120)
async def test_with_wait_replicas_a_failover_loses_no_work_item() -> None:
    """``wait_replicas=1``: a master and two replicas; items are enqueued and ACKed while the
    master is killed. An item counts as sent, and an ACK as settled, only once a replica has
    it, so the promoted replica holds every accepted item: each is delivered (again, with a
    higher attempt, where its ACK had not reached a replica) and none is left behind."""
    with SentinelSet(replicas=2) as sentinels:
        async with node(sentinels.url, connect_timeout=1.0, wait_replicas=1) as (rubris, base):
            async with Client(base) as c:
                seen: dict[int, list[int]] = {}

                async def handle(item: Any) -> None:
                    seen.setdefault(int(item.value), []).append(item.attempt)

                await c.consume("jobs.ha", handle, prefetch=8)
                accepted: list[int] = []
                refused = 0
                crashed = 0.0
                i = 0
                while len(accepted) < 400 and i < 3000:  # 200 before the crash, 200 after
                    if i == 200:
                        await asyncio.to_thread(sentinels.crash_master)
                        crashed = time.monotonic()
                    try:
                        rubris.enqueue("jobs.ha", i)
                        accepted.append(i)
                    except BrokerUnavailable:
                        refused += 1  # while no master answers: refused, truly
                    i += 1
                    await asyncio.sleep(0.01)
                assert crashed and len(accepted) == 400, (len(accepted), refused)
                await until(lambda: set(accepted) <= set(seen), "every accepted item", 30)
                again = {i: a for i, a in seen.items() if len(a) > 1}
                assert all(len(set(a)) == len(a) for a in again.values()), again  # marked
                st = rubris.stats().broker
                assert st.up, st
                print(
                    f"failover with wait_replicas=1: {len(accepted)} items accepted, "
                    f"{refused} refused, {len(again)} delivered twice (marked)"
                )
