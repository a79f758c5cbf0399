"""How ``RedisQueues`` batches a node's work with Redis (cluster/redis/queues/):
items kept in runs, taken whole or cut, ended by marks coalesced over a call, and one call for
everything a round trip, sent again after a lost answer. What is asserted is what the batching
must never cost: an item lost, doubled, out of order or counted wrong.

The first tests drive the scripts alone against a real ``redis-server`` (the arguments as
queues/lua.py documents them); the last ones run two nodes and real clients through a Redis
restart under load.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from redis.asyncio import Redis

from rubris_asgi.client import Client
from rubris_asgi.cluster import RedisBroker
from rubris_asgi.cluster.redis.queues.lua import BEAT, CYCLE
from rubris_asgi.cluster.redis.queues.runs import marks_of, records_of, run_of

from .rediskit import RedisServer, redis_server  # noqa: F401 (the fixture)
from .test_queues_redis import leftovers, nodes, until

pytestmark = pytest.mark.redis

P = "rubris:"
Q = "jobs.runs"


def record(i: int, key: str = "") -> bytes:
    return b"0:0:%s:0:[null,null]\n%d" % (key.encode(), i)


def values(runs: list[bytes]) -> list[int]:
    """The payloads (integers) of the records of ``runs``, in order."""
    return [int(r.rpartition(b"\n")[2]) for run in runs for r in records_of(run)]


def cycle_args(
    node: str,
    call: str,
    *,
    marks: list[tuple[str, str, list[int]]] = (),  # type: ignore[assignment]
    moves: list[tuple[str, str, int, str, str, str, bytes]] = (),  # type: ignore[assignment]
    puts: list[tuple[str, list[bytes], list[tuple[int, str]]]] = (),  # type: ignore[assignment]
    audits: list[tuple[str, list[str]]] = (),  # type: ignore[assignment]
    takes: list[tuple[str, str, int]] = (),  # type: ignore[assignment]
) -> list[Any]:
    """``CYCLE``'s arguments, as queues/lua.py lays them out."""
    args: list[Any] = [P, node, call, len(marks)]
    for name, piece, places in marks:
        args += (name, piece, marks_of(places))
    args.append(len(moves))
    for move in moves:
        args += move
    args.append(len(puts))
    for name, records, ids in puts:
        args += (name, 60_000, 1000, len(records), len(ids))
        for place, item_id in ids:
            args += (place, item_id)
        args.append(run_of(records))
    args.append(len(audits))
    for name, known in audits:
        args += (name, len(known), *known)
    args.append(len(takes))
    for take in takes:
        args += (*take, take[2])  # as many as it wants: the last run cut to it
    return args


def taken(answer: list[Any]) -> dict[str, bytes]:
    """The pieces of a ``CYCLE`` answer's take (one take asked), by piece number."""
    at = 1 + int(answer[0])
    at += 1 + int(answer[at])
    at += 1  # the audits' count
    assert int(answer[at]) == 1
    n = int(answer[at + 2])
    pairs = answer[at + 3 : at + 3 + 2 * n]
    return {str(int(pairs[i])): pairs[i + 1] for i in range(0, len(pairs), 2)}


def took(answer: list[Any]) -> list[int]:
    """The items of a ``CYCLE`` answer's take, in order."""
    return values(list(taken(answer).values()))


@contextlib.asynccontextmanager
async def scripts(url: str) -> AsyncIterator[tuple[Redis, Any, Any]]:
    redis = Redis.from_url(url)
    try:
        yield redis, redis.register_script(CYCLE), redis.register_script(BEAT)
    finally:
        await redis.aclose()


@pytest.fixture
def url(redis_server: RedisServer) -> str:  # noqa: F811 (the fixture)
    redis_server.flush()
    return redis_server.url


