"""Shared topics across nodes through a real Redis Cluster (``RedisClusterBroker``).

Two nodes (two ``Rubris`` on two uvicorn servers, in this loop) on a cluster of 3 masters
(tests/clusterkit.py, ``cluster-require-full-coverage no``) started for the module; topics
spread over the masters by their partitions. What is asserted is what a single Redis
promises too: every message numbered once, heard by every node in order, caught up after a
master's restart and after its slot moved (a resharding) with nothing lost or doubled.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from rubris_asgi import BrokerUnavailable, Rubris, Session
from rubris_asgi.client import Client
from rubris_asgi.cluster.redis.shards.broker import RedisClusterBroker
from rubris_asgi.cluster.redis.shards.partitions import partition_of, slot_of_partition

from .apps import make_rubris, starlette_app
from .clusterkit import HOST, RedisCluster
from .lbkit import Balancer
from .server import run_server

pytestmark = pytest.mark.redis

TOKEN = "secret"
TOPICS = [f"log.t{i}" for i in range(24)]
"""Enough topics that every master holds some (64 partitions, 21 or 22 on each)."""


@pytest.fixture(scope="module")
def cluster() -> Iterator[RedisCluster]:
    # 3 masters: one away leaves the others a majority, which they need to go on serving
    with RedisCluster(3, args=("--cluster-require-full-coverage", "no")) as c:
        yield c


@pytest.fixture
async def url(cluster: RedisCluster) -> str:
    await asyncio.to_thread(cluster.wait_ok)
    await asyncio.to_thread(cluster.flush)
    return "redis+cluster://" + ",".join(f"{HOST}:{p}" for p in cluster.ports)


@contextlib.asynccontextmanager
async def nodes(url: str, n: int = 2) -> AsyncIterator[list[tuple[Rubris, str]]]:
    rubrises = [
        make_rubris(
            broker=RedisClusterBroker(url, connect_timeout=2.0), api_token=TOKEN, batches=False
        )
        for _ in range(n)
    ]
    for r in rubrises:

        @r.shared("log.{name}", ring=256)
        async def log(session: Session, name: str) -> None:
            return None

    async with contextlib.AsyncExitStack() as stack:
        bases = [await stack.enter_async_context(run_server(starlette_app(r))) for r in rubrises]
        yield list(zip(rubrises, bases, strict=True))


async def until(cond: Any, what: str, timeout: float = 10.0) -> None:
    for _ in range(int(timeout / 0.02)):
        if cond():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"not reached in {timeout} s: {what}")


class Heard:
    """What one client heard of each topic: its seqs and values, in order."""

    def __init__(self) -> None:
        self.seqs: dict[str, list[int]] = {t: [] for t in TOPICS}
        self.values: dict[str, list[Any]] = {t: [] for t in TOPICS}

    async def subscribe(self, c: Client) -> None:
        for t in TOPICS:

            def got(value: Any, info: Any, t: str = t) -> None:
                self.seqs[t].append(info.seq)
                self.values[t].append(value)

            await c.subscribe(t, got)

    def count(self) -> int:
        return sum(len(v) for v in self.values.values())

    def exact(self, sent: dict[str, list[int]]) -> None:
        """Each topic heard exactly what was sent, in order, numbered 1, 2, 3..."""
        for t in TOPICS:
            assert self.values[t] == sent[t], t
            assert self.seqs[t] == list(range(1, len(sent[t]) + 1)), t


def test_the_topics_spread_over_every_master(cluster: RedisCluster) -> None:
    owners = {cluster.node_for_slot(slot_of_partition(partition_of(t))).port for t in TOPICS}
    assert len(owners) == 3


async def test_publishes_on_either_node_reach_both_numbered_once_in_order(url: str) -> None:
    async with nodes(url) as [(a, base_a), (b, base_b)]:
        async with Client(base_a + "/rubris") as ca, Client(base_b + "/rubris") as cb:
            ha, hb = Heard(), Heard()
            await ha.subscribe(ca)
            await hb.subscribe(cb)
            sent: dict[str, list[int]] = {t: [] for t in TOPICS}
            for i in range(20):
                for t in TOPICS:
                    node = a if i % 2 else b
                    await node.publish_async(t, i)
                    sent[t].append(i)
            total = 20 * len(TOPICS)
            await until(lambda: ha.count() == total and hb.count() == total, "all heard")
            ha.exact(sent)
            hb.exact(sent)
            # a node that follows a topic late reads its history from its partition's master
            async with Client(base_b + "/rubris") as late:
                hl = Heard()
                await hl.subscribe(late)
                await a.publish_async(TOPICS[0], 99)
                await until(lambda: hl.values[TOPICS[0]][-1:] == [99], "the late one hears")


async def test_send_to_reaches_a_session_on_the_other_node(url: str) -> None:
    async with nodes(url) as [(a, base_a), (b, _)]:
        async with Client(base_a + "/rubris") as ca:
            got: list[Any] = []
            await ca.subscribe("inbox", lambda value, info: got.append(value))
            sid = ca.session_id
            assert sid is not None and sid in a.engine.sessions
            assert await b.send_to(sid, "inbox", {"hello": 1}) == 1
            await until(lambda: got == [{"hello": 1}], "the private message")


async def publish_steadily(
    node: Rubris, sent: dict[str, list[int]], stop: asyncio.Event, every: float = 0.01
) -> None:
    """A message to every topic every ``every`` s until ``stop``; the ones the broker took
    (numbered, or surely to be) are recorded, the ones it refused are not."""
    i = 0
    while not stop.is_set():
        for t in TOPICS:
            try:
                await node.publish_async(t, i)
            except Exception:
                continue
            sent[t].append(i)
        i += 1
        await asyncio.sleep(every)


async def test_a_master_restarted_under_load_loses_nothing(cluster: RedisCluster, url: str) -> None:
    async with nodes(url) as [(a, _), (_, base_b)]:
        async with Client(base_b + "/rubris") as cb:
            hb = Heard()
            await hb.subscribe(cb)
            sent: dict[str, list[int]] = {t: [] for t in TOPICS}
            stop = asyncio.Event()
            load = asyncio.create_task(publish_steadily(a, sent, stop))
            await asyncio.sleep(1.0)
            port = cluster.masters()[0].port
            await asyncio.to_thread(cluster.restart, port)
            await asyncio.to_thread(cluster.wait_ok)
            await asyncio.sleep(1.0)
            stop.set()
            await load
            total = sum(len(v) for v in sent.values())
            await until(lambda: hb.count() >= total, "every accepted publish heard", 20.0)
            hb.exact(sent)
            stats = shards(a).stats
            assert stats.failures + stats.refused > 0, stats  # the fault was felt


def shards(r: Rubris) -> Any:
    broker = r.broker
    assert isinstance(broker, RedisClusterBroker)
    return broker.shards


async def test_a_resharding_under_load_loses_nothing(cluster: RedisCluster, url: str) -> None:
    async with nodes(url) as [(a, _), (_, base_b)]:
        async with Client(base_b + "/rubris") as cb:
            hb = Heard()
            await hb.subscribe(cb)
            sent: dict[str, list[int]] = {t: [] for t in TOPICS}
            stop = asyncio.Event()
            load = asyncio.create_task(publish_steadily(a, sent, stop))
            await asyncio.sleep(0.5)
            first, second, _ = cluster.masters()
            moved_slots = await asyncio.to_thread(cluster.migrate_half, first.port, second.port)
            await asyncio.sleep(0.5)
            stop.set()
            await load
            total = sum(len(v) for v in sent.values())
            await until(lambda: hb.count() >= total, "every accepted publish heard", 20.0)
            hb.exact(sent)
            stats = shards(a).stats
            assert stats.moved + stats.asked > 0, stats  # the publishes followed the slots
            moved = set(moved_slots)
            assert any(slot_of_partition(partition_of(t)) in moved for t in TOPICS)


@pytest.mark.parametrize("kind", ["queue", "keyed", "presence"])
async def test_what_a_cluster_does_not_keep_yet_refuses_to_start_saying_so(
    url: str, kind: str
) -> None:
    """Work queues, keyed topics and presence are not kept on a Redis Cluster yet: an app
    that declares them does not start (rather than keep them on each node alone)."""
    from rubris_asgi import StartupError

    r = make_rubris(broker=RedisClusterBroker(url, connect_timeout=2.0), batches=False)
    if kind == "queue":

        @r.queue("jobs")
        async def jobs(session: Session) -> None:
            return None

    elif kind == "keyed":

        @r.shared("book.{sym}", keyed=True)
        async def book(session: Session, sym: str) -> None:
            return None

    else:

        @r.shared("room.{id}", snapshot=True, presence=True)
        async def room(session: Session, id: str) -> None:  # noqa: A002
            return None

    with pytest.raises(StartupError, match="keeps no .* for several nodes"):
        await r.start()
    assert not r.started


def test_batches_by_default_on_a_cluster_are_refused_saying_what_to_do() -> None:
    """A batch store every node shares is not kept on a Redis Cluster yet: the default
    ``batches=True`` says so at once (embedded SQLite on each node would split the batches)."""
    with pytest.raises(ValueError, match="batches=False"):
        make_rubris(broker=RedisClusterBroker("redis+cluster://127.0.0.1:1"))


async def test_a_master_away_stops_only_its_own_topics(cluster: RedisCluster, url: str) -> None:
    """One master of 3 killed for 6 s: the topics of the others keep being published and heard
    at once all along; the dead one's are refused once its lane found it away (those
    accepted before wait); once it is back, every accepted publish is heard, once, in order."""
    async with nodes(url) as [(a, _), (_, base_b)]:
        async with Client(base_b + "/rubris") as cb:
            hb = Heard()
            await hb.subscribe(cb)
            down = cluster.masters()[0]
            on_down = {
                t
                for t in TOPICS
                if cluster.node_for_slot(slot_of_partition(partition_of(t))).port == down.port
            }
            assert on_down and len(on_down) < len(TOPICS)
            sent: dict[str, list[int]] = {t: [] for t in TOPICS}
            refused = 0

            def publish_all(i: int) -> None:
                nonlocal refused
                for t in TOPICS:
                    try:
                        a.publish(t, i)
                    except BrokerUnavailable:
                        refused += 1
                        continue
                    sent[t].append(i)

            await asyncio.to_thread(cluster.kill, down.port)
            try:
                lag = 0  # rounds the live masters' topics were behind at most
                for i in range(60):  # 6 s, past cluster-node-timeout (2 s) and then some
                    publish_all(i)
                    await asyncio.sleep(0.1)
                    for t in TOPICS:
                        if t not in on_down:
                            heard = hb.values[t][-1] if hb.values[t] else -1
                            lag = max(lag, i - heard)
            finally:
                await asyncio.to_thread(cluster.start, down.port)
            # a stall of the live masters (two masters: the survivor stops serving once it
            # misses the majority) shows as rounds behind for the rest of the outage, 30+
            # here; the bound leaves a loaded machine 2.5 s where 0.1 s is the rule
            assert lag <= 25, lag
            await asyncio.to_thread(cluster.wait_ok)
            assert refused > 0  # the dead master's topics were refused, saying so
            for i in range(60, 65):
                publish_all(i)
            total = sum(len(v) for v in sent.values())
            await until(lambda: hb.count() >= total, "every accepted publish heard", 20.0)
            hb.exact(sent)


async def test_a_session_carried_through_the_cluster_gets_everything_in_order(url: str) -> None:
    """A client moved to node B while its session stays on A: its frames are carried between
    the nodes on their channels in the cluster (each in its node's partition), and 250 ring
    messages (the ring's 256 at most: none lapped) and 125 private ones reach it in order,
    each once."""
    async with nodes(url) as [(a, base_a), (b, base_b)], Balancer([base_a, base_b]) as lb:
        async with Client(lb.base + "/rubris", backoff=(0.05, 0.2), ack_every=8) as c:
            got: list[int] = []
            private: list[int] = []
            await c.subscribe(TOPICS[0], lambda v, info: got.append(v))
            await c.subscribe("inbox", lambda v, info: private.append(v))
            lb.route(1)
            lb.cut()
            await until(lambda: c.stats.reconnects >= 1 and c.state == "open", "resumed via B")
            assert c.resumed and len(a.relays.homes) == 1 and len(b.relays.entries) == 1
            assert c.session_id is not None
            s = a.engine.sessions[c.session_id]
            for i in range(250):
                a.publish(TOPICS[0], i)
                if i % 2 == 0:
                    await a.send(s, "inbox", i // 2)
            await until(lambda: len(got) == 250 and len(private) == 125, "all of it", 20.0)
            assert got == list(range(250))
            assert private == list(range(125))
