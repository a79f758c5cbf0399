"""Batch tracking through the plugin: ``Rubris.batches``, ``{mount}/api/batches``, queue items
enqueued with ``batch_item``, and the state pushed on ``batch.{id}``."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from rubris_asgi import Config, Reject, Rubris, Session, Timing
from rubris_asgi.batches import MemoryBatchStore, SQLiteBatchStore
from rubris_asgi.batches.service import Batches
from rubris_asgi.config import BatchConfig
from rubris_asgi.errors import BatchSealed, ErrorCode, MalformedItem, UnknownBatch
from rubris_asgi.protocol import Ack, Item, Nack, Push, Rejected, Subscribe, Subscribed

from .enginekit import arrived, connect

TOKEN = "batch-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


class WallClock:
    def __init__(self) -> None:
        self.now = 1_900_000_000.0

    def __call__(self) -> float:
        return self.now


def make(batches: Any = None, **kwargs: Any) -> Rubris:
    rubris = Rubris(
        Config(timing=Timing(poll_timeout=1.0)),
        api_token=TOKEN,
        batches=batches if batches is not None else MemoryBatchStore(),
        **kwargs,
    )

    @rubris.queue("work", dead_letter="work.dead", delivery_limit=2, codel_target=None)
    async def work(session: Session) -> None:
        return None

    @rubris.queue("work.dead")
    async def dead(session: Session) -> None:
        return None

    return rubris


@pytest.fixture
async def app() -> AsyncIterator[tuple[Rubris, httpx.AsyncClient]]:
    async with make() as rubris:
        transport = httpx.ASGITransport(app=rubris)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
            yield rubris, http


def ack(topic: int, *tags: int) -> Ack:
    return Ack(topic, (len(tags), *tags))


async def subscribe(rubris: Rubris, s: Session, name: str, req: int = 1) -> None:
    await rubris.dispatcher.handle(s, [Subscribe(req, name, 0, 0, b"")])


# the HTTP API


async def test_http_api_open_add_seal_ack_status(app: tuple[Rubris, httpx.AsyncClient]) -> None:
    rubris, http = app
    r = await http.post("/api/batches", headers=AUTH)
    assert r.status_code == 201 and r.headers["Rubris-Fill"] == "0"
    batch = r.json()["batch"]
    assert r.json() == {"batch": batch, "state": "open"}
    r = await http.post(f"/api/batches/{batch}/items", json={"count": 3}, headers=AUTH)
    assert r.json() == {"group": 0, "count": 3}
    r = await http.post(f"/api/batches/{batch}/items", json={"count": 2}, headers=AUTH)
    assert r.json() == {"group": 1, "count": 2}
    ids = [f"{batch}:0:{i}" for i in range(3)] + [f"{batch}:1:{i}" for i in range(2)]
    r = await http.post("/api/batches/ack", json={"items": ids[:2] + ids[:1]}, headers=AUTH)
    assert r.json() == {
        "batches": {
            batch: {"state": "open", "total": 5, "done": 2, "failed": 0, "completed": False}
        }
    }
    r = await http.post("/api/batches/fail", json={"items": [ids[4]]}, headers=AUTH)
    assert r.json()["batches"][batch]["failed"] == 1
    r = await http.post(f"/api/batches/{batch}/seal", headers=AUTH)
    assert r.json() == {"state": "sealed", "total": 5, "done": 2, "failed": 1, "completed": False}
    r = await http.post("/api/batches/ack", json={"items": ids[2:4]}, headers=AUTH)
    assert r.json()["batches"][batch] == {
        "state": "complete",
        "total": 5,
        "done": 4,
        "failed": 1,
        "completed": True,
    }
    # completed exactly once: the same acks again, the status, a seal again
    r = await http.post("/api/batches/ack", json={"items": ids[2:4]}, headers=AUTH)
    assert r.json()["batches"][batch]["completed"] is False
    r = await http.get(f"/api/batches/{batch}", headers=AUTH)
    assert r.json() == {"state": "complete", "total": 5, "done": 4, "failed": 1, "completed": False}
    r = await http.post(f"/api/batches/{batch}/seal", headers=AUTH)
    assert r.status_code == 200 and r.json()["completed"] is False
    # an empty batch is complete at its seal
    empty = (await http.post("/api/batches", json={}, headers=AUTH)).json()["batch"]
    r = await http.post(f"/api/batches/{empty}/seal", headers=AUTH)
    assert r.json() == {"state": "complete", "total": 0, "done": 0, "failed": 0, "completed": True}


async def test_http_api_errors_change_nothing(app: tuple[Rubris, httpx.AsyncClient]) -> None:
    rubris, http = app
    batch = (await http.post("/api/batches", headers=AUTH)).json()["batch"]
    await http.post(f"/api/batches/{batch}/items", json={"count": 3}, headers=AUTH)
    ok = f"{batch}:0:0"
    cases: list[tuple[str, Any, int, str, int | None]] = [
        ("/api/batches/ack", {"items": [ok, "nope"]}, 400, "malformed item id", 1),
        ("/api/batches/ack", {"items": [ok, f"{batch}:0:3"]}, 400, "the group has 3", 1),
        ("/api/batches/ack", {"items": [ok, f"{batch}:1:0"]}, 400, "no such group", 1),
        ("/api/batches/ack", {"items": [ok, "ffffffffffffffff:0:0"]}, 404, "unknown batch", 1),
        ("/api/batches/ack", {"items": ok}, 400, "must be a list", None),
        ("/api/batches/ack", {"items": [ok], "x": 1}, 400, "unknown field", None),
        ("/api/batches/ack", [ok], 400, "JSON object", None),
        (f"/api/batches/{batch}/items", {"count": 0}, 400, "at least 1", None),
        (f"/api/batches/{batch}/items", {"count": "3"}, 400, "integer", None),
        (f"/api/batches/{batch}/items", {"count": True}, 400, "integer", None),
        ("/api/batches/ffffffffffffffff/items", {"count": 1}, 404, "unknown batch", None),
        ("/api/batches/ffffffffffffffff/seal", None, 404, "unknown batch", None),
        ("/api/batches", {"count": 1}, 400, "unknown field", None),
    ]
    for path, body, status, words, index in cases:
        r = await http.post(path, json=body, headers=AUTH)
        assert (r.status_code, r.json()["index"]) == (status, index), (path, body, r.text)
        assert words in r.json()["error"], (path, body, r.text)
        assert "Rubris-Fill" in r.headers
    r = await http.get("/api/batches/ffffffffffffffff", headers=AUTH)
    assert r.status_code == 404
    r = await http.get("/api/batches/not%20an%20id", headers=AUTH)
    assert r.status_code == 404
    r = await http.post(
        "/api/batches/ack", content=b"items", headers={**AUTH, "Content-Type": "text/plain"}
    )
    assert r.status_code == 415
    st = await rubris.batches.status(batch)
    assert (st.total, st.done, st.failed) == (3, 0, 0)
    await http.post(f"/api/batches/{batch}/seal", headers=AUTH)
    r = await http.post(f"/api/batches/{batch}/items", json={"count": 1}, headers=AUTH)
    assert r.status_code == 409 and "sealed" in r.json()["error"]
    # no token: 401 with the challenge
    r = await http.post("/api/batches")
    assert r.status_code == 401 and r.headers["WWW-Authenticate"] == "Bearer"
    r = await http.get(f"/api/batches/{batch}")
    assert r.status_code == 401


async def test_http_api_asks_the_hook_per_batch() -> None:
    asked: list[str] = []

    def authorize(request: Any, topic: str) -> bool:
        asked.append(topic)
        if request.headers.get("x-who") == "banned":
            raise Reject("banned")
        return topic != "batch.secret" and request.headers.get("x-who") != "nobody"

    rubris = Rubris(authorize_api=authorize, batches=MemoryBatchStore())
    async with rubris:
        await rubris.batches.open("secret")
        await rubris.batches.add("secret", 2)
        transport = httpx.ASGITransport(app=rubris)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
            r = await http.post("/api/batches")
            batch = r.json()["batch"]
            assert r.status_code == 201 and asked == [f"batch.{batch}"]
            r = await http.post("/api/batches", headers={"x-who": "nobody"})
            assert r.status_code == 403
            r = await http.post("/api/batches", headers={"x-who": "banned"})
            assert r.status_code == 403 and r.json()["error"] == "banned"
            r = await http.get("/api/batches/secret")
            assert r.status_code == 403
            r = await http.post("/api/batches/ack", json={"items": ["secret:0:1"]})
            assert r.status_code == 403 and r.json()["index"] == 0
        assert (await rubris.batches.status("secret")).done == 0


async def test_off_means_no_paths_and_no_batch_items() -> None:
    rubris = make(batches=False)
    async with rubris:
        transport = httpx.ASGITransport(app=rubris)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
            r = await http.post("/api/batches", headers=AUTH)
            assert r.status_code == 404
            r = await http.post(
                "/api/enqueue",
                json={"topic": "work", "data": 1, "batch_item": "b:0:0"},
                headers=AUTH,
            )
            assert r.status_code == 400 and "batch tracking is off" in r.json()["error"]
        with pytest.raises(RuntimeError):
            rubris.batches  # noqa: B018
        with pytest.raises(RuntimeError):
            rubris.enqueue("work", 1, batch_item="b:0:0")


# the Python API and queue items


async def test_python_api() -> None:
    async with make() as rubris:
        b = rubris.batches
        batch = await b.open()
        group = await b.add(batch, 4)
        assert group.ids() == [f"{batch}:0:{i}" for i in range(4)]
        assert (await b.ack(group.ids()[:3]))[batch].done == 3
        assert (await b.fail([group.id(3)]))[batch].failed == 1
        st = await b.seal(batch)
        assert st.completed and st.to_json()["state"] == "complete"
        with pytest.raises(BatchSealed):
            await b.add(batch, 1)
        with pytest.raises(MalformedItem):
            await b.ack(["x"])
        with pytest.raises(UnknownBatch):
            await b.status("ffff")
        with pytest.raises(MalformedItem):
            rubris.enqueue("work", 1, batch_item="b:0")
        with pytest.raises(UnknownBatch):
            await rubris.put("work", 1, batch_item="ffff:0:0")
        assert rubris.queue_stats("work").enqueued == 0


async def test_queue_items_end_their_batch_items_and_the_push_says_so(
    app: tuple[Rubris, httpx.AsyncClient],
) -> None:
    rubris, http = app
    batch = await rubris.batches.open()
    group = await rubris.batches.add(batch, 4)
    watcher, wsink = connect(rubris.engine)
    await subscribe(rubris, watcher, f"batch.{batch}")
    first = await arrived(wsink, Push)
    assert orjson.loads(first[0].payload)["state"] == "open"
    # two by the HTTP API, two in process
    r = await http.post(
        "/api/enqueue",
        json=[{"topic": "work", "data": i, "batch_item": group.id(i)} for i in range(2)],
        headers=AUTH,
    )
    assert r.status_code == 200, r.text
    rubris.enqueue("work", 2, batch_item=group.id(2))
    await rubris.put("work", 3, batch_item=group.id(3))
    await rubris.batches.seal(batch)
    worker, sink = connect(rubris.engine)
    await subscribe(rubris, worker, "work", 2)
    (sub,) = await arrived(sink, Subscribed)
    items = await arrived(sink, Item, 4)
    by_value = {orjson.loads(i.payload): i.tag for i in items}
    # 0, 1, 2 done; 3 NACKed past the delivery limit: dead-lettered, so failed
    await rubris.dispatcher.handle(worker, [ack(sub.topic, by_value[0], by_value[1])])
    await rubris.dispatcher.handle(worker, [ack(sub.topic, by_value[2], by_value[2])])
    await rubris.dispatcher.handle(worker, [Nack(sub.topic, by_value[3], True)])
    again = await arrived(sink, Item, 5)
    await rubris.dispatcher.handle(worker, [Nack(sub.topic, again[-1].tag, True)])
    pushes = await arrived(wsink, Push, 2)
    for _ in range(300):
        pushes = [m for f in wsink.messages() for m in f if isinstance(m, Push)]
        if orjson.loads(pushes[-1].payload)["completed"]:
            break
        await asyncio.sleep(0.01)
    final = orjson.loads(pushes[-1].payload)
    assert final == {"state": "complete", "total": 4, "done": 3, "failed": 1, "completed": True}
    assert rubris.queue_stats("work.dead").enqueued == 1
    # a late watcher sees the final state at once
    late, lsink = connect(rubris.engine)
    await subscribe(rubris, late, f"batch.{batch}")
    (push,) = await arrived(lsink, Push)
    assert orjson.loads(push.payload) == final
    # acks and seals that change nothing push nothing
    seen = len([m for f in wsink.messages() for m in f if isinstance(m, Push)])
    await rubris.batches.ack([group.id(0), group.id(3)])
    await rubris.batches.seal(batch)
    await asyncio.sleep(0.05)
    assert len([m for f in wsink.messages() for m in f if isinstance(m, Push)]) == seen
    # nor does a watcher that comes after the topic was dropped see anything but the completion
    rubris.engine.unsubscribe(watcher, (await arrived(wsink, Subscribed))[0].topic)
    rubris.engine.unsubscribe(late, (await arrived(lsink, Subscribed))[0].topic)
    rubris.batches.after_sweep()  # type: ignore[misc]
    assert f"batch.{batch}" not in rubris.engine.topics
    later, later_sink = connect(rubris.engine)
    await subscribe(rubris, later, f"batch.{batch}")
    (push,) = await arrived(later_sink, Push)
    assert orjson.loads(push.payload) == final
    # and the item in the dead-letter queue no longer carries the batch item
    dl = rubris.engine.queues["work.dead"].ready[0]
    assert dl.batch_item is None


async def test_watching_an_unknown_batch_is_rejected_and_leaves_no_topic(
    app: tuple[Rubris, httpx.AsyncClient],
) -> None:
    rubris, _http = app
    s, sink = connect(rubris.engine)
    await subscribe(rubris, s, "batch.ffffffffffffffff")
    (rej,) = await arrived(sink, Rejected)
    assert rej.code == ErrorCode.UNKNOWN and rej.reason == "unknown batch"
    assert "batch.ffffffffffffffff" not in rubris.engine.topics


async def test_authorize_batch_decides_who_watches() -> None:
    def allow(session: Session, batch: str) -> bool:
        return batch != "theirs"

    async with make(authorize_batch=allow) as rubris:
        await rubris.batches.open("theirs")
        s, sink = connect(rubris.engine)
        await subscribe(rubris, s, "batch.theirs")
        (rej,) = await arrived(sink, Rejected)
        assert rej.code == ErrorCode.NOT_AUTHORISED


async def test_sweeper_expires_and_pushes_and_drops_unwatched_topics(tmp_path: Path) -> None:
    clock = WallClock()
    config = BatchConfig(expiry=100.0, sealed_expiry=100.0, keep=10.0, sweep_every=0.05)
    batches = Batches(SQLiteBatchStore(tmp_path / "b.sqlite3"), config, clock=clock)
    async with make(batches=batches) as rubris:
        batch = await rubris.batches.open()
        await rubris.batches.add(batch, 2)
        s, sink = connect(rubris.engine)
        await subscribe(rubris, s, f"batch.{batch}")
        await arrived(sink, Push)
        clock.now += 101
        pushes = await arrived(sink, Push, 2)
        assert orjson.loads(pushes[-1].payload)["state"] == "expired"
        rubris.engine.unsubscribe(s, (await arrived(sink, Subscribed))[0].topic)
        for _ in range(300):
            if f"batch.{batch}" not in rubris.engine.topics:
                break
            await asyncio.sleep(0.01)
        assert f"batch.{batch}" not in rubris.engine.topics
        clock.now += 11
        for _ in range(300):
            try:
                await rubris.batches.status(batch)
            except UnknownBatch:
                break
            await asyncio.sleep(0.01)
        else:
            raise AssertionError("the expired batch was not forgotten")


async def test_acks_reach_the_store_before_stop(tmp_path: Path) -> None:
    path = tmp_path / "b.sqlite3"
    rubris = make(batches=SQLiteBatchStore(path))
    async with rubris:
        batch = await rubris.batches.open()
        group = await rubris.batches.add(batch, 50)
        await rubris.batches.seal(batch)
        for i in range(50):
            rubris.enqueue("work", i, batch_item=group.id(i))
        worker, sink = connect(rubris.engine)
        await subscribe(rubris, worker, "work")
        (sub,) = await arrived(sink, Subscribed)
        done = 0
        while done < 50:
            items = await arrived(sink, Item, done + 1)
            tags = tuple(i.tag for i in items[done:])
            await rubris.dispatcher.handle(worker, [ack(sub.topic, *tags)])
            done = len(items)
    store = SQLiteBatchStore(path)
    st = await store.status(batch)
    await store.close()
    assert (st.state.value, st.done) == ("complete", 50)


@pytest.mark.redis
async def test_queue_item_ends_wait_for_redis_to_come_back() -> None:
    from rubris_asgi.cluster.redis.batch_store import RedisBatchStore

    from .rediskit import RedisServer

    with RedisServer(persist=True) as server:
        async with make(batches=RedisBatchStore(server.url)) as rubris:
            batch = await rubris.batches.open()
            group = await rubris.batches.add(batch, 3)
            await rubris.batches.seal(batch)
            for i in range(3):
                rubris.enqueue("work", i, batch_item=group.id(i))
            worker, sink = connect(rubris.engine)
            await subscribe(rubris, worker, "work")
            (sub,) = await arrived(sink, Subscribed)
            items = await arrived(sink, Item, 3)
            server.kill()  # Redis is gone while the consumer ACKs
            await rubris.dispatcher.handle(worker, [ack(sub.topic, *(i.tag for i in items))])
            await asyncio.sleep(1.5)  # the hand-over failed and waits to retry
            assert rubris.batches.pending.handed == 0
            server.restart()
            for _ in range(100):
                if rubris.batches.pending.handed == 3:
                    break
                await asyncio.sleep(0.05)
            st = await rubris.batches.status(batch)
            assert (st.state.value, st.done, rubris.batches.pending.dropped) == ("complete", 3, 0)


# the producer's own batch id, and ?batch= on /api/enqueue (what a retried Spark task relies on)


async def test_open_with_the_producers_id(app: tuple[Rubris, httpx.AsyncClient]) -> None:
    rubris, http = app
    r = await http.post("/api/batches", json={"batch": "job-7_a"}, headers=AUTH)
    assert r.status_code == 201 and r.json() == {"batch": "job-7_a", "state": "open"}
    r = await http.post("/api/batches", json={"batch": "job-7_a"}, headers=AUTH)
    assert r.status_code == 409, r.text
    assert r.json() == {"error": "batch job-7_a exists already", "index": None}
    # "it exists" answers the producer that chose the id (each of its tasks opens it): not an
    # error for the ops page; adding to a sealed batch is one
    assert not rubris.engine.telemetry.api_refusals
    await http.post("/api/batches/job-7_a/seal", headers=AUTH)
    r = await http.post("/api/batches/job-7_a/items", json={"count": 1}, headers=AUTH)
    assert r.status_code == 409
    assert rubris.engine.telemetry.api_refusals == {409: 1}
    for bad in ("", "a:b", "x" * 65, 7):
        r = await http.post("/api/batches", json={"batch": bad}, headers=AUTH)
        assert r.status_code == 400, (bad, r.text)
    r = await http.post("/api/batches", json={"batch": "b", "count": 1}, headers=AUTH)
    assert r.status_code == 400 and "count" in r.json()["error"]


async def test_enqueue_into_a_batch_counts_only_what_it_enqueues(
    app: tuple[Rubris, httpx.AsyncClient],
) -> None:
    rubris, http = app
    batch = (await http.post("/api/batches", headers=AUTH)).json()["batch"]
    entries = [{"topic": "work", "data": i, "id": f"row-{i}"} for i in range(5)]
    r = await http.post(f"/api/enqueue?batch={batch}", json=entries[:3], headers=AUTH)
    assert r.status_code == 200, r.text
    body = r.json()
    assert (body["group"], body["count"], body["duplicates"]) == (0, 3, 0)
    # the retry of a task that died after its first request: three ids seen, two new
    r = await http.post(f"/api/enqueue?batch={batch}", json=entries, headers=AUTH)
    body = r.json()
    assert (body["group"], body["count"], body["duplicates"]) == (1, 2, 3)
    # everything a duplicate: no group at all
    r = await http.post(f"/api/enqueue?batch={batch}", json=entries, headers=AUTH)
    assert (r.json()["group"], r.json()["count"]) == (None, 0)
    st = await rubris.batches.status(batch)
    assert (st.total, st.done) == (5, 0)
    q = rubris.engine.queues["work"]
    assert [it.batch_item for it in q.ready] == [
        f"{batch}:0:0",
        f"{batch}:0:1",
        f"{batch}:0:2",
        f"{batch}:1:0",
        f"{batch}:1:1",
    ]
    # consumers ACK all five: the seal completes the batch with exactly five items
    worker, sink = connect(rubris.engine)
    await rubris.dispatcher.handle(worker, [Subscribe(1, "work", 0, 0, b'{"prefetch": 10}')])
    (sub,) = await arrived(sink, Subscribed)
    items = await arrived(sink, Item, 5)
    await rubris.dispatcher.handle(worker, [ack(sub.topic, *(i.tag for i in items))])
    for _ in range(300):
        if (await rubris.batches.status(batch)).done == 5:
            break
        await asyncio.sleep(0.01)
    r = await http.post(f"/api/batches/{batch}/seal", headers=AUTH)
    assert r.json() == {"state": "complete", "total": 5, "done": 5, "failed": 0, "completed": True}


async def test_enqueue_into_a_batch_refuses_clearly_and_changes_nothing(
    app: tuple[Rubris, httpx.AsyncClient],
) -> None:
    rubris, http = app
    entry = {"topic": "work", "data": 1}
    r = await http.post("/api/enqueue?batch=nosuch", json=entry, headers=AUTH)
    assert r.status_code == 404, r.text
    r = await http.post("/api/enqueue?batch=a:b", json=entry, headers=AUTH)
    assert r.status_code == 400 and "?batch=" in r.json()["error"]
    batch = await rubris.batches.open()
    group = await rubris.batches.add(batch, 1)
    r = await http.post(
        f"/api/enqueue?batch={batch}",
        json=[entry, {**entry, "batch_item": group.id(0)}],
        headers=AUTH,
    )
    assert r.status_code == 400 and r.json()["index"] == 1
    await rubris.batches.seal(batch)
    r = await http.post(f"/api/enqueue?batch={batch}", json=entry, headers=AUTH)
    assert r.status_code == 409, r.text
    assert "work" not in rubris.engine.queues or not rubris.engine.queues["work"].ready
    assert (await rubris.batches.status(batch)).total == 1
