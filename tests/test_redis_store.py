"""What is particular to ``RedisBatchStore``: its keys, its footprint, its speed, and that
it answers exactly as ``MemoryBatchStore`` does (the behaviour every store shares is tested
in test_batch_stores.py).

``python3 -m tests.test_redis_store`` measures acks per second and bytes per item alone.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as aioredis

from rubris_asgi.batches.bits import CHUNK_BITS, CHUNK_BYTES
from rubris_asgi.batches.ids import ItemRef
from rubris_asgi.batches.store import BatchStore, MemoryBatchStore
from rubris_asgi.batches.tracker import BatchStatus, State
from rubris_asgi.cluster.redis import batch_store as redis_store
from rubris_asgi.cluster.redis.batch_store import RedisBatchStore
from rubris_asgi.config import BatchConfig
from rubris_asgi.errors import BatchError, UnknownBatch

from . import rediskit

pytestmark = pytest.mark.redis  # every test here runs a real redis-server

redis_server = rediskit.redis_server
redis_url = rediskit.redis_url

PREFIX = "rubris:"


@pytest.fixture
async def store(redis_url: str) -> AsyncIterator[RedisBatchStore]:
    s = RedisBatchStore(redis_url)
    await s.start()
    try:
        yield s
    finally:
        await s.close()


@pytest.fixture
async def raw(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    """A client to look at the keys behind the store's back."""
    client = aioredis.Redis.from_url(redis_url)
    try:
        yield client
    finally:
        await client.aclose()


def chunk_key(batch: str, k: int) -> str:
    return f"{PREFIX}batch:{{{batch}}}:c:{k}"


async def keys_of(raw: aioredis.Redis, batch: str) -> list[bytes]:
    """Every key whose name holds the batch's id."""
    return sorted([k async for k in raw.scan_iter(match=f"*{batch}*")])


async def members_of(raw: aioredis.Redis, batch: str) -> list[str]:
    """The sweeper's sets that still list the batch."""
    names = ("open", "sealed", "ended")
    return [n for n in names if await raw.zscore(f"{PREFIX}batches:{n}", batch) is not None]


async def redis_chunks(raw: aioredis.Redis, batch: str) -> dict[int, bytes]:
    out: dict[int, bytes] = {}
    async for key in raw.scan_iter(match=chunk_key(batch, 0)[:-1] + "*"):
        k = int(key.rsplit(b":", 1)[1])
        assert await raw.strlen(key) == CHUNK_BYTES
        value = await raw.get(key)
        assert isinstance(value, bytes)
        out[k] = value
    return out


def memory_chunks(mem: MemoryBatchStore, batch: str) -> dict[int, bytes]:
    return {k: bytes(buf) for k, buf in mem.view.chunks.get(batch, {}).items()}


# the keys