async def test_takes_cut_runs_to_exactly_what_they_ask_and_keep_the_order(url: str) -> None:
    async with scripts(url) as (redis, cycle, _):
        # three runs of 5, 1 and 7 items, from two calls
        await cycle(args=cycle_args("a", "1", puts=[(Q, [record(i) for i in range(5)], [])]))
        await cycle(
            args=cycle_args(
                "a", "2", puts=[(Q, [record(5)], []), (Q, [record(i) for i in range(6, 13)], [])]
            )
        )
        assert await redis.llen(P + "q:" + Q) == 3 and await redis.get(P + "ql:" + Q) == b"13"
        got: list[int] = []
        for call, n in enumerate([3, 4, 2, 100], 3):  # cuts inside runs and across them
            answer = await cycle(args=cycle_args("a", str(call), takes=[(str(call), Q, n)]))
            items = took(answer)
            assert len(items) == min(n, 13 - len(got))
            got += items
            rest = values(await redis.lrange(P + "q:" + Q, 0, -1))
            assert rest == list(range(len(got), 13))  # what is left, still in order
            assert int(await redis.get(P + "ql:" + Q) or 0) == len(rest)
        assert got == list(range(13))
        assert await leftovers(url, Q) == (0, 13)


async def test_marks_sent_twice_end_each_item_once_and_a_dead_node_returns_the_rest(
    url: str,
) -> None:
    """ACKs coalesced into one call per piece, sent again (a lost answer, a repeat): the piece
    leaves the custody only when every one of its items ended, and a node that dies gives back
    exactly the items not ended, in their order, one delivery more each."""
    async with scripts(url) as (redis, cycle, beat):
        await cycle(args=cycle_args("a", "1", puts=[(Q, [record(i) for i in range(10)], [])]))
        pieces = taken(await cycle(args=cycle_args("a", "2", takes=[("7", Q, 10)])))
        assert list(pieces) == ["1"] and values([pieces["1"]]) == list(range(10))
        ack = [(Q, "7.1", [1, 2, 3, 9])]
        await cycle(args=cycle_args("a", "3", marks=ack))
        await cycle(args=cycle_args("a", "3", marks=ack))  # the same call again: its answer
        assert await leftovers(url, Q) == (0, 6)
        # marks sent again in another call (its answer's mark expired): only 10 is new
        await cycle(args=cycle_args("a", "4", marks=[(Q, "7.1", [2, 3, 9, 10])]))
        assert await leftovers(url, Q) == (0, 5)
        # node a is taken for dead by b: the 5 items not ended come back, in order
        sec, usec = await redis.time()
        now = sec * 1000 + usec // 1000
        await redis.zadd(P + "nodes", {"a": now - 10_000})
        await redis.set(P + "beat", now)
        answer = await beat(args=[P, "b", 3000, "0", 1500])
        assert int(answer[0]) == 5
        back = await redis.lrange(P + "q:" + Q, 0, -1)
        assert values(back) == [3, 4, 5, 6, 7]  # places 4 to 8
        assert [r.split(b":")[:2] for run in back for r in records_of(run)] == [[b"1", b"1"]] * 5
        assert await leftovers(url, Q) == (5, 0)


async def test_a_call_sent_again_does_nothing_twice_and_answers_what_it_took(url: str) -> None:
    """A call whose answer was lost (a Redis restart, a dropped connection) is sent again with
    the same arguments: the same duplicates, the same pieces, nothing enqueued or taken twice,
    no give-back pushed twice."""
    async with scripts(url) as (redis, cycle, _):
        await cycle(args=cycle_args("a", "1", puts=[(Q, [record(i) for i in range(4)], [])]))
        assert took(await cycle(args=cycle_args("a", "2", takes=[("5", Q, 2)]))) == [0, 1]
        args = cycle_args(
            "a",
            "3",
            marks=[(Q, "5.1", [1])],  # item 0 ACKed
            moves=[(Q, "5.1", 2, Q, "h", "a.9", run_of([record(1, "a.9")]))],  # 1 given back
            puts=[(Q, [record(10), record(11)], [(2, "id-11"), (1, "id-10")])],
            takes=[("6", Q, 3)],
        )
        first = await cycle(args=args)
        again = await cycle(args=args)
        assert took(first) == [1, 2, 3]  # the item given back, first
        assert list(taken(first)) == ["1", "2"]  # from two runs: two pieces
        assert taken(again) == taken(first)
        assert int(first[0]) == int(again[0]) == 0
        assert values(await redis.lrange(P + "q:" + Q, 0, -1)) == [10, 11]  # once each
        assert await leftovers(url, Q) == (2, 3)
        # an id within the window: refused, the rest of its run enqueued in order
        answer = await cycle(
            args=cycle_args(
                "a", "4", puts=[(Q, [record(20), record(21), record(22)], [(2, "id-10")])]
            )
        )
        assert int(answer[0]) == 1 and int(answer[1]) == 2
        assert values(await redis.lrange(P + "q:" + Q, 0, -1)) == [10, 11, 20, 22]
        assert await leftovers(url, Q) == (4, 3)


