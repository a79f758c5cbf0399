"""Work queues through the public API: Rubris.queue/enqueue/put, PUBLISH, /api/enqueue."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
import pytest
from starlette.applications import Starlette
from starlette.routing import Mount

from rubris_asgi import Codec, Config, Rubris, Session, Timing
from rubris_asgi.errors import ErrorCode, ProtocolError, QueueFull
from rubris_asgi.protocol import (
    Ack,
    Item,
    Publish,
    Rejected,
    Subscribe,
    Subscribed,
    encode_frame,
)

from .enginekit import arrived, connect

TOKEN = "queue-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def make(**kwargs: Any) -> Rubris:
    rubris = Rubris(Config(timing=Timing(poll_timeout=1.0)), api_token=TOKEN, **kwargs)

    @rubris.queue("jobs.{kind}", max_length=3, dead_letter="jobs-dead", client_publish=True)
    async def jobs(session: Session, kind: str) -> None:
        return None

    @rubris.queue("jobs-dead")
    async def dead(session: Session) -> None:
        return None

    @rubris.queue("blobs", codec=Codec.BYTES)
    async def blobs(session: Session) -> None:
        return None

    @rubris.shared("prices", snapshot=True)
    async def prices(session: Session) -> None:
        return None

    return rubris


@pytest.fixture
async def api() -> AsyncIterator[tuple[Rubris, httpx.AsyncClient]]:
    async with make() as rubris:
        transport = httpx.ASGITransport(app=rubris)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
            yield rubris, http


async def test_enqueue_raises_queue_full_and_unknown_names() -> None:
    async with make() as rubris:
        for i in range(3):
            assert rubris.enqueue("jobs.a", i) is True
        with pytest.raises(QueueFull):
            rubris.enqueue("jobs.a", 4)
        assert rubris.enqueue("jobs.b", "x", id="k") is True
        assert rubris.enqueue("jobs.b", "x", id="k") is False
        with pytest.raises(ProtocolError) as info:
            rubris.enqueue("prices", 1)
        assert info.value.code == ErrorCode.UNKNOWN
        st = rubris.queue_stats("jobs.a")
        assert (st.enqueued, st.waiting) == (3, 3)
        assert rubris.stats().queues.enqueued == 4


async def test_put_waits_for_room() -> None:
    async with make() as rubris:
        for i in range(3):
            rubris.enqueue("jobs.a", i)
        put = asyncio.create_task(rubris.put("jobs.a", "late"))
        await asyncio.sleep(0.05)
        assert not put.done()
        s, sink = connect(rubris.engine)
        q = rubris.engine.queue_named("jobs.a", rubris.registry)
        rubris.engine.subscribe_queue(s, q, 1, prefetch=1)  # takes one item: room for one
        assert await asyncio.wait_for(put, 2) is True
        assert rubris.queue_stats("jobs.a").enqueued == 4


async def test_subscribe_with_prefetch_params_and_bad_values(api: Any) -> None:
    rubris, _ = api
    s, sink = connect(rubris.engine)
    good = Subscribe(1, "jobs.a", 0, 0, orjson.dumps({"prefetch": 2}))
    bad = [
        Subscribe(2, "jobs.b", 0, 0, orjson.dumps({"prefetch": 0})),
        Subscribe(3, "jobs.c", 0, 0, orjson.dumps({"prefetch": 1001})),
        Subscribe(4, "jobs.d", 0, 0, orjson.dumps({"prefetch": "9"})),
    ]
    await rubris.dispatcher.handle(s, [good, *bad])
    (sub,) = await arrived(sink, Subscribed)
    assert sub.mode == 4 and sub.name == "jobs.a"
    rejected = await arrived(sink, Rejected, 3)
    assert [r.code for r in rejected] == [ErrorCode.PROTOCOL] * 3
    assert "prefetch" in rejected[0].reason
    for i in range(3):
        rubris.enqueue("jobs.a", i)
    await arrived(sink, Item, 2)
    await asyncio.sleep(0.05)
    assert len(await arrived(sink, Item)) == 2  # prefetch 2: the third waits


async def test_publish_enqueues_and_a_full_queue_rejects(api: Any) -> None:
    rubris, _ = api
    s, sink = connect(rubris.engine)
    await rubris.dispatcher.handle(s, [Publish(i, "jobs.a", b'{"n":1}') for i in range(1, 5)])
    (rej,) = await arrived(sink, Rejected)
    assert (rej.req, rej.code) == (4, ErrorCode.TOO_MANY) and "full" in rej.reason
    assert rubris.queue_stats("jobs.a").enqueued == 3
    await rubris.dispatcher.handle(s, [Publish(9, "jobs.a", b"not json")])
    rej = (await arrived(sink, Rejected, 2))[1]
    assert (rej.req, rej.code) == (9, ErrorCode.PROTOCOL)


async def test_dead_letter_must_name_a_queue_channel() -> None:
    rubris = Rubris()

    @rubris.queue("work", dead_letter="nowhere")
    async def work(session: Session) -> None:
        return None

    with pytest.raises(ValueError, match="nowhere"):
        await rubris.start()


async def test_api_enqueue_answers_and_deduplicates(api: Any) -> None:
    rubris, http = api
    body = [
        {"topic": "jobs.a", "data": {"n": 1}, "id": "one"},
        {"topic": "jobs.a", "data": {"n": 1}, "id": "one"},
        {"topic": "jobs.b", "data": [2]},
    ]
    r = await http.post("/api/enqueue", json=body, headers=AUTH)
    assert r.status_code == 200, r.text
    assert r.json() == {"accepted": 3, "duplicates": 1, "fill": 33}
    assert r.headers["Rubris-Fill"] == "33"
    r = await http.post(
        "/api/enqueue", json={"topic": "jobs.a", "data": 0, "id": "one"}, headers=AUTH
    )
    assert r.json()["duplicates"] == 1
    assert rubris.queue_stats("jobs.a").waiting == 1
    nd = b'{"topic": "blobs", "data_b64": "AAEC"}\n{"topic": "jobs.a", "data": "x"}\n'
    r = await http.post(
        "/api/enqueue", content=nd, headers={"Content-Type": "application/x-ndjson", **AUTH}
    )
    assert r.status_code == 200 and r.json()["accepted"] == 2


async def test_api_enqueue_refusals_change_nothing(api: Any) -> None:
    rubris, http = api
    cases = [
        ({"topic": "prices", "data": 1}, 404, "no queue channel"),
        ({"topic": "jobs.a", "data": 1, "id": ""}, 400, "id must be"),
        ({"topic": "jobs.a", "data": 1, "id": 5}, 400, "id must be"),
        ({"topic": "jobs.a", "data": 1, "batch_item": "b:0:1"}, 404, "unknown batch"),
        ({"topic": "jobs.a", "data": 1, "batch_item": "b:0"}, 400, "malformed item id"),
        ({"topic": "jobs.a", "data": 1, "extra": 1}, 400, "unknown field"),
        ({"topic": "blobs", "data": 1}, 400, "data_b64"),
    ]
    for entry, status, words in cases:
        r = await http.post(
            "/api/enqueue", json=[{"topic": "jobs.a", "data": 0}, entry], headers=AUTH
        )
        assert r.status_code == status, (entry, r.text)
        assert words in r.json()["error"] and r.json()["index"] == 1
    # four for a queue of three: 429, and none taken
    r = await http.post(
        "/api/enqueue", json=[{"topic": "jobs.a", "data": i} for i in range(4)], headers=AUTH
    )
    assert r.status_code == 429 and r.headers["Retry-After"] == "1"
    assert "jobs.a" in r.json()["error"]
    assert "jobs.a" not in rubris.engine.queues or rubris.queue_stats("jobs.a").waiting == 0
    r = await http.post("/api/enqueue", json={"topic": "jobs.a", "data": 1})
    assert r.status_code == 401
    # publish refuses queue topics, enqueue refuses shared ones
    r = await http.post("/api/publish", json={"topic": "jobs.a", "data": 1}, headers=AUTH)
    assert r.status_code == 404


async def test_api_enqueue_fill_follows_the_queue(api: Any) -> None:
    _, http = api
    r = await http.post(
        "/api/enqueue", json=[{"topic": "jobs.a", "data": i} for i in range(3)], headers=AUTH
    )
    assert r.json()["fill"] == 100 and r.headers["Rubris-Fill"] == "100"
    r = await http.post("/api/enqueue", json={"topic": "jobs.a", "data": 9}, headers=AUTH)
    assert r.status_code == 429 and r.json()["fill"] == 100


async def test_bad_tags_over_the_wire_close_with_code_1_and_corrupt_nothing() -> None:
    from .server import run_server
    from .wirekit import (
        expect_goodbye_and_close,
        lp_collect,
        lp_hello,
        recv_until,
        until,
        ws_hello,
        ws_open,
    )

    rubris = make()
    async with run_server(
        Starlette(routes=[Mount("/rubris", rubris)], lifespan=rubris.lifespan)
    ) as base:
        # WebSocket: a consumer ACKs a tag never issued to it: GOODBYE 1, close 1002
        ws = await ws_open(base)
        await ws_hello(ws, Subscribe(1, "jobs.a", 0, 0, orjson.dumps({"prefetch": 2})))
        sub = await recv_until(ws, lambda m: isinstance(m, Subscribed))
        assert isinstance(sub, Subscribed)
        rubris.enqueue("jobs.a", "one")
        item = await recv_until(ws, lambda m: isinstance(m, Item))
        assert isinstance(item, Item) and item.tag == 1
        # an ACK for a topic it does not hold is ignored; then a tag past the last issued
        await ws.send(encode_frame([Ack.items(sub.topic + 99, [5]), Ack.items(sub.topic, [2])]))
        await expect_goodbye_and_close(ws, ErrorCode.PROTOCOL, 1002)
        # the item went back to the queue, first attempt ended with the lost consumer
        await until(lambda: rubris.queue_stats("jobs.a").waiting == 1)
        # long-poll: a malformed ACK (count without its tags) is a 400, nothing changes
        async with httpx.AsyncClient(base_url=base + "/rubris") as c:
            w = await lp_hello(c, Subscribe(1, "jobs.a", 0, 0, b""))
            got = await lp_collect(c, w.session, lambda m: isinstance(m, Item))
            assert isinstance(got, Item) and got.attempt == 2 and got.payload == b'"one"'
            r = await c.post(f"/lp/{w.session}", content=encode_frame([Ack(got.topic, (3, 1))]))
            assert r.status_code == 400 and "ACK" in r.text
            assert rubris.queue_stats("jobs.a").outstanding == 1
