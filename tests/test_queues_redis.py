"""Work-queue topics shared by several nodes through a real Redis (cluster/redis/queues/).

Each test runs two nodes (two ``Rubris`` with a ``RedisBroker`` on one ``redis-server``, each
on its own uvicorn server in this loop) and real clients; what is asserted is what a user of
one node is promised (each item to one consumer at a time, ACK/NACK, the delivery limit, dead
letters, dedup, ``max_length``, batch tracking), now across nodes, and that items survive a
node that stops, one that dies, and a Redis restart.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from redis.asyncio import Redis

from rubris_asgi import BrokerUnavailable, Config, QueueFull, Rubris, Session, Timing
from rubris_asgi.client import Client, QueueItem
from rubris_asgi.cluster import RedisBroker
from rubris_asgi.cluster.redis.queues.lua import CYCLE
from rubris_asgi.cluster.redis.queues.runs import records_of, run_of

from .apps import starlette_app
from .rediskit import RedisServer, redis_server  # noqa: F401 (the fixture)
from .server import run_server

pytestmark = pytest.mark.redis  # every test here runs a real redis-server

TOKEN = "secret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def url(redis_server: RedisServer) -> str:  # noqa: F811 (the fixture)
    redis_server.flush()
    return redis_server.url


def queue_node(url: str, batches: bool = False, **settings: Any) -> Rubris:
    rubris = Rubris(
        Config(timing=Timing(poll_timeout=1.0, session_timeout=5.0)),
        broker=RedisBroker(url, node_timeout=3.0),
        api_token=TOKEN,
        batches=batches,
    )
    settings.setdefault("codel_target", None)  # a REVOKE of a started item is a legal repeat

    @rubris.queue("jobs.{kind}", dead_letter="dead", client_publish=True, **settings)
    async def jobs(session: Session, kind: str) -> None:
        return None

    @rubris.queue("dead")
    async def dead(session: Session) -> None:
        return None

    return rubris


@contextlib.asynccontextmanager
async def nodes(url: str, **settings: Any) -> AsyncIterator[list[tuple[Rubris, str]]]:
    """Two nodes sharing the Redis at ``url``: (rubris, base URL of its mount) each."""
    rubrises = [queue_node(url, **settings) for _ in range(2)]
    async with contextlib.AsyncExitStack() as stack:
        bases = [await stack.enter_async_context(run_server(starlette_app(r))) for r in rubrises]
        yield [(r, b + "/rubris") for r, b in zip(rubrises, bases, strict=True)]


async def until(cond: Any, what: str, timeout: float = 10.0) -> None:
    for _ in range(int(timeout / 0.01)):
        if cond():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"not reached in {timeout} s: {what}")


async def leftovers(url: str, name: str) -> tuple[int, int]:
    """Items waiting in Redis for ``name``, and items in any node's custody that have not
    ended (what the queue's own count of its items must agree with, too)."""
    redis = Redis.from_url(url)
    try:
        waiting = sum(
            len(list(records_of(run))) for run in await redis.lrange(f"rubris:q:{name}", 0, -1)
        )
        assert int(await redis.get(f"rubris:ql:{name}") or 0) == waiting
        held = 0
        async for key in redis.scan_iter(f"rubris:qh:{name}:*"):
            fields = await redis.hgetall(key)
            for field, value in fields.items():
                if field.endswith(b"!"):
                    continue
                count = len(list(records_of(value)))
                marks = fields.get(field + b"!", b"")
                ended = sum(bin(b).count("1") for b in marks[4:])
                held += count - ended
            # no marks without their piece
            assert all(f[:-1] in fields for f in fields if f.endswith(b"!")), fields
        return waiting, held
    finally:
        await redis.aclose()


async def test_items_enqueued_on_either_node_go_once_to_consumers_of_both(url: str) -> None:
    async with nodes(url) as [(a, url_a), (b, url_b)]:
        async with Client(url_a) as ca, Client(url_b) as cb:
            got: dict[str, list[int]] = {"a": [], "b": []}
            await ca.consume("jobs.share", lambda item: got["a"].append(item.value), prefetch=8)
            await cb.consume("jobs.share", lambda item: got["b"].append(item.value), prefetch=8)
            for i in range(400):
                (a if i % 2 else b).enqueue("jobs.share", i)
                if i % 50 == 49:
                    await asyncio.sleep(0.01)  # producers that pause: both nodes take a share
            await until(lambda: len(got["a"]) + len(got["b"]) >= 400, "all 400 delivered")
            await asyncio.sleep(0.2)
            assert sorted(got["a"] + got["b"]) == list(range(400))  # each exactly once
            assert got["a"] and got["b"]
            sa, sb = a.queue_stats("jobs.share"), b.queue_stats("jobs.share")
            await until(
                lambda: (
                    a.queue_stats("jobs.share").acked + b.queue_stats("jobs.share").acked == 400
                ),
                "400 ACKs",
            )
            sa, sb = a.queue_stats("jobs.share"), b.queue_stats("jobs.share")
            assert sa.enqueued + sb.enqueued == 400 and sa.delivered + sb.delivered == 400
        await until(lambda: a.stats().broker.items_pending == 0, "sent")
    assert await leftovers(url, "jobs.share") == (0, 0)


async def test_an_item_id_is_enqueued_once_across_nodes(url: str) -> None:
    async with nodes(url) as [(a, url_a), (b, _)]:
        assert a.enqueue("jobs.ids", "first", id="order-7")
        await until(lambda: a.queue_stats("jobs.ids").enqueued == 1, "A's item in Redis")
        assert b.enqueue("jobs.ids", "again", id="order-7")  # B has not seen the id itself...
        await until(lambda: b.queue_stats("jobs.ids").duplicates == 1, "...Redis has")
        assert not a.enqueue("jobs.ids", "again", id="order-7")  # A saw it: refused at once
        async with Client(url_a) as c:
            consumer = await c.consume("jobs.ids")
            item = await consumer.get(timeout=5)
            assert item.value == "first" and item.ack()
            with pytest.raises(asyncio.TimeoutError):
                await consumer.get(timeout=0.5)
        assert b.queue_stats("jobs.ids").enqueued == 0


async def test_nack_gives_back_to_any_node_and_the_limit_dead_letters(url: str) -> None:
    async with nodes(url, delivery_limit=2) as [(a, url_a), (b, url_b)]:
        async with Client(url_a) as ca, Client(url_b) as cb:
            first = await cb.consume("jobs.retry", prefetch=1)
            b.enqueue("jobs.retry", {"n": 1})
            item = await first.get(timeout=5)
            assert item.attempt == 1
            await first.close()  # NACKed after: the item goes back to Redis's head
            second = await ca.consume("jobs.retry", prefetch=1)
            assert item.nack(requeue=True) is False  # the subscription ended: too late
            again = await second.get(timeout=5)  # given back when B's consumer left
            assert (again.value, again.attempt) == ({"n": 1}, 2)
            assert again.nack(requeue=True)  # its first failure (giving back is none)
            third = await second.get(timeout=5)
            assert third.attempt == 3
            assert third.nack(requeue=True)  # the second: the delivery limit
            dead = await cb.consume("dead")
            buried = await dead.get(timeout=5)  # moved in Redis, taken by the other node
            assert buried.value == {"n": 1} and buried.attempt == 4 and buried.ack()
            await until(lambda: a.queue_stats("jobs.retry").dead_lettered == 1, "counted")
            await until(lambda: b.queue_stats("dead").acked == 1, "the ACK on B")
    assert await leftovers(url, "jobs.retry") == (0, 0)
    assert await leftovers(url, "dead") == (0, 0)


async def test_a_node_that_stops_gives_its_items_back_at_once(url: str) -> None:
    async with nodes(url) as [(a, url_a), (b, url_b)]:
        ca = Client(url_a, reconnect=False)
        await ca.connect()
        held = await ca.consume("jobs.stop", prefetch=3)
        for i in range(5):
            b.enqueue("jobs.stop", i)
        started = [await held.get(timeout=5) for _ in range(3)]  # never acked
        assert sorted(i.value for i in started) == [0, 1, 2]
        await a.stop()  # drains: the consumer is lost, its items go back to the head
        await ca.close()
        async with Client(url_b) as cb:
            k = await cb.consume("jobs.stop", prefetch=10)
            back = [await k.get(timeout=5) for _ in range(5)]
            assert sorted(i.value for i in back) == [0, 1, 2, 3, 4]
            assert sorted(i.attempt for i in back) == [1, 1, 2, 2, 2]
            for i in back:
                i.ack()
            await until(lambda: b.queue_stats("jobs.stop").acked == 5, "acked")
    assert await leftovers(url, "jobs.stop") == (0, 0)


async def test_a_node_taken_for_dead_and_back_revokes_what_it_no_longer_owns(url: str) -> None:
    """Node A misses its heartbeats past ``node_timeout`` (as when paused) while its consumer
    holds 4 items, one started: B gives them back to the queue, attempt 2. When A beats again
    it learns it was taken for dead: it REVOKEs the 4 deliveries (the client drops the 3 it had
    not started; the started one's ACK is ignored) and deals none of them again itself."""
    async with nodes(url) as [(a, url_a), (b, url_b)]:
        async with Client(url_a, reconnect=False) as ca, Client(url_b) as cb:
            held = await ca.consume("jobs.paused", prefetch=4)
            for i in range(4):
                b.enqueue("jobs.paused", i)
            await until(lambda: held.stats.received == 4, "4 items in hand on A")
            started = await held.get(timeout=5)
            broker = a.broker
            assert isinstance(broker, RedisBroker)
            beat = broker.queues._tasks[2]
            assert beat.get_name() == "rubris-queues-beat"
            beat.cancel()  # A beats no more: the others take it for dead after node_timeout
            k = await cb.consume("jobs.paused", prefetch=10)
            back = [await k.get(timeout=10) for _ in range(4)]
            assert sorted(i.value for i in back) == [0, 1, 2, 3]
            assert [i.attempt for i in back] == [2, 2, 2, 2]
            assert a.stats().broker.forfeits == 0
            broker.queues._tasks[2] = asyncio.create_task(broker.queues._beat_loop())
            await until(lambda: a.stats().broker.forfeits == 1, "A learns it was taken for dead")
            await until(lambda: held.stats.revoked == 3, "the 3 not started revoked")
            started.ack()  # finished all the same: ignored, A holds it no more
            for i in back:
                i.ack()
            await until(lambda: b.queue_stats("jobs.paused").acked == 4, "acked on B")
            await asyncio.sleep(0.3)
            assert a.queue_stats("jobs.paused").acked == 0
            with pytest.raises(asyncio.TimeoutError):
                await held.get(timeout=0.5)  # A deals none of them again
    assert await leftovers(url, "jobs.paused") == (0, 0)


async def test_a_dead_nodes_items_come_back_after_its_heartbeat_lapses(url: str) -> None:
    async with nodes(url) as [(a, url_a), (b, url_b)]:
        async with Client(url_a, reconnect=False) as ca, Client(url_b) as cb:
            held = await ca.consume("jobs.dead", prefetch=4)
            for i in range(4):
                b.enqueue("jobs.dead", i)
            _ = [await held.get(timeout=5) for _ in range(4)]
            # node A freezes (as a killed process): no heartbeat, nothing settled, no ACK
            broker = a.broker
            assert isinstance(broker, RedisBroker)
            for task in broker.queues._tasks:
                task.cancel()
            k = await cb.consume("jobs.dead", prefetch=10)
            with pytest.raises(asyncio.TimeoutError):
                await k.get(timeout=1.0)  # A is not taken for dead before node_timeout (3 s)
            back = [await k.get(timeout=10) for _ in range(4)]
            assert sorted(i.value for i in back) == [0, 1, 2, 3]
            assert [i.attempt for i in back] == [2, 2, 2, 2]
            for i in back:
                i.ack()
            assert b.stats().broker.items_reclaimed == 4
            await until(lambda: b.queue_stats("jobs.dead").acked == 4, "acked")
            broker.queues._tasks = []  # cancelled above: nothing to wait for at the stop
    assert await leftovers(url, "jobs.dead") == (0, 0)


async def test_max_length_counts_what_every_node_enqueued(url: str) -> None:
    async with nodes(url, max_length=3) as [(a, url_a), (b, _)]:
        b.enqueue("jobs.full", 0)  # B knows the queue from now on and hears its length
        await until(lambda: b.queue_stats("jobs.full").enqueued == 1, "B's item first")
        for i in range(2):
            a.enqueue("jobs.full", i + 1)
        await until(lambda: b.queue_stats("jobs.full").waiting == 3, "B heard the length")
        with pytest.raises(QueueFull):
            b.enqueue("jobs.full", 99)
        waited = asyncio.create_task(b.put("jobs.full", 4))
        await asyncio.sleep(0.2)
        assert not waited.done()  # back-pressure: it waits for room made on another node
        async with Client(url_a) as c:
            k = await c.consume("jobs.full", prefetch=1)
            first = await k.get(timeout=5)
            assert first.value == 0 and first.ack()
            assert await asyncio.wait_for(waited, 5) is True
            rest = []
            for _ in range(3):  # prefetch 1: each ACKed before the next comes
                rest.append(await k.get(timeout=5))
                assert rest[-1].ack()
            assert [i.value for i in rest] == [1, 2, 4]


async def test_the_http_api_enqueues_into_a_batch_that_completes_on_another_node(
    redis_server: RedisServer,  # noqa: F811 (the fixture)
) -> None:
    redis_server.flush()
    url = redis_server.url
    rubrises = [queue_node(url, batches=True) for _ in range(2)]
    async with contextlib.AsyncExitStack() as stack:
        a_base, b_base = [
            await stack.enter_async_context(run_server(starlette_app(r))) for r in rubrises
        ]
        async with httpx.AsyncClient(base_url=a_base + "/rubris", headers=AUTH) as http:
            batch = (await http.post("/api/batches")).json()["batch"]
            body = "\n".join(
                f'{{"topic": "jobs.spark", "data": {i}, "id": "r{i}"}}' for i in range(20)
            )
            r = await http.post(
                f"/api/enqueue?batch={batch}",
                content=body,
                headers={"content-type": "application/x-ndjson"},
            )
            assert r.status_code == 200, r.text
            assert r.json()["count"] == 20
            # a retried request: every id is known to Redis, nothing enqueued or counted twice
            r = await http.post(
                f"/api/enqueue?batch={batch}",
                content=body,
                headers={"content-type": "application/x-ndjson"},
            )
            assert r.status_code == 200 and r.json()["count"] == 0
            assert (await http.post(f"/api/batches/{batch}/seal")).status_code == 200
        async with Client(b_base + "/rubris") as c:
            seen: list[int] = []

            async def work(item: QueueItem) -> None:
                seen.append(item.value)

            await c.consume("jobs.spark", work)
            await until(lambda: len(seen) == 20, "all 20 on node B")
        b = rubrises[1]

        for _ in range(500):
            st = (await b.batches.status(batch)).to_json()
            if st["state"] == "complete":
                break
            await asyncio.sleep(0.02)
        assert (st["state"], st["total"], st["done"], st["failed"]) == ("complete", 20, 20, 0)
        assert sorted(seen) == list(range(20))


async def test_an_id_redis_finds_again_ends_its_batch_item_as_done(
    redis_server: RedisServer,  # noqa: F811 (the fixture)
) -> None:
    """The second producer of the same work (its id) on another node: Redis refuses the item,
    and its batch item ends as done, as the HTTP API does for a repeat it finds itself; the
    batch completes when the one item enqueued is ACKed."""
    redis_server.flush()
    a, b = queue_node(redis_server.url, batches=True), queue_node(redis_server.url, batches=True)
    async with contextlib.AsyncExitStack() as stack:
        base_a = await stack.enter_async_context(run_server(starlette_app(a)))
        await stack.enter_async_context(run_server(starlette_app(b)))
        batch = await a.batches.open()
        first, second = (await a.batches.add(batch, 2)).ids()
        assert await a.put("jobs.dup", "work", id="job-1", batch_item=first)
        await until(lambda: a.queue_stats("jobs.dup").enqueued == 1, "A's item in Redis")
        assert await b.put("jobs.dup", "work", id="job-1", batch_item=second)
        await until(lambda: b.queue_stats("jobs.dup").duplicates == 1, "Redis found the id")
        await b.batches.seal(batch)
        async with Client(base_a + "/rubris") as c:
            k = await c.consume("jobs.dup")
            item = await k.get(timeout=5)
            assert item.ack()
            with pytest.raises(asyncio.TimeoutError):
                await k.get(timeout=0.3)  # one item: the work is done once
        for _ in range(500):
            st = (await b.batches.status(batch)).to_json()
            if st["state"] == "complete":
                break
            await asyncio.sleep(0.02)
        assert (st["state"], st["total"], st["done"], st["failed"]) == ("complete", 2, 2, 0)


async def test_items_wait_in_redis_through_a_restart_and_acks_wait_for_it() -> None:
    with RedisServer(persist=True) as server:
        async with nodes(server.url) as [(a, _), (b, url_b)]:
            for i in range(10):
                a.enqueue("jobs.restart", i)
            await until(lambda: a.stats().broker.items_pending == 0, "in Redis")
            async with Client(url_b) as c:
                k = await c.consume("jobs.restart", prefetch=5)
                held = [await k.get(timeout=5) for _ in range(5)]
                server.kill()
                await until(lambda: not a.stats().broker.up, "A sees Redis gone")
                with pytest.raises(BrokerUnavailable):
                    for i in range(10, 100):
                        a.enqueue("jobs.restart", i)
                        await asyncio.sleep(0.01)
                for item in held:  # done while Redis is away: the ACKs wait on node B
                    assert item.ack()
                await until(lambda: b.queue_stats("jobs.restart").acked == 5, "B took the ACKs")
                server.restart()
                await until(lambda: a.stats().broker.up and b.stats().broker.up, "back", 15)
                a.enqueue("jobs.restart", 100)
                rest = []
                for _ in range(6):
                    rest.append(await k.get(timeout=10))
                    assert rest[-1].ack()
                assert [i.value for i in held + rest] == [*range(10), 100]
                assert c.state == "open" and not c.resumed  # the client never noticed
                await until(lambda: b.queue_stats("jobs.restart").acked == 11, "acked")
            await until(lambda: b.stats().broker.items_pending == 0, "sent")
        assert await leftovers(server.url, "jobs.restart") == (0, 0)


async def test_items_held_for_a_node_that_does_not_know_them_go_back(url: str) -> None:
    """A take whose answer was lost with the connection (for longer than Redis keeps its
    answer) leaves items in the node's custody that it never heard of: its audit gives them
    back."""
    async with nodes(url) as [(a, _), (b, url_b)]:
        a.enqueue("jobs.audit", "known")
        await until(lambda: a.queue_stats("jobs.audit").enqueued == 1, "in Redis")
        broker = a.broker
        assert isinstance(broker, RedisBroker)
        queues = broker.queues
        await until(  # the first audit, at the first beat, in the call after it: done
            lambda: queues._audited > 0 and not queues._audit and not queues.calling,
            "A's first audit",
        )
        redis = Redis.from_url(url)
        try:  # a take of A's whose answer was lost: the item moved into A's custody, A never told
            cycle = redis.register_script(CYCLE)
            answer = await cycle(
                args=["rubris:", broker.node, "lost", 0, 0, 0, 0, 1, "0", "jobs.audit", 1, 1]
            )
            assert int(answer[-3]) == 1  # one piece taken
            assert await leftovers(url, "jobs.audit") == (0, 1)
        finally:
            await redis.aclose()
        async with Client(url_b) as c:
            k = await c.consume("jobs.audit")
            with pytest.raises(asyncio.TimeoutError):
                await k.get(timeout=0.3)  # stuck in A's custody, A alive
            broker.queues._audited = 0.0  # the next beat audits (every 30 s otherwise)
            item = await k.get(timeout=5)
            assert (item.value, item.attempt) == ("known", 1) and item.ack()
            await until(lambda: b.queue_stats("jobs.audit").acked == 1, "acked")
    assert await leftovers(url, "jobs.audit") == (0, 0)


async def test_no_node_is_taken_for_dead_for_a_silence_that_was_redis_own(url: str) -> None:
    """BEAT: a node silent past the lapse is taken for dead and its custody goes back, unless
    nobody at all beat meanwhile: then Redis was not answering (stalled, restarting) and every
    node gets a whole lapse from now. Measured before: an item ACKed during a 12 s Redis stall
    was delivered again, its node's custody reclaimed by the first other node to beat."""
    from rubris_asgi.cluster.redis.queues.lua import BEAT

    record = b"0:1:a.1:0:\npayload"

    redis = Redis.from_url(url)
    try:
        beat = redis.register_script(BEAT)
        sec, usec = await redis.time()
        now = sec * 1000 + usec // 1000
        await redis.zadd("rubris:nodes", {"a": now - 10_000, "b": now - 10_000})
        piece = {"1.1": run_of([record]), "1.1!": b"\x00\x01\x00\x00\x00"}  # 1 item, 0 ended
        await redis.hset("rubris:qh:jobs.x:a", mapping=piece)
        await redis.sadd("rubris:qn:a", "jobs.x")
        await redis.set("rubris:beat", now - 10_000)  # nobody beat for 10 s: Redis was away
        answer = await beat(args=["rubris:", "b", 3000, "0", 1500])
        assert int(answer[0]) == 0  # nothing reclaimed
        assert await redis.zscore("rubris:nodes", "a") is not None
        assert await redis.hlen("rubris:qh:jobs.x:a") == 2  # the piece and its marks, as they were
        assert await redis.hget("rubris:qh:jobs.x:a", "1.1") == run_of([record])
        # a is silent again past the lapse while b beats: a really is gone
        sec, usec = await redis.time()
        now = sec * 1000 + usec // 1000
        await redis.zadd("rubris:nodes", {"a": now - 10_000})
        await redis.set("rubris:beat", now - 500)
        answer = await beat(args=["rubris:", "b", 3000, "0", 1500])
        assert int(answer[0]) == 1
        assert await redis.zscore("rubris:nodes", "a") is None
        assert await redis.lrange("rubris:q:jobs.x", 0, -1) == [run_of([b"1:2:a.1:0:\npayload"])]
        assert await redis.get("rubris:ql:jobs.x") == b"1"
        assert await redis.hlen("rubris:qh:jobs.x:a") == 0
    finally:
        await redis.aclose()


async def test_an_item_acked_while_redis_stalls_is_not_done_again() -> None:
    """Two nodes, Redis stalled (DEBUG SLEEP) past node_timeout while a consumer ACKs the item
    it holds: when Redis wakes, whichever node beats first, the item is settled, never
    delivered again."""
    with RedisServer(args=("--enable-debug-command", "local")) as server:
        async with nodes(server.url) as [(a, url_a), (b, url_b)]:
            async with Client(url_a) as ca, Client(url_b) as cb:
                held = await ca.consume("jobs.stall", prefetch=1)
                other = await cb.consume("jobs.stall", prefetch=1)
                a.enqueue("jobs.stall", "once")
                item = await held.get(timeout=5)
                stall = asyncio.create_task(_debug_sleep(server.port, 4.5))  # > node_timeout 3
                await asyncio.sleep(0.5)
                assert item.ack()
                await stall
                await asyncio.sleep(3.5)  # beats from both nodes, and a lapse
                with pytest.raises(asyncio.TimeoutError):
                    await other.get(timeout=0.1)
                with pytest.raises(asyncio.TimeoutError):
                    await held.get(timeout=0.1)
                await until(lambda: a.queue_stats("jobs.stall").acked == 1, "acked")
                assert a.stats().broker.items_reclaimed + b.stats().broker.items_reclaimed == 0
        assert await leftovers(server.url, "jobs.stall") == (0, 0)


async def _debug_sleep(port: int, seconds: float) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    arg = f"{seconds:.3f}"
    writer.write(f"*3\r\n$5\r\nDEBUG\r\n$5\r\nSLEEP\r\n${len(arg)}\r\n{arg}\r\n".encode())
    try:
        reply = await asyncio.wait_for(reader.readline(), seconds + 10)
        assert reply.startswith(b"+OK"), reply
    finally:
        writer.close()


@pytest.mark.parametrize("sent", [False, True])
async def test_an_ack_that_races_its_revoke_settles_the_item_in_redis(url: str, sent: bool) -> None:
    """protocol.md section 5 across nodes: a consumer started an item as its REVOKE was on the
    way, finishes it and ACKs. Its give-back is cancelled if it had not left the node yet
    (``sent`` False), else the item is taken out of the queue in Redis, where it still waits:
    acked once, never delivered again."""
    async with nodes(url, codel_target=0.020) as [(a, url_a), _]:
        async with Client(url_a) as ca:
            k = await ca.consume("jobs.race", prefetch=3)
            for i in range(3):
                a.enqueue("jobs.race", i)
            held = [await k.get(timeout=5) for _ in range(3)]  # all three started
            q = a.engine.queues["jobs.race"]
            sub = next(iter(q.consumers))
            broker = a.broker
            assert isinstance(broker, RedisBroker)
            await until(lambda: broker.queues.settled, "quiet")
            if not sent:
                broker.queues._wake.clear()
                writer = broker.queues._tasks[0]
                writer.cancel()  # the give-back waits on this node
                with contextlib.suppress(asyncio.CancelledError):
                    await writer
            tag = sub.revoke()  # as CoDel does; its REVOKE reaches the client after the start
            assert tag == held[-1].tag
            if sent:
                await until(lambda: a.queue_stats("jobs.race").waiting >= 1, "back in Redis")
            for item in held:
                assert item.ack()
            await until(lambda: q.stats.late_acked == 1, "the late ACK settled it")
            if not sent:
                broker.queues._tasks[0] = asyncio.create_task(broker.queues._write_loop())
            await until(lambda: a.queue_stats("jobs.race").acked == 3, "acked")
            with pytest.raises(asyncio.TimeoutError):
                await k.get(timeout=0.5)  # never delivered again
            await until(lambda: broker.queues.settled, "settled in Redis")
    assert await leftovers(url, "jobs.race") == (0, 0)
