"""rubris_asgi/cluster/redis/shards/ against a real Redis Cluster (tests/clusterkit.py): every
partition on its master, scripts on a partition's prefix, SPUBLISH heard, a slot held half
moved (ASK, TRYAGAIN, and what a script's undeclared keys meet then), a resharding under a
writer and a subscriber, a master restarted, a master stalled, a slot no master serves.

One 3-master cluster serves the module (its slot map changes as the tests move slots), with
``cluster-require-full-coverage no``: a master down then stops only its own slots, which is
what rubris on a cluster is for (with the default ``yes`` every master refuses every command
with CLUSTERDOWN as soon as one master is taken for failed)."""

from __future__ import annotations

import asyncio
import collections
import itertools
import os
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import TypeVar

import pytest
import redis as redis_sync
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError, TryAgainError

from rubris_asgi.cluster.redis.nodes import DOWN, REFUSING, RETRIED
from rubris_asgi.cluster.redis.pool import PoolBusy
from rubris_asgi.cluster.redis.shards import (
    Script,
    ShardedClient,
    ShardedSubscriber,
    SlotsRefused,
    slot_of_partition,
    tag,
)
from rubris_asgi.cluster.redis.shards import client as client_module
from rubris_asgi.cluster.redis.shards.partitions import PARTITIONS

from .clusterkit import HOST, Master, RedisCluster

pytestmark = pytest.mark.redis

BASE = "rubris:"
COUNT = Script(
    """
if redis.call('SET', KEYS[2], '1', 'NX', 'PX', 600000) then
  redis.call('INCR', KEYS[1])
  redis.call('SPUBLISH', ARGV[1], ARGV[2])
end
return tonumber(redis.call('GET', KEYS[1]) or '0')
"""
)
"""Counts one batch once, however often it is sent (rubris's scripts are idempotent by batch
id the same way), and publishes the batch's id on the partition's channel. Both keys are
declared, so Redis refuses it with TRYAGAIN while they are split by a migration rather than
run it where one is missing."""

T = TypeVar("T")


@pytest.fixture(scope="module")
def cluster() -> Iterator[RedisCluster]:
    with RedisCluster(3, args=("--cluster-require-full-coverage", "no")) as c:
        yield c


def _url(cluster: RedisCluster) -> str:
    return "redis+cluster://" + ",".join(f"{HOST}:{p}" for p in cluster.ports)


@pytest.fixture
async def client(cluster: RedisCluster) -> AsyncIterator[ShardedClient]:
    """A client of the module's cluster, emptied (FLUSHALL on every master)."""
    await asyncio.to_thread(cluster.flush)
    c = ShardedClient(_url(cluster), socket_timeout=2.0, connect_timeout=1.0)
    await c.start()
    try:
        yield c
    finally:
        await c.close()


class Ears:
    """What a subscriber told: messages, lost and deaf channels."""

    def __init__(self) -> None:
        self.heard: list[tuple[bytes, bytes]] = []
        self.lost: list[bytes] = []
        self.deaf: list[bytes] = []

    def subscriber(self, client: ShardedClient, **options: float) -> ShardedSubscriber:
        return ShardedSubscriber(
            client,
            lambda c, d: self.heard.append((c, d)),
            self.lost.extend,
            deaf=self.deaf.extend,
            **options,
        )

    def got(self, channel: bytes, data: bytes) -> bool:
        return (channel, data) in self.heard


def _direct(port: int) -> redis_sync.Redis:
    return redis_sync.Redis(host=HOST, port=port, socket_timeout=5)


def _keys(client: ShardedClient, p: int, batch: str) -> list[str]:
    pre = client.prefix(BASE, p)
    return [pre + "n", pre + "b:" + batch]


def _channel(client: ShardedClient, p: int) -> bytes:
    return (client.prefix(BASE, p) + "c").encode()


async def _count(client: ShardedClient, p: int, batch: str) -> int:
    reply = await client.run_script(p, COUNT, _keys(client, p, batch), [_channel(client, p), batch])
    return int(reply)


async def _eventually(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:g} s: {what}")
        await asyncio.sleep(0.02)


async def _answered(call: Callable[[], Awaitable[T]], seen: collections.Counter[str]) -> T:
    """``call()`` until it is answered, as ``Reach.until_answered`` does (RETRIED and
    PoolBusy pause and go again); what was met on the way counted in ``seen``."""
    deadline = time.monotonic() + 30
    while True:
        try:
            return await call()
        except (*RETRIED, PoolBusy) as exc:
            seen[type(exc).__name__] += 1
            assert time.monotonic() < deadline, f"not answered within 30 s: {exc!r}"
            await asyncio.sleep(0.05)


