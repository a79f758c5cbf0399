"""Queue topics in rubris_asgi.client: ``Client.consume``, ``Consumer``, ``QueueItem``.

The unit tests drive the client with the hand-written WebSocket fake of test_client_unit (the
test writes ITEM and REVOKE frames and reads the client's ACKs and NACKs); the end-to-end tests
at the bottom run it against a real uvicorn serving ``@rubris.queue`` channels.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import orjson
import pytest

from rubris_asgi import Rubris, Session
from rubris_asgi.client import (
    Client,
    Consumer,
    QueueItem,
    SubscribeRejected,
    SubscriptionEnded,
)
from rubris_asgi.errors import ErrorCode, RubrisError
from rubris_asgi.protocol import (
    Ack,
    Item,
    Message,
    Mode,
    Nack,
    Publish,
    Rejected,
    Revoke,
    Subscribe,
    Subscribed,
    Unsubscribe,
    Unsubscribed,
)
from rubris_asgi.protocol.deflate import DeflateCompressor

from .apps import make_rubris, starlette_app
from .server import run_server
from .test_client_unit import WAIT, FakeConn, FakeServer, connected, eventually, js
from .wirekit import until


class Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def consuming(
    client: Client, conn: FakeConn, name: str = "jobs", topic: int = 9, **kw: Any
) -> tuple[Consumer, Subscribe]:
    """``client.consume(name, **kw)`` answered by the fake with SUBSCRIBED mode 4."""
    task = asyncio.ensure_future(client.consume(name, **kw))
    sub = await conn.subscribed(name, topic, mode=Mode.QUEUE, codec=0, epoch=1)
    return await asyncio.wait_for(task, WAIT), sub


def items(topic: int, tags: range, attempt: int = 1) -> list[Item]:
    return [Item(topic, t, attempt, js({"job": t})) for t in tags]


async def sent(client: Client, conn: FakeConn) -> list[Message]:
    """Everything the client sent from now until a marker PUBLISH queued behind it (a turn
    later: the ACKs of this turn leave at the start of the next)."""
    await asyncio.sleep(0)
    await client.publish("marker", None)
    out: list[Message] = []
    while True:
        m = await asyncio.wait_for(conn.inbox.get(), WAIT)
        if isinstance(m, Publish) and m.name == "marker":
            return out
        out.append(m)


async def next_msg(conn: FakeConn) -> Message:
    return await asyncio.wait_for(conn.inbox.get(), WAIT)


async def turns(n: int = 3) -> None:
    """Let the event loop go round ``n`` times (ACKs of a turn leave at the start of the next)."""
    for _ in range(n):
        await asyncio.sleep(0)


# --------------------------------------------------------------------------- iterator form


async def test_consume_sends_prefetch_and_yields_decoded_items(server: FakeServer) -> None:
    clock = Clock()
    client, conn = await connected(server, clock=clock)
    consumer, sub = await consuming(client, conn, prefetch=8)
    assert orjson.loads(sub.params) == {"prefetch": 8}
    assert (consumer.topic, consumer.mode, consumer.prefetch) == (9, Mode.QUEUE, 8)
    packed = DeflateCompressor().compress(js({"big": "x" * 2000}))
    await conn.send(Item(9, 1, 1, js({"job": 1})), Item(9, 2, 3, packed, compressed=True))
    first = await consumer.get(timeout=WAIT)
    assert (first.topic, first.tag, first.attempt, first.value) == ("jobs", 1, 1, {"job": 1})
    assert first.received == 100.0 and not first.compressed and not first.settled
    second = await anext(consumer)
    assert (second.tag, second.attempt, second.value) == (2, 3, {"big": "x" * 2000})
    assert second.compressed
    assert client.stats.items == 2 and consumer.stats.received == 2
    assert consumer.stats.taken == 2
    with pytest.raises(asyncio.TimeoutError):
        await consumer.get(timeout=0.02)

    # without prefetch the server sizes it: empty params
    other, sub2 = await consuming(client, conn, "other", topic=10)
    assert sub2.params == b"" and other.prefetch is None
    await client.close()


async def test_acks_of_one_loop_turn_share_one_message(server: FakeServer) -> None:
    client, conn = await connected(server, ack_interval=30)
    consumer, _ = await consuming(client, conn)
    await conn.send(*items(9, range(1, 9)))
    await eventually(lambda: consumer.qsize() == 8)
    # one turn: five items taken (no await suspends while the buffer has some) and acked
    taken = [await consumer.get() for _ in range(5)]
    assert all(item.ack() for item in taken)
    assert await sent(client, conn) == [Ack.items(9, [1, 2, 3, 4, 5])]

    six, seven, eight = [await consumer.get() for _ in range(3)]
    six.ack()
    seven.ack()
    await turns()  # the next turn's ACK is a message of its own
    eight.ack()
    assert await sent(client, conn) == [Ack.items(9, [6, 7]), Ack.items(9, [8])]
    assert consumer.stats.acked == 8
    await client.close()


async def test_ack_is_not_held_past_the_turn(server: FakeServer) -> None:
    client, conn = await connected(server, ack_interval=30)  # the private ACK timer is slow
    consumer, _ = await consuming(client, conn)
    await conn.send(*items(9, range(1, 2)))
    (await consumer.get(timeout=WAIT)).ack()
    # no marker behind it: the ACK leaves on its own, at once
    assert await conn.expect(Ack, timeout=0.5) == Ack.items(9, [1])
    await client.close()


async def test_nack_and_settling_twice(server: FakeServer) -> None:
    client, conn = await connected(server)
    consumer, _ = await consuming(client, conn)
    await conn.send(*items(9, range(1, 5)))
    await eventually(lambda: consumer.qsize() == 4)
    a, b, c, d = [await consumer.get() for _ in range(4)]
    assert a.nack() is True  # requeue by default
    assert b.nack(requeue=False) is True
    assert c.ack() is True
    # a second settlement is a no-op: nothing more is sent, whatever it asks
    assert a.ack() is False and b.nack() is False and c.nack(requeue=False) is False
    assert a.settled and b.settled and c.settled and not d.settled
    assert await sent(client, conn) == [
        Ack.items(9, [3]),
        Nack(9, 1, True),
        Nack(9, 2, False),
    ]
    assert (consumer.stats.acked, consumer.stats.nacked) == (1, 2)
    assert "tag=1" in repr(a) and "state='nacked'" in repr(a)
    await client.close()


async def test_close_sends_acks_first_and_ends_iteration(server: FakeServer) -> None:
    client, conn = await connected(server)
    consumer, _ = await consuming(client, conn)
    await conn.send(*items(9, range(1, 4)))
    await eventually(lambda: consumer.qsize() == 3)
    one = await consumer.get()
    two = await consumer.get()
    one.ack()  # the same turn as close(): still before the UNSUBSCRIBE
    closing = asyncio.ensure_future(consumer.close())
    assert await next_msg(conn) == Ack.items(9, [1])
    assert await next_msg(conn) == Unsubscribe(9)
    assert not closing.done()
    # an ITEM already on its way is dropped (the UNSUBSCRIBE gives it back), not handed over
    await conn.send(*items(9, range(4, 5)), Unsubscribed(9, 0, ""))
    await asyncio.wait_for(closing, WAIT)
    assert consumer.ended and consumer.end_code == 0
    assert two.ack() is False  # after the UNSUBSCRIBE: not sent
    assert [i async for i in consumer] == []
    await consumer.close()  # twice is fine
    assert await sent(client, conn) == []
    await client.close()


async def test_unsubscribe_of_a_consumer_is_close(server: FakeServer) -> None:
    client, conn = await connected(server)
    async with (await consuming(client, conn))[0] as consumer:
        task = asyncio.ensure_future(client.unsubscribe(consumer))
        assert (await conn.expect(Unsubscribe)).topic == 9
        await conn.send(Unsubscribed(9, 0, ""))
        await asyncio.wait_for(task, WAIT)
    assert consumer.ended
    await client.close()


async def test_consume_rejected_and_wrong_kinds(server: FakeServer) -> None:
    client, conn = await connected(server)
    task = asyncio.ensure_future(client.consume("jobs.nope"))
    s = await conn.expect(Subscribe)
    await conn.send(Rejected(s.req, ErrorCode.UNKNOWN, "unknown topic"))
    with pytest.raises(SubscribeRejected) as info:
        await task
    assert info.value.code == 3

    # consume() of a topic that is not a queue: refused by the client, and given up
    task = asyncio.ensure_future(client.consume("ring"))
    await conn.subscribed("ring", topic=4, mode=Mode.RING)
    with pytest.raises(SubscribeRejected) as info:
        await task
    assert info.value.code == 0 and "not a queue topic" in info.value.reason
    assert (await conn.expect(Unsubscribe)).topic == 4

    # subscribe() of a queue topic: the same, pointing at consume()
    task2 = asyncio.ensure_future(client.subscribe("jobs"))
    await conn.subscribed("jobs", topic=5, mode=Mode.QUEUE)
    with pytest.raises(SubscribeRejected) as info:
        await task2
    assert info.value.code == 0 and "use Client.consume()" in info.value.reason
    assert (await conn.expect(Unsubscribe)).topic == 5
    await conn.send(*items(5, range(1, 3)))  # items of the given-up topic are ignored

    # the names are free again
    consumer, _ = await consuming(client, conn, "jobs", topic=6)
    with pytest.raises(RubrisError):
        await client.consume("jobs")  # already held
    with pytest.raises(ValueError):
        await client.consume("x", prefetch=0)
    with pytest.raises(ValueError):
        await client.consume("x", codel_target=0.0)
    assert consumer.qsize() == 0
    await client.close()


# --------------------------------------------------------------------------- CoDel


async def test_codel_gives_back_items_that_waited_too_long(server: FakeServer) -> None:
    clock = Clock()
    client, conn = await connected(server, clock=clock)
    consumer, _ = await consuming(client, conn, codel_target=0.020, codel_interval=0.100)
    await conn.send(*items(9, range(1, 9)))
    await eventually(lambda: consumer.qsize() == 8)  # all received at t = 100.0

    # the application takes one every 50 ms: that is its time per item, not a queue
    assert (await consumer.get()).tag == 1
    clock.now = 100.05
    assert (await consumer.get()).tag == 2  # waited 50 ms: one item's time, no excess
    assert consumer.service == pytest.approx(0.05)
    clock.now = 100.10
    assert (await consumer.get()).tag == 3  # 50 ms beyond: above target, the interval starts
    clock.now = 100.15
    assert (await consumer.get()).tag == 4  # above, but not for a whole interval yet
    clock.now = 100.20
    # above for an interval: the newest (8) is given back, the one taken is handed over (the
    # server's REVOKE takes the newest too, so the two never fight over the item in hand)
    assert (await consumer.get()).tag == 5
    assert consumer.qsize() == 2
    clock.now = 100.25
    assert (await consumer.get()).tag == 6  # the next drop is an interval after the first
    clock.now = 100.35
    assert (await consumer.get()).tag == 7  # the last in the buffer: never a standing queue
    assert await sent(client, conn) == [Nack(9, 8, True)]
    assert client.stats.codel_returned == 1 and consumer.stats.codel_returned == 1
    assert consumer.stats.taken == 7
    await client.close()


async def test_codel_target_none_turns_it_off(server: FakeServer) -> None:
    clock = Clock()
    client, conn = await connected(server, clock=clock)
    consumer, _ = await consuming(client, conn, codel_target=None)
    assert consumer.codel is None
    await conn.send(*items(9, range(1, 6)))
    await eventually(lambda: consumer.qsize() == 5)
    tags = []
    for _ in range(5):
        clock.now += 10.0
        tags.append((await consumer.get()).tag)
    assert tags == [1, 2, 3, 4, 5]
    assert await sent(client, conn) == []
    assert client.stats.codel_returned == 0
    await client.close()


# --------------------------------------------------------------------------- REVOKE, limits


async def test_revoke_drops_untaken_items_only(server: FakeServer) -> None:
    client, conn = await connected(server)
    consumer, _ = await consuming(client, conn)
    await conn.send(*items(9, range(1, 6)))
    await eventually(lambda: consumer.qsize() == 5)
    taken = await consumer.get()
    # 1 is taken already (left alone), 2 and 4 are dropped, 7 was never ours; other topic
    # numbers are ignored, ITEM and REVOKE alike
    await conn.send(Revoke.of(9, [1, 2, 4, 7]), Revoke.of(77, [3]), *items(77, range(1, 3)))
    await eventually(lambda: client.stats.revoked == 2)
    assert consumer.stats.revoked == 2 and consumer.qsize() == 2
    assert [(await consumer.get()).tag for _ in range(2)] == [3, 5]
    assert taken.ack() is True  # a revoked item already taken is still ACKed
    assert await sent(client, conn) == [Ack.items(9, [1])]
    assert client.stats.items == 5  # ITEMs of unknown topics are not counted
    await client.close()


async def test_a_full_buffer_gives_items_back_at_once(
    server: FakeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # QUEUE_SIZE is 10 000; a small one makes the same point quickly
    monkeypatch.setattr("rubris_asgi.client.consumer.QUEUE_SIZE", 3)
    client, conn = await connected(server)
    consumer, _ = await consuming(client, conn, codel_target=None)
    await conn.send(*items(9, range(1, 6)))
    await eventually(lambda: consumer.stats.received == 5)
    assert consumer.qsize() == 3
    assert await sent(client, conn) == [Nack(9, 4, True), Nack(9, 5, True)]
    assert client.stats.overflowed == 2 and consumer.stats.overflowed == 2
    assert [(await consumer.get()).tag for _ in range(3)] == [1, 2, 3]
    await client.close()


async def test_default_buffer_cap_is_queue_size(server: FakeServer) -> None:
    from rubris_asgi.client import QUEUE_SIZE

    client, conn = await connected(server)
    consumer, _ = await consuming(client, conn, codel_target=None)
    await conn.send(*items(9, range(1, QUEUE_SIZE + 3)))
    await eventually(lambda: consumer.stats.received == QUEUE_SIZE + 2)
    assert consumer.qsize() == QUEUE_SIZE
    assert await sent(client, conn) == [
        Nack(9, QUEUE_SIZE + 1, True),
        Nack(9, QUEUE_SIZE + 2, True),
    ]
    await client.close()


async def test_an_undecodable_item_is_refused_not_fatal(
    server: FakeServer, caplog: pytest.LogCaptureFixture
) -> None:
    client, conn = await connected(server, max_inflated=1000)
    consumer, _ = await consuming(client, conn)
    bomb = DeflateCompressor().compress(b"0" * 100_000)
    with caplog.at_level(logging.WARNING, logger="rubris_asgi.client"):
        await conn.send(
            Item(9, 1, 1, b"{not json"),
            Item(9, 2, 1, bomb, compressed=True),
            *items(9, range(3, 4)),
        )
        good = await consumer.get(timeout=WAIT)
    assert good.tag == 3 and client.state == "open"
    assert consumer.stats.undecodable == 2
    assert "item with tag 1 refused" in caplog.text
    # bad JSON: no consumer will do better (dead-letter); too large here: another may inflate it
    assert await sent(client, conn) == [Nack(9, 1, False), Nack(9, 2, True)]
    await client.close()


# --------------------------------------------------------------------------- reconnects


async def test_items_of_a_lost_connection_are_never_acked(server: FakeServer) -> None:
    client, conn = await connected(server)
    consumer, _ = await consuming(client, conn, prefetch=3)
    await conn.send(*items(9, range(1, 5)))
    await eventually(lambda: consumer.qsize() == 4)
    held = [await consumer.get() for _ in range(2)]
    await conn.ws.close()  # the connection drops; the session is resumed

    conn2 = await server.next_conn()
    assert conn2.resumed
    await client.wait_connected(timeout=WAIT)
    # the server took back everything outstanding: the buffer is gone ...
    assert consumer.qsize() == 0 and consumer.stats.cleared == 2
    # ... and the items held are not acknowledged on the new connection
    assert held[0].ack() is False and held[1].nack() is False
    assert consumer.stats.stale == 2
    await conn2.send(Item(9, 5, 2, js({"job": 1})))
    again = await consumer.get(timeout=WAIT)
    assert (again.tag, again.attempt) == (5, 2)
    again.ack()
    assert await sent(client, conn2) == [Ack.items(9, [5])]
    await client.close()


async def test_acks_made_before_the_loss_but_not_sent_are_dropped(server: FakeServer) -> None:
    client, conn = await connected(server)
    consumer, _ = await consuming(client, conn)
    await conn.send(*items(9, range(1, 3)))
    await eventually(lambda: consumer.qsize() == 2)
    one, two = await consumer.get(), await consumer.get()
    one.ack()
    two.nack()
    client._connection_lost()  # as _serve does when the connection ends (before the flush)
    await turns()
    assert await sent(client, conn) == []
    await client.close()


async def test_a_new_session_consumes_again_with_the_same_prefetch(server: FakeServer) -> None:
    client, conn = await connected(server)
    consumer, _ = await consuming(client, conn, prefetch=3)
    await conn.send(*items(9, range(1, 3)))
    await eventually(lambda: consumer.qsize() == 2)
    item = await consumer.get()

    server.resume_ok = False
    await conn.ws.close()
    conn2 = await server.next_conn()
    assert not conn2.resumed
    s = await conn2.expect(Subscribe)
    assert s.name == "jobs" and orjson.loads(s.params) == {"prefetch": 3}
    assert not consumer.active and consumer.qsize() == 0
    await conn2.send(Subscribed(s.req, 21, Mode.QUEUE, 0, 1, 0, False, "jobs"))
    await eventually(lambda: consumer.active)
    assert consumer.topic == 21
    assert item.ack() is False  # its tag means nothing to the new session
    await conn2.send(Item(21, 1, 2, js({"job": 1})))
    fresh = await consumer.get(timeout=WAIT)
    fresh.ack()
    assert await sent(client, conn2) == [Ack.items(21, [1])]
    await client.close()


async def test_codel_starts_afresh_after_a_reconnect(server: FakeServer) -> None:
    clock = Clock()
    client, conn = await connected(server, clock=clock)
    consumer, _ = await consuming(client, conn)
    await conn.send(*items(9, range(1, 4)))
    await eventually(lambda: consumer.qsize() == 3)
    clock.now += 1.0
    await consumer.get()  # above target: the interval starts
    assert consumer.codel is not None and consumer.codel.first_above > 0
    await conn.ws.close()
    await server.next_conn()
    await client.wait_connected(timeout=WAIT)
    assert consumer.codel.first_above == 0 and not consumer.codel.dropping
    await client.close()


# --------------------------------------------------------------------------- handler form


async def test_handler_acks_on_return_and_nacks_on_raise(
    server: FakeServer, caplog: pytest.LogCaptureFixture
) -> None:
    client, conn = await connected(server)
    seen: list[int] = []

    async def handle(item: QueueItem) -> None:
        await asyncio.sleep(0.001)
        seen.append(item.tag)
        if item.value["job"] == 2:
            raise RuntimeError("boom")
        if item.value["job"] == 3:
            item.nack(requeue=False)  # settled by the handler: not settled again
        if item.value["job"] == 4:
            item.ack()

    consumer, _ = await consuming(client, conn, handler=handle)
    with pytest.raises(RubrisError):
        await consumer.get()  # the handler takes the items
    with caplog.at_level(logging.ERROR, logger="rubris_asgi.client"):
        await conn.send(*items(9, range(1, 6)))
        await eventually(lambda: len(seen) == 5)
        msgs = await sent(client, conn)
    assert seen == [1, 2, 3, 4, 5]  # one at a time, in order
    assert msgs == [
        Ack.items(9, [1]),
        Nack(9, 2, True),
        Nack(9, 3, False),
        Ack.items(9, [4]),
        Ack.items(9, [5]),
    ]
    assert "handler of queue 'jobs' failed on tag 2" in caplog.text
    await client.close()


async def test_sync_handler_acks_each_item_in_its_own_message(server: FakeServer) -> None:
    client, conn = await connected(server)
    seen: list[int] = []
    consumer, _ = await consuming(client, conn, handler=lambda item: seen.append(item.tag))
    await conn.send(*items(9, range(1, 4)))
    await eventually(lambda: len(seen) == 3)
    assert await sent(client, conn) == [Ack.items(9, [t]) for t in (1, 2, 3)]
    assert consumer.stats.acked == 3
    await client.close()


async def test_a_busy_handler_does_not_stop_the_reader(server: FakeServer) -> None:
    client, conn = await connected(server)
    release = asyncio.Event()
    started: list[int] = []

    async def handle(item: QueueItem) -> None:
        started.append(item.tag)
        await release.wait()

    consumer, _ = await consuming(client, conn, handler=handle)
    await conn.send(*items(9, range(1, 5)))
    await eventually(lambda: started == [1])
    # the handler is stuck on 1: the reader still reads, and REVOKE takes 2 and 3 back
    await conn.send(Revoke.of(9, [1, 2, 3]))
    await eventually(lambda: consumer.stats.revoked == 2)
    release.set()
    await eventually(lambda: started == [1, 4])
    assert await sent(client, conn) == [Ack.items(9, [1]), Ack.items(9, [4])]
    await client.close()


async def test_close_lets_the_running_handler_finish_first(server: FakeServer) -> None:
    client, conn = await connected(server)
    release = asyncio.Event()
    started: list[int] = []

    async def handle(item: QueueItem) -> None:
        started.append(item.tag)
        await release.wait()

    consumer, _ = await consuming(client, conn, handler=handle)
    await conn.send(*items(9, range(1, 4)))
    await eventually(lambda: started == [1])
    closing = asyncio.ensure_future(consumer.close())
    await turns()
    assert not closing.done() and consumer.qsize() == 0  # the rest go back with UNSUBSCRIBE
    release.set()
    assert await next_msg(conn) == Ack.items(9, [1])
    assert await next_msg(conn) == Unsubscribe(9)
    await conn.send(Unsubscribed(9, 0, ""))
    await asyncio.wait_for(closing, WAIT)
    assert started == [1]
    assert consumer._runner is not None and consumer._runner.done()
    await client.close()


async def test_close_from_inside_the_handler(server: FakeServer) -> None:
    client, conn = await connected(server)
    holder: list[Consumer] = []
    seen: list[int] = []

    async def handle(item: QueueItem) -> None:
        seen.append(item.tag)
        item.ack()  # acked before close(): its ACK goes before the UNSUBSCRIBE
        await holder[0].close()

    holder.append((await consuming(client, conn, handler=handle))[0])
    await conn.send(*items(9, range(1, 4)))
    assert await next_msg(conn) == Ack.items(9, [1])
    assert await next_msg(conn) == Unsubscribe(9)
    await conn.send(Unsubscribed(9, 0, ""))
    await eventually(lambda: holder[0].ended)
    await eventually(lambda: holder[0]._runner is not None and holder[0]._runner.done())
    assert seen == [1]
    await client.close()


async def test_the_server_ending_a_consumer_ends_its_iteration(server: FakeServer) -> None:
    client, conn = await connected(server)
    consumer, _ = await consuming(client, conn)
    await conn.send(*items(9, range(1, 3)))
    item = await consumer.get(timeout=WAIT)
    await eventually(lambda: consumer.qsize() == 1)
    await conn.send(Unsubscribed(9, ErrorCode.UNKNOWN, "queue removed"))
    await eventually(lambda: consumer.ended)
    assert [i async for i in consumer] == []  # item 2 is the server's again
    assert (consumer.end_code, consumer.end_reason) == (3, "queue removed")
    assert item.ack() is False
    with pytest.raises(SubscriptionEnded):
        await consumer.get()
    await client.close()


async def test_client_close_cancels_handlers_and_leaves_no_task(server: FakeServer) -> None:
    before = asyncio.all_tasks()
    client, conn = await connected(server)
    cancelled = asyncio.Event()

    async def handle(item: QueueItem) -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    consumer, _ = await consuming(client, conn, handler=handle)
    plain, _ = await consuming(client, conn, "plain", topic=10)
    await conn.send(*items(9, range(1, 3)))
    await eventually(lambda: consumer.stats.taken == 1)
    waiting = asyncio.ensure_future(plain.get())
    await client.close()
    assert cancelled.is_set()
    with pytest.raises(SubscriptionEnded):
        await waiting
    assert consumer.ended and plain.ended
    left = [t for t in asyncio.all_tasks() - before if not t.done()]
    assert left == []


# --------------------------------------------------------------------------- end to end

TRANSPORTS = ["websocket", "longpoll"]


def queue_rubris(**settings: Any) -> Rubris:
    """tests/apps.py's app (poll timeout 1 s) with the queue channel ``jobs.{kind}``."""
    rubris = make_rubris()

    @rubris.queue("jobs.{kind}", **settings)
    async def jobs(session: Session, kind: str) -> None:
        return None

    return rubris


