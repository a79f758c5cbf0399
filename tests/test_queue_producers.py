"""Producers of work items over a client's PUBLISH: FLOW from the queue's fill, each item's outcome.

The server tells a session that PUBLISHed to a queue within the last second its fill with FLOW
(50, 75, 87, 100 % upward, and once more below 50 %: queues/producers.py); ``Client.enqueue``
returns when the server took an item and raises ``ItemRefused`` / ``OutcomeUnknown`` otherwise
(a PING after the PUBLISH, its PONG with no REJECTED before it: taken); ``Client.publish``'s
refusals reach ``on_refused`` with their value, and are not logged one line each.

Everything runs against a real uvicorn on 127.0.0.1 (tests/server.py), as a producer would.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from rubris_asgi import Rubris, Session
from rubris_asgi.client import (
    ENQUEUE_WINDOW,
    Client,
    ConnectionLost,
    ItemRefused,
    OutcomeUnknown,
    QueueItem,
    Rejection,
)
from rubris_asgi.client.core import CLOSE_FLUSH
from rubris_asgi.errors import ErrorCode
from rubris_asgi.protocol import Flow, Message, Ping, Publish, Rejected, decode_frame

from .apps import make_rubris, starlette_app
from .server import run_server
from .test_client_queues import drop_connection
from .wirekit import until

TRANSPORTS = ["websocket", "longpoll"]


def producer_rubris(max_length: int, **settings: Any) -> Rubris:
    """tests/apps.py's app with the queue channel ``jobs.{kind}``, open to client PUBLISH."""
    rubris = make_rubris()

    @rubris.queue("jobs.{kind}", max_length=max_length, client_publish=True, **settings)
    async def jobs(session: Session, kind: str) -> None:
        return None

    return rubris


def received(client: Client) -> list[Message]:
    """Every message the client received after WELCOME, in order (``record=True``)."""
    assert client.raw_frames is not None
    return [m for frame in client.raw_frames for m in decode_frame(frame)][1:]


def flows(client: Client) -> list[int]:
    return [m.fill for m in received(client) if isinstance(m, Flow)]


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_flow_at_each_level_crossing_and_below_half(transport: str) -> None:
    rubris = producer_rubris(100)
    async with run_server(starlette_app(rubris)) as base:
        url = base + "/rubris"
        async with (
            Client(url, transport=transport, record=True) as producer,  # type: ignore[arg-type]
            Client(url, transport=transport) as worker,  # type: ignore[arg-type]
        ):
            for i in range(100):
                await producer.enqueue("jobs.a", {"i": i})
            assert flows(producer) == [50, 75, 87, 100]  # once per level, upward
            assert producer.stats.flow == 100
            assert producer.publish_limiter.stats.cuts >= 1  # FLOW slows the producer down

            # a consumer takes everything (within the second the producer counts as recent):
            # the fill falls below 50 %, the producer is told once
            got: list[int] = []
            await worker.consume("jobs.a", lambda item: got.append(item.value["i"]), prefetch=100)
            await until(lambda: len(got) == 100)
            await until(lambda: len(flows(producer)) == 5)
            assert flows(producer)[4] < 50
            stats = rubris.queue_stats("jobs.a")
            assert stats.flows == 5 and stats.enqueued == 100

            # nothing more while it stays below 50 %
            for i in range(10):
                await producer.enqueue("jobs.a", {"i": i})
            await producer.ping()
            assert len(flows(producer)) == 5


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_enqueue_returns_when_taken_and_raises_item_refused(transport: str) -> None:
    rubris = producer_rubris(20)
    async with run_server(starlette_app(rubris)) as base:
        url = base + "/rubris"
        async with Client(url, transport=transport) as producer:  # type: ignore[arg-type]
            # the enqueues of one loop turn share one PING
            await asyncio.gather(*(producer.enqueue("jobs.b", {"i": i}) for i in range(20)))
            assert producer.stats.outcome_pings == 1
            assert producer.stats.enqueued == 20
            assert rubris.queue_stats("jobs.b").enqueued == 20

            with pytest.raises(ItemRefused) as refused:
                await producer.enqueue("jobs.b", {"i": 20})
            err = refused.value
            assert (err.code, err.topic, err.value) == (ErrorCode.TOO_MANY, "jobs.b", {"i": 20})
            assert "'jobs.b'" in err.reason and "fill 100 %" in err.reason

            with pytest.raises(ItemRefused) as unknown:  # not a channel open to PUBLISH
                await producer.enqueue("nope", [1])
            assert (unknown.value.code, unknown.value.value) == (ErrorCode.UNKNOWN, [1])

            # a mix in flight at once: each told its own outcome
            async with Client(url, transport=transport) as worker:  # type: ignore[arg-type]
                consumer = await worker.consume("jobs.b", prefetch=5)
                items = [await consumer.get(timeout=5) for _ in range(5)]  # 5 places free
                results = await asyncio.gather(
                    *(producer.enqueue("jobs.b", {"j": j}) for j in range(8)),
                    return_exceptions=True,
                )
                assert results[:5] == [None] * 5
                assert [r.value for r in results[5:]] == [{"j": 5}, {"j": 6}, {"j": 7}]  # type: ignore[union-attr]
                for item in items:
                    item.ack()
            assert producer.stats.rejected == 5  # 1 + 1 + 3