def _no_task_left(but: str = "") -> None:
    left = [
        t
        for t in asyncio.all_tasks()
        if t.get_name().startswith("rubris-shards") and (not but or t.get_name() != but)
    ]
    assert not left, left


def _flush_scripts(cluster: RedisCluster) -> None:
    for m in cluster.masters():
        r = _direct(m.port)
        try:
            r.script_flush()
        finally:
            r.close()


def _partitions_of(client: ShardedClient, master: Master) -> list[int]:
    return [p for p in range(PARTITIONS) if master.owns(slot_of_partition(p))]


def _two_masters(cluster: RedisCluster) -> tuple[Master, Master]:
    masters = cluster.masters()
    return masters[0], masters[1]


@pytest.mark.timeout(120)
async def test_every_partition_reaches_its_master(
    cluster: RedisCluster, client: ShardedClient
) -> None:
    masters = cluster.masters()
    r = _direct(masters[0].port)
    try:  # the tags' slots as Redis itself computes them
        assert [r.execute_command("CLUSTER", "KEYSLOT", tag(p)) for p in range(PARTITIONS)] == [
            slot_of_partition(p) for p in range(PARTITIONS)
        ]
    finally:
        r.close()
    if [m.slots for m in masters] == [((0, 5460),), ((5461, 10922),), ((10923, 16383),)]:
        # redis-cli's split (the module's first test sees it): the partitions spread evenly
        assert [len(_partitions_of(client, m)) for m in masters] == [21, 22, 21]
    assert client.slot_map.masters == {(HOST, m.port) for m in masters}
    for p in range(PARTITIONS):
        assert await client.execute(p, "SET", client.prefix(BASE, p) + "k", str(p)) == b"OK"
    for m in masters:
        r = _direct(m.port)
        try:
            for p in _partitions_of(client, m):  # there, not redirected (a plain client)
                assert r.get(client.prefix(BASE, p) + "k") == str(p).encode()
        finally:
            r.close()
    for m in masters:  # a pipeline and redis-py's own client on a partition of each master
        p = _partitions_of(client, m)[0]
        key = client.prefix(BASE, p) + "k"
        pipe = client.pipeline(p).command("INCR", key).command("GET", key)
        assert await pipe.execute() == [p + 1, str(p + 1).encode()]
        assert await client.client_for(p).get(key) == str(p + 1).encode()


@pytest.mark.timeout(120)
async def test_scripts_on_a_partition_and_spublish_heard(
    cluster: RedisCluster, client: ShardedClient
) -> None:
    ears = Ears()
    sub = ears.subscriber(client)
    parts = [_partitions_of(client, m)[1] for m in cluster.masters()]
    try:
        for p in parts:
            await sub.follow(_channel(client, p))
            await sub.follow(_channel(client, p))  # idempotent
            assert sub.heard_now(_channel(client, p))
        for p in parts:
            assert await _count(client, p, "s1") == 1
            assert await _count(client, p, "s1") == 1  # the same batch again: counted once
            assert await _count(client, p, "s2") == 2
        await _eventually(
            lambda: all(ears.got(_channel(client, p), b) for p in parts for b in (b"s1", b"s2")),
            5,
            "every SPUBLISH of the scripts heard",
        )
        assert len(ears.heard) == 2 * len(parts)  # a repeat publishes nothing
        _flush_scripts(cluster)  # an empty script cache, every connection alive
        for p in parts:  # NOSCRIPT: sent again as EVAL
            assert await _count(client, p, "s3") == 3
        for p in parts:  # known to be missing there: loaded first, in the same round trip
            pipe = client.pipeline(p)
            pipe.script(COUNT, _keys(client, p, "s4"), [_channel(client, p), "s4"])
            pipe.command("GET", client.prefix(BASE, p) + "n")
            assert await pipe.execute() == [4, b"4"]
        _flush_scripts(cluster)
        for p in parts:
            pipe = client.pipeline(p)
            pipe.script(COUNT, _keys(client, p, "s5"), [_channel(client, p), "s5"])
            pipe.command("GET", client.prefix(BASE, p) + "n")
            # the script answered NOSCRIPT ran again after the GET (pipeline.py says so)
            assert await pipe.execute() == [5, b"4"]
        sub.unfollow(_channel(client, parts[0]))
        sub.unfollow(_channel(client, parts[0]))  # idempotent
        assert await _count(client, parts[0], "s6") == 6
        assert await _count(client, parts[1], "s6") == 6
        await _eventually(lambda: ears.got(_channel(client, parts[1]), b"s6"), 5, "s6 heard")
        assert not ears.got(_channel(client, parts[0]), b"s6")
        assert not ears.lost and not ears.deaf
    finally:
        await sub.close()
    _no_task_left(but="rubris-shards-refresh")  # the client's: closed with it