async def drop_connection(rubris: Rubris, client: Client) -> None:
    """Pull the plug on ``client``'s connection, server side (as test_e2e does)."""
    session = rubris.engine.sessions[client.session_id]  # type: ignore[index]
    if client.transport == "websocket":
        for conn in list(rubris.websocket.connections):
            if conn.session is session:  # only this client's
                await conn.abort(8, "test drop")
    else:
        rubris.engine.detach(session)
        rubris.longpoll.sessions.pop(session.id).end()


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_e2e_two_consumers_share_the_items_without_duplicates(transport: str) -> None:
    # server-side CoDel off: a REVOKE of an item already started would be a (legal) duplicate
    rubris = queue_rubris(codel_target=None)
    async with run_server(starlette_app(rubris)) as base:
        url = base + "/rubris"
        async with (
            Client(url, transport=transport) as c1,  # type: ignore[arg-type]
            Client(url, transport=transport) as c2,  # type: ignore[arg-type]
        ):
            got: dict[str, list[int]] = {"c1": [], "c2": []}
            k1 = await c1.consume("jobs.share", lambda item: got["c1"].append(item.value["i"]))
            k2 = await c2.consume("jobs.share", prefetch=4)

            async def iterate() -> None:
                async for item in k2:
                    got["c2"].append(item.value["i"])
                    item.ack()

            task = asyncio.create_task(iterate())
            for i in range(200):
                rubris.enqueue("jobs.share", {"i": i})
            await until(lambda: len(got["c1"]) + len(got["c2"]) >= 200, timeout=15)
            await until(lambda: rubris.queue_stats("jobs.share").acked == 200)
            assert sorted(got["c1"] + got["c2"]) == list(range(200))  # each exactly once
            assert got["c1"] and got["c2"]  # both took a share
            stats = rubris.queue_stats("jobs.share")
            assert (stats.delivered, stats.outstanding, stats.waiting) == (200, 0, 0)
            await k1.close()
            await k2.close()
            await asyncio.wait_for(task, 5)  # the iteration ends with the close
            assert rubris.queue_stats("jobs.share").consumers == 0


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_e2e_nack_with_requeue_comes_back(transport: str) -> None:
    rubris = queue_rubris()
    async with run_server(starlette_app(rubris)) as base:
        async with Client(base + "/rubris", transport=transport) as c:  # type: ignore[arg-type]
            consumer = await c.consume("jobs.retry", prefetch=1)
            rubris.enqueue("jobs.retry", {"n": 1})
            first = await consumer.get(timeout=5)
            assert (first.value, first.attempt) == ({"n": 1}, 1)
            assert first.nack(requeue=True)
            again = await consumer.get(timeout=5)
            assert (again.value, again.attempt) == ({"n": 1}, 2) and again.tag > first.tag
            assert again.ack()
            rubris.enqueue("jobs.retry", {"n": 2})
            dropped = await consumer.get(timeout=5)
            assert dropped.nack(requeue=False)  # no dead-letter topic: dropped, counted
            await until(lambda: rubris.queue_stats("jobs.retry").dropped == 1)
            stats = rubris.queue_stats("jobs.retry")
            assert (stats.acked, stats.nacked, stats.waiting, stats.outstanding) == (1, 2, 0, 0)
            with pytest.raises(asyncio.TimeoutError):
                await consumer.get(timeout=0.3)
            await consumer.close()


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_e2e_a_lost_consumers_items_go_to_the_other_with_attempt_2(transport: str) -> None:
    rubris = queue_rubris(codel_target=None)
    async with run_server(starlette_app(rubris)) as base:
        url = base + "/rubris"
        async with (
            Client(url, transport=transport, reconnect=False) as c1,  # type: ignore[arg-type]
            Client(url, transport=transport) as c2,  # type: ignore[arg-type]
        ):
            k1 = await c1.consume("jobs.lost", prefetch=3)
            for i in range(3):
                rubris.enqueue("jobs.lost", {"i": i})
            held = [await k1.get(timeout=5) for _ in range(3)]  # started, never acked
            assert [h.attempt for h in held] == [1, 1, 1]
            k2 = await c2.consume("jobs.lost", prefetch=10)
            with pytest.raises(asyncio.TimeoutError):
                await k2.get(timeout=0.2)  # c1 holds all three

            await drop_connection(rubris, c1)
            again = [await k2.get(timeout=5) for _ in range(3)]
            assert sorted(item.value["i"] for item in again) == [0, 1, 2]
            assert [item.attempt for item in again] == [2, 2, 2]
            for item in again:
                item.ack()
            await until(lambda: c1.state == "closed")
            assert not any(h.ack() for h in held)  # the lost connection's items: not sent
            assert k1.stats.stale == 3
            await until(lambda: rubris.queue_stats("jobs.lost").acked == 3)


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_e2e_handler_acks_on_return_and_retries_on_raise(transport: str) -> None:
    rubris = queue_rubris()
    async with run_server(starlette_app(rubris)) as base:
        async with Client(base + "/rubris", transport=transport) as c:  # type: ignore[arg-type]
            done: list[int] = []
            attempts: dict[int, list[int]] = {}

            async def handle(item: QueueItem) -> None:
                i = item.value["i"]
                attempts.setdefault(i, []).append(item.attempt)
                await asyncio.sleep(0.001)
                if i == 3 and item.attempt == 1:
                    raise RuntimeError("transient")
                done.append(i)

            consumer = await c.consume("jobs.cb", handle)
            for i in range(10):
                rubris.enqueue("jobs.cb", {"i": i})
            await until(lambda: len(done) == 10, timeout=10)
            assert sorted(done) == list(range(10))
            assert attempts[3] == [1, 2]
            await until(lambda: rubris.queue_stats("jobs.cb").acked == 10)
            stats = rubris.queue_stats("jobs.cb")
            assert (stats.nacked, stats.outstanding, stats.waiting) == (1, 0, 0)
            assert consumer.stats.acked == 10 and consumer.stats.nacked == 1
            await consumer.close()