@pytest.mark.slow
@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_outcome_unknown_when_the_connection_is_cut_after_the_publish(
    transport: str,
) -> None:
    rubris = producer_rubris(100)
    async with run_server(starlette_app(rubris)) as base:
        async with Client(base + "/rubris", transport=transport) as producer:  # type: ignore[arg-type]
            await producer.enqueue("jobs.c", {"i": 0})  # the queue exists, the client is warm
            s = rubris.engine.sessions[producer.session_id]  # type: ignore[index]
            # the server takes the item and queues its PONG, but sends nothing for a while
            rubris.engine.scheduler.hold(s, rubris.engine.clock() + 1.5)
            task = asyncio.ensure_future(producer.enqueue("jobs.c", {"i": 1}))
            await until(lambda: rubris.queue_stats("jobs.c").enqueued == 2 and bool(s.direct))
            await drop_connection(rubris, producer)
            with pytest.raises(OutcomeUnknown) as lost:
                await asyncio.wait_for(task, 5)
            assert isinstance(lost.value, ConnectionLost)  # it is one
            assert (lost.value.topic, lost.value.value) == ("jobs.c", {"i": 1})
            assert producer.stats.unknown == 1
            # the client goes on: a later item is taken (told once the hold ends, after the
            # held PONG, which settles nothing more)
            await producer.wait_connected(5)
            await producer.enqueue("jobs.c", {"i": 2})
            assert rubris.queue_stats("jobs.c").enqueued == 3  # i=1 was taken after all
            assert producer.stats.enqueued == 2 and producer.stats.rejected == 0


@pytest.mark.slow
@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_enqueue_many_returns_the_refusals_by_index(transport: str) -> None:
    """One call, many items, one wait: the refusals come back in order, each naming its
    value and its place; the others were taken."""
    rubris = producer_rubris(20)
    async with run_server(starlette_app(rubris)) as base:
        async with Client(base + "/rubris", transport=transport) as producer:  # type: ignore[arg-type]
            assert await producer.enqueue_many("jobs.m", ({"i": i} for i in range(12))) == []
            refused = await producer.enqueue_many("jobs.m", [{"i": i} for i in range(12, 30)])
            assert [r.index for r in refused] == list(range(8, 18))
            assert [r.value for r in refused] == [{"i": i} for i in range(20, 30)]
            assert all(r.code == ErrorCode.TOO_MANY for r in refused)
            assert rubris.queue_stats("jobs.m").enqueued == 20
            assert producer.stats.enqueued == 20 and producer.stats.rejected == 10
            # more than a window: runs of ENQUEUE_WINDOW, indexes across them
            big = await producer.enqueue_many("jobs.m", range(ENQUEUE_WINDOW + 5))
            assert [r.index for r in big] == list(range(ENQUEUE_WINDOW + 5))
            with pytest.raises(TypeError):  # nothing of the run is sent
                await producer.enqueue_many("jobs.m", [1, object()])
            assert producer.stats.rejected == 10 + ENQUEUE_WINDOW + 5


async def test_enqueue_many_outcome_unknown_lists_the_values() -> None:
    rubris = producer_rubris(100)
    async with run_server(starlette_app(rubris)) as base:
        async with Client(base + "/rubris") as producer:
            await producer.enqueue("jobs.u", 0)
            s = rubris.engine.sessions[producer.session_id]  # type: ignore[index]
            rubris.engine.scheduler.hold(s, rubris.engine.clock() + 1.5)
            task = asyncio.ensure_future(producer.enqueue_many("jobs.u", [1, 2, 3]))
            await until(lambda: rubris.queue_stats("jobs.u").enqueued == 4 and bool(s.direct))
            await drop_connection(rubris, producer)
            with pytest.raises(OutcomeUnknown) as lost:
                await asyncio.wait_for(task, 5)
            assert (lost.value.topic, lost.value.value) == ("jobs.u", [1, 2, 3])