@pytest.mark.timeout(120)
async def test_a_slot_held_half_moved(
    cluster: RedisCluster, client: ShardedClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a client meets while a partition's slot is in migration, some of its keys moved:
    ASK followed, TRYAGAIN for a script whose declared keys are split, and what a script's
    undeclared keys meet (the port of the broker must declare what its scripts touch)."""
    source, target = _two_masters(cluster)
    q = _partitions_of(client, source)[2]
    slot = slot_of_partition(q)
    pre = client.prefix(BASE, q)
    moved_key, staying_key = pre + "a", pre + "b"
    for key in (moved_key, staying_key):
        await client.execute(q, "SET", key, key[-1])
    ears = Ears()
    sub = ears.subscriber(client)
    channel = _channel(client, q)
    await sub.follow(channel)
    read_two = Script(
        "return {redis.call('GET', KEYS[1]) or 'nil', redis.call('GET', ARGV[1]) or 'nil'}"
    )
    spublish = Script("redis.call('SPUBLISH', ARGV[1], ARGV[2]) return redis.call('GET', KEYS[1])")
    try:
        await asyncio.to_thread(cluster.open_migration, slot, target.port)
        r = _direct(source.port)
        try:
            assert r.execute_command(
                "MIGRATE", HOST, target.port, "", 0, 5000, "KEYS", moved_key
            ) in (b"OK", "OK")
        finally:
            r.close()
        # ASK: the moved key is served by the target, after ASKING, the map unchanged
        assert await client.execute(q, "GET", moved_key) == b"a"
        assert await client.execute(q, "GET", staying_key) == b"b"
        assert client.slot_map.owner(slot) == (HOST, source.port)
        # both keys declared, split: TRYAGAIN until the waits run out, then Redis refusing
        monkeypatch.setattr(client_module, "TRY_AGAIN", 2)
        with pytest.raises(TryAgainError) as refused:
            await client.run_script(q, read_two, [moved_key, staying_key], [staying_key])
        assert isinstance(refused.value, REFUSING)
        # declared: the moved key (missing on the source: ASK, run on the target); the key
        # still on the source, undeclared, reads as absent there: a wrong answer, no error
        assert await client.run_script(q, read_two, [moved_key], [staying_key]) == [b"a", b"nil"]
        # declared: the key still on the source (run there); the moved key, undeclared, is
        # not local: the script fails at that call (what it wrote before stays written)
        with pytest.raises(ResponseError, match="non local key"):
            await client.run_script(q, read_two, [staying_key], [moved_key])
        # SPUBLISH in a script run on the target (by ASK): the subscriber, on the source
        # until the slot is given over, does not hear it
        assert await client.run_script(q, spublish, [moved_key], [channel, "by-ask"]) == b"a"
        assert await client.run_script(q, spublish, [staying_key], [channel, "at-source"]) == b"b"
        await _eventually(lambda: ears.got(channel, b"at-source"), 5, "the source's SPUBLISH")
        assert not ears.got(channel, b"by-ask")
        await asyncio.to_thread(cluster.move_keys, slot, target.port)
        await asyncio.to_thread(cluster.close_migration, slot, target.port)
        # the source unsubscribes the slot's channels itself; the subscriber follows the slot
        # to the target and reports the channel lost once heard there
        await _eventually(lambda: ears.lost == [channel], 10, "the moved channel reported lost")
        assert ears.deaf == [channel]
        assert sub.heard_now(channel)
        assert await client.run_script(q, spublish, [moved_key], [channel, "after"]) == b"a"
        await _eventually(lambda: ears.got(channel, b"after"), 5, "the target's SPUBLISH")
        assert client.slot_map.owner(slot) == (HOST, target.port)  # MOVED, or the map read
        stats = client.stats
        assert stats.asked >= 3 and stats.tried_again >= 1 and stats.refused >= 1, stats
    finally:
        await sub.close()
        await asyncio.to_thread(cluster.wait_ok)


@pytest.mark.timeout(120)
async def test_resharding_under_a_writer_and_a_subscriber(
    cluster: RedisCluster, client: ShardedClient
) -> None:
    source, target = _two_masters(cluster)
    on_source = _partitions_of(client, source)
    half = set(source.slot_list()[: source.slot_count // 2])
    moving = [p for p in on_source if slot_of_partition(p) in half]
    staying = [p for p in on_source if p not in moving]
    assert moving and staying
    ears = Ears()
    sub = ears.subscriber(client)
    for p in on_source:
        await sub.follow(_channel(client, p))
    counted: collections.Counter[int] = collections.Counter()
    seen: collections.Counter[str] = collections.Counter()
    stop = asyncio.Event()
    ids = itertools.count()

    async def write() -> None:
        for p in itertools.cycle(on_source):
            if stop.is_set():
                return
            batch = f"w{next(ids)}"
            await _answered(lambda p=p, batch=batch: _count(client, p, batch), seen)
            counted[p] += 1

    writers = [asyncio.create_task(write()) for _ in range(4)]
    try:
        await asyncio.sleep(0.3)
        before = sum(counted.values())
        await asyncio.to_thread(
            cluster.migrate_half, source.port, target.port, batch=20, pause=0.01
        )
        during = sum(counted.values()) - before
        await asyncio.sleep(0.3)
    finally:
        stop.set()
        done = await asyncio.gather(*writers, return_exceptions=True)
    assert all(d is None for d in done), done
    assert during > 0, "the writers wrote while the slots moved"
    assert client.stats.moved > 0  # the writers were sent on by MOVED, not only by map reads
    for p in on_source:  # every batch counted once: none lost, none doubled
        n = await client.execute(p, "GET", client.prefix(BASE, p) + "n")
        assert int(n or 0) == counted[p], (p, seen)
    assert {client.slot_map.owner(slot_of_partition(p)) for p in moving} == {(HOST, target.port)}
    moved_channels = {_channel(client, p) for p in moving}
    await _eventually(
        lambda: set(ears.lost) == moved_channels, 10, "every moved partition's channel lost"
    )
    assert sorted(ears.lost) == sorted(moved_channels)  # each once, and only those
    assert set(ears.deaf) == moved_channels
    for p in on_source:  # heard where each partition is now
        assert await _count(client, p, "after") == counted[p] + 1
    await _eventually(
        lambda: all(ears.got(_channel(client, p), b"after") for p in on_source),
        5,
        "every partition heard after the resharding",
    )
    await sub.close()


@pytest.mark.timeout(120)
async def test_a_master_restarted(cluster: RedisCluster, client: ShardedClient) -> None:
    masters = cluster.masters()
    dead, alive = masters[-1], masters[0]
    d, a = _partitions_of(client, dead)[0], _partitions_of(client, alive)[0]
    ears = Ears()
    sub = ears.subscriber(client, ping_every=0.5, ping_timeout=1.0)
    for p in (d, a):
        await sub.follow(_channel(client, p))
    outcomes: dict[int, list[tuple[str, float]]] = {d: [], a: []}
    stop = asyncio.Event()

    async def call(p: int) -> None:
        while not stop.is_set():
            began = time.monotonic()
            try:
                await client.execute(p, "INCR", client.prefix(BASE, p) + "r")
                what = "ok"
            except (*DOWN, *REFUSING) as exc:
                what = type(exc).__name__
            outcomes[p].append((what, time.monotonic() - began))
            await asyncio.sleep(0.02)

    callers = [asyncio.create_task(call(p)) for p in (d, a)]
    try:
        await asyncio.sleep(0.2)
        await asyncio.to_thread(cluster.restart, dead.port)
        mark = len(outcomes[d])
        await _eventually(
            lambda: any(w == "ok" for w, _ in outcomes[d][mark:]), 15, "the restarted master"
        )
        await asyncio.sleep(0.2)
    finally:
        stop.set()
        await asyncio.gather(*callers)
    assert all(w == "ok" for w, _ in outcomes[a]), collections.Counter(w for w, _ in outcomes[a])
    failed = [w for w, _ in outcomes[d] if w != "ok"]
    assert failed, "calls to the stopped master failed meanwhile"
    assert max(t for _, t in outcomes[d] + outcomes[a]) < client.socket_timeout + 1.0
    await _eventually(lambda: ears.lost == [_channel(client, d)], 10, "its channel lost")
    assert ears.deaf == [_channel(client, d)]
    assert await _count(client, d, "back") >= 1
    await _eventually(lambda: ears.got(_channel(client, d), b"back"), 5, "heard again")
    await sub.close()


@pytest.mark.timeout(120)
async def test_a_master_stalled(cluster: RedisCluster, client: ShardedClient) -> None:
    """A master that stops answering without closing anything (SIGSTOP): its subscriber
    connection hears nothing either way, and only the PING tells."""
    stalled = cluster.masters()[1]
    s = _partitions_of(client, stalled)[0]
    ears = Ears()
    sub = ears.subscriber(client, ping_every=0.3, ping_timeout=0.7)
    channel = _channel(client, s)
    await sub.follow(channel)
    r = _direct(stalled.port)
    try:
        pid = int(r.info("server")["process_id"])
    finally:
        r.close()
    os.kill(pid, signal.SIGSTOP)
    began = time.monotonic()
    # a command waits socket_timeout, no longer; the subscriber's PING tells sooner
    call = asyncio.create_task(client.execute(s, "GET", client.prefix(BASE, s) + "n"))
    try:
        await _eventually(lambda: ears.deaf == [channel], 3, "the stall noticed by PING")
        assert time.monotonic() - began < 0.3 + 0.7 + 0.5
        # a follow of another channel of that master fails at once, and is not kept
        other = _channel(client, _partitions_of(client, stalled)[1])
        with pytest.raises(RedisConnectionError, match="is down"):
            await sub.follow(other)
        assert not sub.following(other)
        with pytest.raises(DOWN):
            await call
        assert time.monotonic() - began < client.socket_timeout + 1.0
    finally:
        os.kill(pid, signal.SIGCONT)
        call.cancel()  # done already, unless an assertion above failed
    await _eventually(lambda: ears.lost == [channel], 15, "heard again after the stall")
    seen: collections.Counter[str] = collections.Counter()
    await _answered(lambda: _count(client, s, "unstalled"), seen)
    await _eventually(lambda: ears.got(channel, b"unstalled"), 5, "a message after the stall")
    await sub.close()
    await asyncio.to_thread(cluster.wait_ok)


@pytest.mark.timeout(120)
async def test_a_slot_no_master_serves_is_refused(
    cluster: RedisCluster, client: ShardedClient
) -> None:
    master = cluster.masters()[0]
    p = _partitions_of(client, master)[3]
    slot = slot_of_partition(p)
    r = _direct(master.port)
    try:
        r.execute_command("CLUSTER", "DELSLOTS", slot)
        began = time.monotonic()
        with pytest.raises(SlotsRefused, match="CLUSTERDOWN") as refused:
            await client.execute(p, "GET", client.prefix(BASE, p) + "k")
        assert isinstance(refused.value, REFUSING)
        assert time.monotonic() - began < 1.0  # refused at once, not retried here
    finally:
        r.execute_command("CLUSTER", "ADDSLOTS", slot)
        r.close()
    await asyncio.to_thread(cluster.wait_ok)
    assert await client.execute(p, "SET", client.prefix(BASE, p) + "k", "x") == b"OK"


@pytest.mark.timeout(120)
async def test_a_master_failed_over_to_its_replica() -> None:
    """A master killed (SIGKILL): its replica takes its slots after the node timeout. The
    calls to its partitions fail meanwhile (a lost connection), the failure makes the client
    read the map again from the other nodes, and the calls then reach the promoted replica;
    the subscriber follows its channels there and reports them lost."""
    async with RedisCluster(
        3, replicas=1, args=("--cluster-require-full-coverage", "no")
    ) as cluster:
        client = ShardedClient(_url(cluster), socket_timeout=2.0, connect_timeout=1.0)
        await client.start()
        ears = Ears()
        sub = ears.subscriber(client, ping_every=0.5, ping_timeout=1.0)
        try:
            master, other = cluster.masters()[:2]
            p, q = _partitions_of(client, master)[0], _partitions_of(client, other)[0]
            for x in (p, q):
                await sub.follow(_channel(client, x))
            assert await _count(client, p, "before") == 1
            r = _direct(master.port)
            try:  # the replica has it before its master dies
                assert r.execute_command("WAIT", 1, 5000) == 1
            finally:
                r.close()
            await asyncio.to_thread(cluster.kill, master.port, hard=True)
            began = time.monotonic()
            seen: collections.Counter[str] = collections.Counter()
            assert await _answered(lambda: _count(client, p, "after"), seen) == 2
            assert time.monotonic() - began < 15
            assert seen, "calls failed while the master was gone"
            assert client.slot_map.owner(slot_of_partition(p)) == (HOST, master.replicas[0])
            assert await _count(client, q, "after") == 1  # the other master's: untouched
            await _eventually(lambda: ears.lost == [_channel(client, p)], 10, "lost, then heard")
            assert await _count(client, p, "later") == 3
            await _eventually(lambda: ears.got(_channel(client, p), b"later"), 5, "heard there")
            assert ears.deaf == [_channel(client, p)]
        finally:
            await sub.close()
            await client.close()
        _no_task_left()