async def test_a_give_back_of_an_item_already_ended_pushes_nothing(url: str) -> None:
    async with scripts(url) as (redis, cycle, _):
        await cycle(args=cycle_args("a", "1", puts=[(Q, [record(0), record(1)], [])]))
        assert took(await cycle(args=cycle_args("a", "2", takes=[("1", Q, 2)]))) == [0, 1]
        await cycle(args=cycle_args("a", "3", marks=[(Q, "1.1", [1])]))
        back = (Q, "1.1", 1, Q, "h", "a.1", run_of([record(0, "a.1")]))
        await cycle(args=cycle_args("a", "4", moves=[back]))  # ended already: left alone
        assert await leftovers(url, Q) == (0, 1)
        other = (Q, "1.1", 2, Q, "h", "a.2", run_of([record(1, "a.2")]))
        await cycle(args=cycle_args("a", "5", moves=[other]))
        await cycle(args=cycle_args("a", "6", moves=[other]))  # twice: pushed once
        assert values(await redis.lrange(P + "q:" + Q, 0, -1)) == [1]
        assert await leftovers(url, Q) == (1, 0)
        assert await redis.hlen(f"{P}qh:{Q}:a") == 0  # the piece left with its last item


async def test_work_flows_exactly_once_through_a_redis_restart_under_load() -> None:
    """Two nodes enqueue and consume 3,000 items in bursts while Redis is killed and started
    again (its append-only file synced at each write): calls whose answers were lost are sent
    again, and every item is done once, none twice, nothing left in Redis."""
    with RedisServer(persist=True) as server:
        async with nodes(server.url) as [(a, url_a), (b, url_b)]:
            seen: dict[int, list[int]] = {}

            def work(item: Any) -> None:
                seen.setdefault(item.value, []).append(item.attempt)

            async with Client(url_a) as ca, Client(url_b) as cb:
                await ca.consume("jobs.flow", work)
                await cb.consume("jobs.flow", work)
                sent = 0
                restarted = False
                while sent < 3000:
                    node = a if sent % 2 else b
                    try:
                        for _ in range(100):
                            node.enqueue("jobs.flow", sent)
                            sent += 1
                    except Exception:  # refused while Redis is away: sent again later
                        await asyncio.sleep(0.05)
                        continue
                    await asyncio.sleep(0.01)
                    if sent == 1500 and not restarted:
                        server.kill()
                        await asyncio.sleep(0.5)
                        server.restart()
                        restarted = True
                assert sum(n.stats().broker.outages for n in (a, b)) >= 1  # it was away
                await until(lambda: len(seen) >= 3000, "every item done", 30)
                await asyncio.sleep(0.5)
                assert sorted(seen) == list(range(3000))
                twice = {i: runs for i, runs in seen.items() if len(runs) > 1}
                assert not twice, twice
                acked = lambda: sum(n.queue_stats("jobs.flow").acked for n in (a, b))  # noqa: E731
                await until(lambda: acked() == 3000, "3000 ACKs")
            brokers = [n.broker for n in (a, b)]
            assert all(isinstance(k, RedisBroker) for k in brokers)
            await until(
                lambda: all(k.queues.settled for k in brokers if isinstance(k, RedisBroker)),
                "settled in Redis",
            )
        assert await leftovers(server.url, "jobs.flow") == (0, 0)


