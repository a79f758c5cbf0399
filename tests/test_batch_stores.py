"""Every batch store passes the same suite: memory, SQLite and a real redis-server.

The behaviour is tracker.py's; what this adds is storage: the state lasts across operations
(and, for SQLite and Redis, across store objects and processes), four processes acking
disjoint and overlapping items of one batch at the same time lose no bit and exactly one of
them is told ``completed``, and the sweeper expires and forgets with a fake clock.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import random
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from rubris_asgi.batches import (
    BatchStore,
    MemoryBatchStore,
    SQLiteBatchStore,
    State,
    parse_item,
)
from rubris_asgi.batches.ids import ItemRef
from rubris_asgi.config import BatchConfig
from rubris_asgi.errors import BadCount, BatchExists, BatchSealed, ItemOutOfRange, UnknownBatch

from .rediskit import RedisServer, redis_server  # noqa: F401 (the fixture)

T0 = 2_000_000_000.0
KINDS = ["memory", "sqlite", "redis"]


def make_store(kind: str, where: str) -> BatchStore:
    if kind == "memory":
        return MemoryBatchStore()
    if kind == "sqlite":
        return SQLiteBatchStore(where)
    from rubris_asgi.cluster.redis.batch_store import RedisBatchStore

    return RedisBatchStore(where)


@pytest.fixture(params=KINDS)
async def store_maker(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[Callable[[], BatchStore]]:
    """Makes stores of one kind over the same data (one database file, one Redis db)."""
    kind: str = request.param
    where = str(tmp_path / "batches.sqlite3")
    if kind == "redis":
        server: RedisServer = request.getfixturevalue("redis_server")
        server.flush()
        where = server.url
    made: list[BatchStore] = []
    shared = make_store(kind, where)  # memory: one object is all the "storage" there is

    def maker() -> BatchStore:
        s = shared if kind == "memory" else make_store(kind, where)
        made.append(s)
        return s

    yield maker
    for s in made:
        await s.close()


@pytest.fixture
async def store(store_maker: Callable[[], BatchStore]) -> BatchStore:
    s = store_maker()
    await s.start()
    return s


def refs(batch: str, group: int, indexes: range | list[int]) -> list[ItemRef]:
    return [ItemRef(batch, group, i) for i in indexes]


async def test_the_source_documents_cases(store: BatchStore) -> None:
    # acks before the seal: the seal says complete
    await store.open("early", T0)
    g = await store.add("early", 3, T0)
    assert (await store.end(refs("early", g, range(3)), T0))["early"].done == 3
    sealed = await store.seal("early", T0)
    assert sealed.completed and sealed.state is State.COMPLETE
    # seal first: the last ack says complete; double acks and a retried consumer count once
    await store.open("late", T0)
    await store.add("late", 2, T0)
    await store.add("late", 3, T0)
    assert (await store.seal("late", T0)).state is State.SEALED
    answers = [
        await store.end([ItemRef("late", 1, 2), ItemRef("late", 1, 2)], T0),
        await store.end(refs("late", 0, [1, 0]), T0),
        await store.end(refs("late", 0, [1]), T0),  # retried
        await store.end(refs("late", 1, [0, 1]), T0),
        await store.end(refs("late", 1, [1]), T0),
    ]
    assert [a["late"].done for a in answers] == [1, 3, 3, 5, 5]
    assert [a["late"].completed for a in answers] == [False, False, False, True, False]
    assert (await store.status("late")).to_json() == {
        "state": "complete",
        "total": 5,
        "done": 5,
        "failed": 0,
        "completed": False,
    }


async def test_state_lasts_across_store_objects(store_maker: Callable[[], BatchStore]) -> None:
    a = store_maker()
    await a.start()
    await a.open("b", T0)
    await a.add("b", 10_000, T0)
    await a.end(refs("b", 0, range(0, 10_000, 2)), T0)
    await a.end(refs("b", 0, [1]), T0, failed=True)
    await a.close()
    b = store_maker()
    await b.start()
    st = await b.status("b")
    assert (st.state, st.total, st.done, st.failed) == (State.OPEN, 10_000, 5000, 1)
    st = (await b.end(refs("b", 0, range(10_000)), T0))["b"]
    assert (st.done, st.failed) == (9999, 1)
    assert (await b.seal("b", T0)).completed


async def test_errors_change_nothing(store: BatchStore) -> None:
    await store.open("b", T0)
    await store.add("b", 5, T0)
    await store.open("c", T0)
    await store.add("c", 1, T0)
    cases: list[tuple[list[ItemRef], type[Exception], str]] = [
        (refs("c", 0, [0]) + refs("b", 0, [0, 5]), ItemOutOfRange, "b:0:5"),
        (refs("b", 0, [1]) + refs("b", 1, [0]), ItemOutOfRange, "b:1:0"),
        (refs("b", 0, [2]) + refs("zz", 0, [0]), UnknownBatch, "zz:0:0"),
    ]
    for items, kind, item in cases:
        with pytest.raises(kind) as exc:
            await store.end(items, T0)
        assert exc.value.item == item  # type: ignore[attr-defined]
        with pytest.raises(kind):
            await store.check(items)
    assert (await store.status("b")).done == 0 and (await store.status("c")).done == 0
    with pytest.raises(BadCount):
        await store.add("b", 0, T0)
    with pytest.raises(UnknownBatch):
        await store.add("nope", 1, T0)
    with pytest.raises(UnknownBatch):
        await store.seal("nope", T0)
    with pytest.raises(UnknownBatch):
        await store.status("nope")
    await store.seal("b", T0)
    with pytest.raises(BatchSealed):
        await store.add("b", 1, T0)
    st = await store.status("b")
    assert (st.state, st.total, st.done) == (State.SEALED, 5, 0)
    await store.check(refs("b", 0, [4]))  # fine: no error, nothing changed


async def test_limits_from_the_config(store: BatchStore) -> None:
    store.configure(BatchConfig(max_items=10, max_groups=2))
    await store.open("b", T0)
    await store.add("b", 6, T0)
    with pytest.raises(BadCount):
        await store.add("b", 5, T0)
    await store.add("b", 4, T0)
    with pytest.raises(BadCount):
        await store.add("b", 0, T0)
    with pytest.raises(BadCount):  # the third group
        store.configure(BatchConfig(max_items=100, max_groups=2))
        await store.add("b", 1, T0)
    assert (await store.status("b")).total == 10


async def test_failed_items_and_a_batch_sealed_empty(store: BatchStore) -> None:
    await store.open("e", T0)
    assert (await store.seal("e", T0)).completed
    await store.open("f", T0)
    await store.add("f", 2, T0)
    await store.seal("f", T0)
    assert (await store.end(refs("f", 0, [0]), T0, failed=True))["f"].failed == 1
    last = (await store.end(refs("f", 0, [0, 1]), T0))["f"]
    assert (last.done, last.failed, last.completed) == (1, 1, True)


async def test_groups_span_chunks_out_of_order(store: BatchStore) -> None:
    sizes = [3, 7936 - 3 + 5, 1, 20_000]
    await store.open("big", T0)
    for n in sizes:
        await store.add("big", n, T0)
    await store.seal("big", T0)
    items = [ItemRef("big", g, i) for g, n in enumerate(sizes) for i in range(n)]
    random.Random(5).shuffle(items)
    completed = 0
    for k in range(0, len(items), 1000):
        st = (await store.end(items[k : k + 1000], T0))["big"]
        completed += st.completed
    assert completed == 1
    st = await store.status("big")
    assert (st.state, st.done) == (State.COMPLETE, sum(sizes))


async def test_sweep_expires_idle_batches_and_forgets_ended_ones(store: BatchStore) -> None:
    store.configure(BatchConfig(expiry=100.0, sealed_expiry=50.0, keep=30.0))
    await store.open("idle-open", T0)
    await store.add("idle-open", 4, T0)
    await store.open("idle-sealed", T0)
    await store.add("idle-sealed", 4, T0)
    await store.seal("idle-sealed", T0)
    await store.open("busy", T0)
    await store.add("busy", 4, T0)
    await store.open("done", T0)
    await store.seal("done", T0)  # complete at T0
    assert await store.sweep(T0 + 20) == []
    await store.end(refs("busy", 0, [0]), T0 + 60)  # activity
    # at T0+70: the sealed one is idle past 50 s, the complete one ended past keep
    expired = dict(await store.sweep(T0 + 70))
    assert list(expired) == ["idle-sealed"]
    assert expired["idle-sealed"].state is State.EXPIRED
    with pytest.raises(UnknownBatch):
        await store.status("done")
    # at T0+130: the open one idle past 100 s; busy (touched at T0+60) is not
    expired = dict(await store.sweep(T0 + 130))
    assert list(expired) == ["idle-open"]
    st = await store.status("idle-open")
    assert (st.state, st.total, st.done) == (State.EXPIRED, 4, 0)
    assert (await store.end(refs("idle-open", 0, [1]), T0 + 130))["idle-open"].done == 0
    with pytest.raises(BatchSealed):
        await store.add("idle-open", 1, T0 + 130)
    assert (await store.status("busy")).state is State.OPEN
    # expired batches are kept `keep`, then forgotten
    assert await store.sweep(T0 + 159) == []
    await store.status("idle-open")
    await store.end(refs("busy", 0, [1]), T0 + 159)  # activity again
    assert await store.sweep(T0 + 161) == []
    for gone in ("idle-open", "idle-sealed"):
        with pytest.raises(UnknownBatch):
            await store.status(gone)
    assert (await store.status("busy")).state is State.OPEN


# four processes at once


def _acker(
    kind: str, where: str, ids: list[str], start: Any, out: multiprocessing.Queue[object]
) -> None:
    async def main() -> list[tuple[int, bool]]:
        store = make_store(kind, where)
        await store.start()
        start.wait(30)  # all four connected: they ack at the same time
        answers = []
        try:
            for k in range(0, len(ids), 250):
                got = await store.end([parse_item(i) for i in ids[k : k + 250]], T0)
                answers.append((got["p"].done, got["p"].completed))
        finally:
            await store.close()
        return answers

    out.put(asyncio.run(main()))


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["sqlite", "redis"])
async def test_four_processes_acking_at_once_lose_no_bit(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    where = str(tmp_path / "batches.sqlite3")
    if kind == "redis":
        server: RedisServer = request.getfixturevalue("redis_server")
        server.flush()
        where = server.url
    store = make_store(kind, where)
    await store.start()
    n = 40_000
    await store.open("p", T0)
    await store.add("p", n, T0)
    await store.seal("p", T0)
    everything = [f"p:0:{i}" for i in range(n)]
    # disjoint quarters, each process also acking a random fifth of the others' items
    rnd = random.Random(11)
    shares = []
    for w in range(4):
        mine = everything[w::4]
        extra = rnd.sample(everything, n // 5)
        share = mine + extra
        rnd.shuffle(share)
        shares.append(share)
    ctx = multiprocessing.get_context("spawn")
    out: multiprocessing.Queue[object] = ctx.Queue()
    start = ctx.Barrier(4)
    procs = [ctx.Process(target=_acker, args=(kind, where, s, start, out)) for s in shares]
    for p in procs:
        p.start()
    results = [await asyncio.to_thread(out.get, True, 90) for _ in procs]
    for p in procs:
        await asyncio.to_thread(p.join, 30)
        assert p.exitcode == 0
    completions = sum(c for answers in results for _d, c in answers)  # type: ignore[attr-defined]
    assert completions == 1
    st = await store.status("p")
    assert (st.state, st.done, st.failed) == (State.COMPLETE, n, 0)
    await store.close()


async def test_an_id_opens_once_and_bad_refs_are_out_of_range(store: BatchStore) -> None:
    await store.open("once", T0)
    await store.add("once", 2, T0)
    with pytest.raises(BatchExists) as exc:
        await store.open("once", T0)
    assert exc.value.status == 409
    assert (await store.status("once")).total == 2
    for bad in (ItemRef("once", -1, 0), ItemRef("once", 0, -1), ItemRef("once", 0, 2)):
        with pytest.raises(ItemOutOfRange):
            await store.end([bad], T0)
    assert (await store.status("once")).done == 0