@pytest.mark.slow  # seconds of timeouts waited out: the full suite's, not the inner loop's
@pytest.mark.parametrize("end", ["close", "drop"])
async def test_a_publish_still_in_the_outbox_is_not_unknown(end: str) -> None:
    """Long-poll sends one POST at a time: while the server works on the first (its handling
    slowed down here), the next PUBLISH waits in the client's outbox. When the connection ends
    then, the first item's outcome is unknown (the server has it); the second never left: on
    close it is ``ConnectionLost`` (not queued), after a reconnect it is sent on the new
    connection and its outcome learnt there."""
    rubris = producer_rubris(100)
    handle = rubris.dispatcher.handle
    slow = asyncio.Event()
    # on close, longer than close() waits for what was handed over (CLOSE_FLUSH): the close
    # cannot wait the POST out, and the second PUBLISH is still in the outbox when it ends
    delay = CLOSE_FLUSH + 1.0 if end == "close" else 0.5

    async def slowed(s: Session, msgs: Any) -> None:
        msgs = list(msgs)
        if any(isinstance(m, Publish) and m.payload == b'"slow"' for m in msgs):
            slow.set()
            await asyncio.sleep(delay)
        await handle(s, msgs)

    rubris.dispatcher.handle = slowed  # type: ignore[method-assign]
    async with run_server(starlette_app(rubris)) as base:
        producer = Client(base + "/rubris", transport="longpoll", reconnect=end == "drop")
        async with producer:
            first = asyncio.ensure_future(producer.enqueue("jobs.o", "slow"))
            await asyncio.wait_for(slow.wait(), 5)  # its POST is in the server's hands
            second = asyncio.ensure_future(producer.enqueue("jobs.o", "next"))
            await until(lambda: len(producer._outbox) >= 1)  # behind the POST in flight
            if end == "close":
                await producer.close()
            else:
                await drop_connection(rubris, producer)
            with pytest.raises(OutcomeUnknown) as unknown:
                await asyncio.wait_for(first, 5)
            assert unknown.value.value == "slow"
            if end == "close":
                with pytest.raises(ConnectionLost) as lost:
                    await asyncio.wait_for(second, 5)
                assert not isinstance(lost.value, OutcomeUnknown)
                # "next" never reached the server ("slow" may not have, yet: the queue is
                # made by its first item)
                jobs = rubris.engine.queues.get("jobs.o")
                assert jobs is None or jobs.snapshot().enqueued <= 1
            else:
                await asyncio.wait_for(second, 5)  # taken, told on the new connection
                assert producer.stats.reconnects == 1
        if end == "drop":  # both queued: the first was unknown, not refused
            await until(lambda: rubris.queue_stats("jobs.o").enqueued == 2)


async def test_enqueue_on_a_closed_client_is_connection_lost_not_unknown() -> None:
    client = Client("http://127.0.0.1:9/rubris")
    with pytest.raises(ConnectionLost) as exc:
        await client.enqueue("jobs.x", 1)
    assert not isinstance(exc.value, OutcomeUnknown)


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_publish_refusals_reach_on_refused_with_their_value(transport: str) -> None:
    rubris = producer_rubris(100)
    refused: list[Rejection] = []
    async with run_server(starlette_app(rubris)) as base:
        client = Client(base + "/rubris", transport=transport, on_refused=refused.append)  # type: ignore[arg-type]
        async with client:
            for i in range(150):
                await client.publish("jobs.d", {"i": i})
            await until(lambda: len(refused) == 50)
            assert [r.value for r in refused] == [{"i": i} for i in range(100, 150)]
            assert {r.name for r in refused} == {"jobs.d"}
            assert {r.code for r in refused} == {ErrorCode.TOO_MANY}
            assert client.stats.rejected == 50
            assert list(client.rejections) == refused  # fewer than the 100 it keeps


async def test_no_log_line_per_refusal(caplog: pytest.LogCaptureFixture) -> None:
    rubris = producer_rubris(10)
    caplog.set_level(logging.INFO)
    async with run_server(starlette_app(rubris)) as base:
        async with Client(base + "/rubris") as client:
            for i in range(510):
                await client.publish("jobs.e", {"i": i})
            await until(lambda: client.stats.rejected == 500)
            for i in range(20):  # and enqueue()'s refusals are raised, never logged
                with pytest.raises(ItemRefused):
                    await client.enqueue("jobs.e", {"i": i})
    # the client sums up: one line at the first refusal, the rest in one line at most every
    # 5 s (and at close); the server counts refusals and logs none
    lines = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(lines) <= 2, [r.getMessage() for r in lines]
    assert "refused" in lines[0].getMessage()
    if len(lines) == 2:
        assert lines[1].getMessage().startswith("499 PUBLISHes refused in the last 5 s")
    assert rubris.engine.telemetry.errors.get(("rejected", ErrorCode.TOO_MANY), 0) >= 520