async def test_a_take_wanted_while_redis_seems_away_is_made_once_it_answers(url: str) -> None:
    """A consumer that makes room while the node takes Redis for away (a call found a stale
    connection after a restart): the take goes in the next call, which waits for Redis, and
    is not forgotten (measured before: the want was dropped, nothing asked again once Redis
    answered, and the consumer starved with an item waiting)."""
    async with nodes(url) as [(a, _), (b, url_b)]:
        async with Client(url_b) as c:
            k = await c.consume("jobs.away", prefetch=1)
            broker = b.broker
            assert isinstance(broker, RedisBroker)
            beat = broker.queues._tasks[2]
            beat.cancel()  # no length read each second: only what this test makes happens
            with contextlib.suppress(asyncio.CancelledError):
                await beat
            a.enqueue("jobs.away", "first")
            first = await k.get(timeout=5)  # held: B's consumer has no room
            view = broker.queues._views["jobs.away"]
            heard = view.version
            a.enqueue("jobs.away", "second")
            await until(lambda: view.version > heard, "B heard of the second")
            assert view.length == 1  # waiting in Redis, nobody with room
            broker.reach.lost("queues", ConnectionError("as a stale connection would"))
            assert first.ack()  # room, while B takes Redis for away
            await until(lambda: broker.reach.up, "the ACK's call answered")
            second = await k.get(timeout=5)
            assert second.value == "second" and second.ack()
            broker.queues._tasks[2] = asyncio.create_task(broker.queues._beat_loop())


async def test_items_written_before_runs_are_counted_taken_and_reclaimed(url: str) -> None:
    """A Redis that the code before runs wrote to (one record a list element, one a custody
    field by its key, no count), met after an upgrade: its items are counted, taken in order
    and, held by a node that died, given back."""
    async with scripts(url) as (redis, cycle, beat):
        await redis.rpush(P + "q:" + Q, record(0, "old.1"), record(1, "old.2"))
        await redis.hset(f"{P}qh:{Q}:old", "old.3", record(2, "old.3"))
        await redis.sadd(P + "qn:old", Q)
        await cycle(args=cycle_args("a", "1", puts=[(Q, [record(3)], [])]))
        assert await redis.get(P + "ql:" + Q) == b"3"  # the two before, and the new one
        sec, usec = await redis.time()
        now = sec * 1000 + usec // 1000
        await redis.zadd(P + "nodes", {"old": now - 10_000})
        await redis.set(P + "beat", now)
        assert int((await beat(args=[P, "b", 3000, "0", 1500]))[0]) == 1
        assert await redis.get(P + "ql:" + Q) == b"4"
        answer = await cycle(args=cycle_args("a", "2", takes=[("1", Q, 10)]))
        assert took(answer) == [2, 0, 1, 3]  # the one given back first
        assert await leftovers(url, Q) == (0, 4)


async def test_a_take_takes_a_run_whole_when_it_fits_what_it_may_hold(url: str) -> None:
    """A take wants n items and may hold m: it takes whole runs while it has fewer than n, and
    cuts the last only when taking it whole would pass m (no more than m, no fewer than n)."""
    async with scripts(url) as (redis, cycle, _):
        await cycle(args=cycle_args("a", "1", puts=[(Q, [record(i) for i in range(5)], [])]))
        await cycle(args=cycle_args("a", "2", puts=[(Q, [record(i) for i in range(5, 8)], [])]))
        args = cycle_args("a", "3", takes=[("1", Q, 4)])
        args[-1] = 6  # may hold 6: the run of 5 goes whole
        assert took(await cycle(args=args)) == [0, 1, 2, 3, 4]
        args = cycle_args("a", "4", takes=[("2", Q, 1)])
        args[-1] = 2  # may hold 2: the run of 3 is cut to the 1 wanted
        assert took(await cycle(args=args)) == [5]
        assert values(await redis.lrange(P + "q:" + Q, 0, -1)) == [6, 7]
        assert await leftovers(url, Q) == (2, 6)