async def test_chunks_are_made_full_size_with_the_bits_of_bits_py(
    store: RedisBatchStore, raw: aioredis.Redis
) -> None:
    mem = MemoryBatchStore()
    rng = random.Random(7)
    # groups that start and end mid-byte, mid-chunk, on a chunk's edge, and span chunks
    counts = [5, 3, 1, CHUNK_BITS - 9, 1, 2 * CHUNK_BITS + 13, 8, 16, CHUNK_BITS, 3]
    for s in (mem, store):
        await s.open("b1", 1.0)
    for g, n in enumerate(counts):
        for s in (mem, store):
            assert await s.add("b1", n, 2.0) == g
        assert await redis_chunks(raw, "b1") == memory_chunks(mem, "b1")
    items = [
        ItemRef("b1", g, i) for g, n in enumerate(counts) for i in rng.sample(range(n), min(n, 200))
    ]
    for s in (mem, store):
        await s.end(items, 3.0)
        await s.end(items[:50], 3.5, failed=True)  # ended already: nothing changes
    got = await redis_chunks(raw, "b1")
    assert got == memory_chunks(mem, "b1")
    assert sorted(got) == list(range((sum(counts) + CHUNK_BITS - 1) // CHUNK_BITS))
    assert await store.status("b1") == await mem.status("b1")


async def test_a_chunk_is_never_grown_past_its_size(
    store: RedisBatchStore, raw: aioredis.Redis
) -> None:
    await store.open("b1", 1.0)
    for _ in range(20):  # adds of one item: each a SETBIT on the same chunk
        await store.add("b1", 1, 2.0)
    key = chunk_key("b1", 0)
    assert await raw.strlen(key) == CHUNK_BYTES
    usage = await raw.memory_usage(key, samples=0)
    assert usage is not None and usage < CHUNK_BYTES + 200  # no greedy sds preallocation


async def test_an_ended_batch_keeps_no_chunks(store: RedisBatchStore, raw: aioredis.Redis) -> None:
    await store.open("done", 1.0)
    g = await store.add("done", 3 * CHUNK_BITS + 5, 1.0)
    await store.end([ItemRef("done", g, i) for i in range(0, 3 * CHUNK_BITS + 5, 2)], 2.0)
    assert len(await redis_chunks(raw, "done")) == 4
    await store.seal("done", 3.0)
    last = await store.end([ItemRef("done", g, i) for i in range(1, 3 * CHUNK_BITS + 5, 2)], 4.0)
    assert last["done"] == BatchStatus(
        State.COMPLETE, 3 * CHUNK_BITS + 5, 3 * CHUNK_BITS + 5, 0, True
    )
    assert await redis_chunks(raw, "done") == {}

    await store.open("idle", 1.0)
    await store.add("idle", 10, 1.0)
    expired = await store.sweep(1.0 + store.config.expiry + 1)
    assert [b for b, _ in expired] == ["idle"]
    assert await redis_chunks(raw, "idle") == {}
    assert await members_of(raw, "idle") == ["ended"]
    assert await keys_of(raw, "done") == []  # ended a week ago: forgotten by the same sweep


async def test_sweep_forgets_every_key(store: RedisBatchStore, raw: aioredis.Redis) -> None:
    store.configure(BatchConfig(expiry=10.0, sealed_expiry=20.0, keep=5.0))
    for batch in ("c0mplete", "exp1red", "l1ve"):
        await store.open(batch, 100.0)
        for n in (4, CHUNK_BITS + 1):
            await store.add(batch, n, 100.0)
    await store.end([ItemRef("exp1red", 1, 0)], 101.0)
    await store.seal("c0mplete", 101.0)
    await store.end([ItemRef("c0mplete", g, i) for g in (0, 1) for i in range(4)], 102.0)
    await store.end(
        [ItemRef("c0mplete", 1, i) for i in range(4, CHUNK_BITS + 1)], 103.0, failed=True
    )
    assert (await store.status("c0mplete")).state is State.COMPLETE
    await store.end([ItemRef("l1ve", 0, 0)], 113.0)  # activity: it stays
    assert await store.sweep(111.5) == [
        ("exp1red", BatchStatus(State.EXPIRED, CHUNK_BITS + 5, 1, 0))
    ]
    assert await store.sweep(116.4) == []  # ended at 103.0 and 111.5, each kept 5 s
    assert await keys_of(raw, "c0mplete") == []
    assert await members_of(raw, "c0mplete") == []
    assert await keys_of(raw, "exp1red") != []
    assert await store.sweep(116.6) == []
    assert await keys_of(raw, "exp1red") == []
    assert await members_of(raw, "exp1red") == []
    for batch in ("c0mplete", "exp1red"):
        with pytest.raises(UnknownBatch):
            await store.status(batch)
    assert len(await keys_of(raw, "l1ve")) == 4  # record, groups, two chunks
    assert await members_of(raw, "l1ve") == ["open"]


async def test_sweep_in_bounded_steps_lists_batches_as_opened(
    store: RedisBatchStore, raw: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(redis_store, "_SWEEP_LIMIT", 3)
    store.configure(BatchConfig(expiry=10.0, sealed_expiry=10.0, keep=5.0))
    names = [f"s{i}" for i in range(11)]
    for i, batch in enumerate(names):
        await store.open(batch, 100.0 - i)  # the last opened idles longest
        await store.add(batch, 1, 100.0 - i)
        if i % 2:
            await store.seal(batch, 100.0 - i)
    expired = await store.sweep(120.0)
    assert [b for b, _ in expired] == names
    assert all(s == BatchStatus(State.EXPIRED, 1, 0, 0) for _, s in expired)
    assert await store.sweep(125.5) == []
    assert [k async for k in raw.scan_iter(match=f"{PREFIX}batch:*")] == []
    assert await raw.zcard(f"{PREFIX}batches:ended") == 0


async def test_footprint_of_a_million_items(store: RedisBatchStore) -> None:
    assert await store.footprint() == 0
    await store.open("big", 1.0)
    await store.add("big", 1_000_000, 1.0)
    per_item = await store.footprint() / 1_000_000
    print(f"footprint: {per_item:.3f} bytes/item")
    assert 0.125 < per_item <= 0.2


async def test_footprint_counts_only_its_prefix(redis_url: str) -> None:
    a = RedisBatchStore(redis_url, prefix="t[1]*:")  # glob characters in the prefix
    b = RedisBatchStore(redis_url, prefix="t1x:")
    try:
        await a.open("x", 1.0)
        await a.add("x", 100, 1.0)
        assert await b.footprint() == 0
        with pytest.raises(UnknownBatch):
            await b.status("x")
        assert await a.footprint() > 992
    finally:
        await a.close()
        await b.close()


async def test_a_client_of_the_caller_decoding_responses(redis_url: str) -> None:
    client = aioredis.Redis.from_url(redis_url, decode_responses=True)
    s = RedisBatchStore(client=client)
    try:
        await s.open("d", 1.0)
        g = await s.add("d", 2, 1.0)
        assert (await s.seal("d", 2.0)).state is State.SEALED
        out = await s.end([ItemRef("d", g, 0), ItemRef("d", g, 1)], 3.0)
        assert out == {"d": BatchStatus(State.COMPLETE, 2, 2, 0, True)}
        await s.close()
        assert await client.ping()  # the caller's client is the caller's to close
    finally:
        await client.aclose()


# atomicity and speed


async def test_concurrent_acks_lose_nothing_and_complete_once(redis_url: str) -> None:
    stores = [RedisBatchStore(redis_url) for _ in range(4)]
    try:
        n = 40_000
        await stores[0].open("race", 1.0)
        g = await stores[0].add("race", n, 1.0)
        await stores[0].seal("race", 1.0)
        refs = [ItemRef("race", g, i) for i in range(n)]
        rng = random.Random(3)
        # every item acked twice, by two different workers, in slices of 500
        work: list[list[list[ItemRef]]] = [[] for _ in stores]
        for rep in range(2):
            order = refs[:]
            rng.shuffle(order)
            for j in range(0, n, 500):
                work[(j // 500 + rep) % len(stores)].append(order[j : j + 500])

        async def worker(s: RedisBatchStore, slices: list[list[ItemRef]]) -> list[BatchStatus]:
            return [(await s.end(refs, 2.0))["race"] for refs in slices]

        answers = await asyncio.gather(*(worker(s, w) for s, w in zip(stores, work, strict=True)))
        flat = [a for got in answers for a in got]
        assert sum(a.completed for a in flat) == 1
        assert await stores[1].status("race") == BatchStatus(State.COMPLETE, n, n, 0)
    finally:
        for s in stores:
            await s.close()


async def ack_rate(store: BatchStore, n: int = 1_000_000, per_call: int = 1_000) -> float:
    """Acks a second: a batch of ``n`` items added at once, sealed, acked ``per_call`` at a time."""
    await store.open("rate", 1.0)
    g = await store.add("rate", n, 1.0)
    await store.seal("rate", 1.0)
    refs = [ItemRef("rate", g, i) for i in range(n)]
    completed = 0
    started = time.perf_counter()
    for i in range(0, n, per_call):
        completed += (await store.end(refs[i : i + per_call], 2.0))["rate"].completed
    rate = n / (time.perf_counter() - started)
    assert completed == 1
    return rate


async def test_an_end_is_one_round_trip_whatever_its_size(
    store: RedisBatchStore, redis_url: str
) -> None:
    # the speed itself is bench/batches.py's (timed tests lie on a shared machine); what makes
    # it is countable: one script call an end, not a command an item
    client = aioredis.from_url(redis_url)
    try:

        async def scripts() -> int:
            info = await client.info("commandstats")
            return int(info.get("cmdstat_evalsha", {}).get("calls", 0))

        await store.open("rt", 1.0)
        g = await store.add("rt", 20_000, 1.0)
        for n in (1, 1000, 10_000):
            before = await scripts()
            await store.end([ItemRef("rt", g, i) for i in range(n)], 2.0)
            assert await scripts() - before == 1
    finally:
        await client.aclose()


# the same answers as the memory store


Outcome = tuple[Any, ...]


async def outcome(call: Any) -> Outcome:
    try:
        return ("ok", await call)
    except BatchError as e:
        return ("error", type(e).__name__, str(e), e.item)


class Twins:
    """The same random operations on the memory store and the Redis store, side by side."""

    def __init__(self, rng: random.Random, red: RedisBatchStore) -> None:
        self.rng = rng
        self.mem = MemoryBatchStore()
        self.red = red
        config = BatchConfig(
            expiry=30.0, sealed_expiry=20.0, keep=15.0, max_items=3 * CHUNK_BITS, max_groups=6
        )
        self.mem.configure(config)
        self.red.configure(config)
        self.now = 1_000.0
        self.opened: list[str] = []
        self.log: list[str] = []

    async def both(self, name: str, *args: Any, **kw: Any) -> None:
        self.log.append(f"{name}{args}{kw}")
        want = await outcome(getattr(self.mem, name)(*args, **kw))
        got = await outcome(getattr(self.red, name)(*args, **kw))
        assert got == want, "\n".join(self.log[-15:])

    def batch(self) -> str:
        rng = self.rng
        if not self.opened or rng.random() < 0.03:
            return rng.choice(["nope", "gone"])
        if rng.random() < 0.8:  # mostly the recent ones, still live
            return rng.choice(self.opened[-4:])
        return rng.choice(self.opened)

    def groups(self, batch: str) -> list[tuple[int, int]]:
        return self.mem.view.groups.get(batch, [])

    def item(self, batch: str) -> ItemRef:
        rng = self.rng
        groups = self.groups(batch)
        if not groups or rng.random() < 0.05:
            return ItemRef(batch, rng.randrange(len(groups) + 2), rng.randrange(5))
        g = rng.randrange(len(groups))
        size = groups[g][1]
        index = rng.randrange(size + 1) if rng.random() < 0.05 else rng.randrange(size)
        return ItemRef(batch, g, index)

    def items(self) -> list[ItemRef]:
        rng = self.rng
        batches = [self.batch() for _ in range(rng.choice([1, 1, 1, 2, 3]))]
        if rng.random() < 0.4:  # a whole group, to complete batches now and then
            batch = batches[0]
            groups = self.groups(batch)
            if groups:
                g = rng.randrange(len(groups))
                out = [ItemRef(batch, g, i) for i in range(groups[g][1])]
                rng.shuffle(out)
                return out
        return [self.item(rng.choice(batches)) for _ in range(rng.randrange(1, 12))]

    async def step(self) -> None:
        rng = self.rng
        self.now += rng.choice([0.0, 0.25, rng.uniform(0, 1), rng.uniform(0, 3)])
        if rng.random() < 0.02:  # long enough for live batches to expire, ended ones to go
            self.now += rng.choice([15.0, 20.0, 30.0, rng.uniform(0, 40)])
        op = rng.choices(
            ["open", "add", "seal", "ack", "fail", "check", "status", "sweep"],
            [2, 6, 2, 10, 2, 2, 2, 2],
        )[0]
        now = self.now
        if op == "open":
            batch = f"b{len(self.opened)}"
            self.opened.append(batch)
            await self.both("open", batch, now)
        elif op == "add":
            count = rng.choice([-1, 0, 1, 2, 3, 7, 8, 9, 17, 100, CHUNK_BITS - 1, CHUNK_BITS + 3])
            await self.both("add", self.batch(), count, now)
        elif op == "seal":
            await self.both("seal", self.batch(), now)
        elif op in ("ack", "fail"):
            await self.both("end", self.items(), now, failed=op == "fail")
        elif op == "check":
            await self.both("check", self.items())
        elif op == "status":
            await self.both("status", self.batch())
        else:
            await self.both("sweep", now)

    async def compare_bits(self, raw: aioredis.Redis) -> None:
        for batch in self.opened:
            assert await redis_chunks(raw, batch) == memory_chunks(self.mem, batch), batch


@pytest.mark.parametrize("seed", range(12))
async def test_same_answers_as_the_memory_store(
    seed: int, store: RedisBatchStore, raw: aioredis.Redis
) -> None:
    twins = Twins(random.Random(seed), store)
    for _ in range(250):
        await twins.step()
    await twins.compare_bits(raw)
    for batch in twins.opened:
        await twins.both("status", batch)


async def _main() -> None:
    with rediskit.RedisServer() as server:
        store = RedisBatchStore(server.url)
        try:
            await store.open("size", 1.0)
            await store.add("size", 1_000_000, 1.0)
            print(f"footprint: {await store.footprint() / 1_000_000:.3f} bytes/item")
            rate = await ack_rate(store)
            print(f"acks: {rate:,.0f}/s (1,000,000 items, 1,000 a call)")
        finally:
            await store.close()


if __name__ == "__main__":
    asyncio.run(_main())