@pytest.mark.slow
async def test_a_producer_slows_down_before_anything_is_refused() -> None:
    """The issue's case: 1,500 items as fast as a bounded window allows into a queue of 1,000
    with no consumer: FLOW 50 % before the first refusal, the rate cut, exactly the 500 items
    over the limit refused (each named), every other enqueue returned."""
    rubris = producer_rubris(1000)
    async with run_server(starlette_app(rubris)) as base:
        url = base + "/rubris"
        async with Client(url, record=True) as producer:
            taken, refused, rate_at_refusal = await _produce(producer, "jobs.f", 1500, window=64)
            assert len(taken) == 1000 and len(refused) == 500
            assert taken.isdisjoint(refused) and taken | refused == set(range(1500))
            messages = received(producer)
            first_flow = next(i for i, m in enumerate(messages) if isinstance(m, Flow))
            first_refusal = next(i for i, m in enumerate(messages) if isinstance(m, Rejected))
            assert first_flow < first_refusal
            assert messages[first_flow] == Flow(50)
            assert flows(producer)[:4] == [50, 75, 87, 100]
            assert rate_at_refusal < 1_000_000  # the limiter's initial rate: it was cut
            assert producer.publish_limiter.stats.cuts >= 1

            # the items the producer was told were taken are exactly those in the queue
            async with Client(url) as worker:
                got: list[int] = []
                await worker.consume("jobs.f", lambda item: got.append(item.value["i"]))
                await until(lambda: len(got) >= 1000)
                await asyncio.sleep(0.05)
                assert sorted(got) == sorted(taken)


@pytest.mark.slow
async def test_a_consumer_slower_than_the_producer_means_fewer_refusals() -> None:
    rubris = producer_rubris(1000)
    async with run_server(starlette_app(rubris)) as base:
        url = base + "/rubris"
        async with Client(url) as producer, Client(url) as worker:
            done: list[int] = []

            async def work(item: QueueItem) -> None:
                await asyncio.sleep(0.0005)  # slower than the producer's first rate
                done.append(item.value["i"])

            await worker.consume("jobs.g", work, prefetch=8)
            taken, refused, _ = await _produce(producer, "jobs.g", 1500, window=64)
            assert len(refused) < 500
            assert len(taken) + len(refused) == 1500
            await until(lambda: len(done) == len(taken), timeout=20)
            assert sorted(done) == sorted(taken)


async def _produce(
    client: Client, name: str, n: int, window: int
) -> tuple[set[int], set[int], float]:
    """Enqueue items 0..n-1 as fast as ``window`` tasks allow: (taken, refused, the limiter's
    rate when the first refusal came)."""
    slots = asyncio.Semaphore(window)
    taken: set[int] = set()
    refused: set[int] = set()
    rate: list[float] = []

    async def one(i: int) -> None:
        try:
            await client.enqueue(name, {"i": i})
            taken.add(i)
        except ItemRefused as exc:
            assert exc.value == {"i": i} and exc.topic == name
            if not rate:
                rate.append(client.publish_limiter.rate)
            refused.add(i)
        finally:
            slots.release()

    tasks = []
    for i in range(n):
        await slots.acquire()
        tasks.append(asyncio.ensure_future(one(i)))
    await asyncio.gather(*tasks)
    return taken, refused, rate[0] if rate else float("inf")


async def test_pings_are_shared_per_turn_on_the_wire() -> None:
    """What a producer with many enqueues in flight sends: its PUBLISHes, then one PING."""
    rubris = producer_rubris(1000)
    seen: list[type[Message]] = []
    handle = rubris.dispatcher.handle

    async def spy(s: Session, msgs: Any) -> None:  # what the server handles, in order
        msgs = list(msgs)
        seen.extend(type(m) for m in msgs)
        await handle(s, msgs)

    rubris.dispatcher.handle = spy  # type: ignore[method-assign]
    async with run_server(starlette_app(rubris)) as base:
        async with Client(base + "/rubris", heartbeat=False) as producer:
            await asyncio.gather(*(producer.enqueue("jobs.h", i) for i in range(100)))
    assert seen.count(Publish) == 100 and seen.count(Ping) == 1
    assert seen[-1] is Ping
