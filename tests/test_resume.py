"""Resume is exact (protocol §5): a resumed session's rings go on from what its client holds,
never from what the server wrote to the lost connection; late joiners ask for the last n.

The engine-level tests pin the rule; the wire tests run it through a real server, with a
subscribe handler that awaits (so the scheduler runs while the resuming frame is handled).
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import orjson
from websockets.asyncio.client import ClientConnection, connect

from rubris_asgi import Rubris, Session
from rubris_asgi.engine.engine import Engine
from rubris_asgi.protocol import (
    Gap,
    Hello,
    Message,
    Mode,
    Push,
    Rejected,
    Subscribe,
    Subscribed,
    decode_frame,
    encode_frame,
)

from .apps import starlette_app
from .enginekit import FakeClock, RecordingSink
from .enginekit import connect as engine_connect
from .server import run_server
from .wirekit import lp_hello, recv_msgs, until, ws_url


def drain(e: Engine, cycles: int = 10) -> None:
    for _ in range(cycles):
        e.scheduler.run_cycle()


def seqs(frames: list[list[Message]]) -> list[int]:
    return [m.seq for f in frames for m in f if isinstance(m, Push)]


def resumed(e: Engine, s: Session) -> RecordingSink:
    """``s`` taken by a new connection, as the gateway does on a resuming HELLO."""
    e.detach(s)
    e.park_rings(s)
    sink = RecordingSink(e, s)
    e.attach(s, sink)
    return sink


def test_a_restated_ring_replays_what_the_lost_connection_was_written() -> None:
    e = Engine(clock=FakeClock())
    s, sink = engine_connect(e)
    t = e.topic("r", Mode.RING, ring=16)
    e.subscribe(s, t, 1, 0, 0)
    for i in range(5):
        e.publish(t, i)
    drain(e)
    assert seqs(sink.take()) == [1, 2, 3, 4, 5]  # written; the client saw only 1..3
    sink2 = resumed(e, s)
    e.publish(t, 5)  # newer than anything the client holds: must wait for the replay
    drain(e)
    assert sink2.take() == []  # parked until the resuming frame is handled
    e.subscribe(s, t, 2, t.epoch, 3)
    e.unpark(s)
    drain(e)
    frames = sink2.take()
    answer = [m for f in frames for m in f if isinstance(m, Subscribed)]
    assert [(m.req, m.topic, m.recovered) for m in answer] == [(2, t.number, True)]
    assert seqs(frames) == [4, 5, 6]
    assert len(s.subs) == 1 and len(t.subs) == 1  # repositioned, not subscribed twice


def test_a_restated_ring_the_ring_no_longer_holds_gets_a_gap_first() -> None:
    e = Engine(clock=FakeClock())
    s, sink = engine_connect(e)
    t = e.topic("r", Mode.RING, ring=4)
    e.subscribe(s, t, 1, 0, 0)
    e.publish(t, 0)
    drain(e)
    sink2 = resumed(e, s)
    for i in range(1, 10):
        e.publish(t, i)  # seqs 2..10; the ring holds 7..10
    e.subscribe(s, t, 2, t.epoch, 1)
    e.unpark(s)
    drain(e)
    frames = sink2.take()
    answer = next(m for f in frames for m in f if isinstance(m, Subscribed))
    assert not answer.recovered
    gaps = [(m.start, m.count) for f in frames for m in f if isinstance(m, Gap)]
    assert gaps == [(2, 5)]
    assert seqs(frames) == [7, 8, 9, 10]


def test_a_ring_the_resuming_frame_does_not_restate_goes_on_where_it_was() -> None:
    """A client that does not restate (an older one) keeps the server's cursor."""
    e = Engine(clock=FakeClock())
    s, sink = engine_connect(e)
    t = e.topic("r", Mode.RING, ring=16)
    e.subscribe(s, t, 1, 0, 0)
    e.publish(t, 0)
    drain(e)
    sink2 = resumed(e, s)
    e.publish(t, 1)
    e.unpark(s)
    drain(e)
    assert seqs(sink2.take()) == [2]


def test_a_client_that_resumes_again_while_its_first_resume_is_handled_loses_nothing() -> None:
    """Two resuming frames in flight (the client gave up on a slow first one): the rings
    keep the cursors from before the first and wait for the last frame to be handled."""
    e = Engine(clock=FakeClock())
    s, sink = engine_connect(e)
    t = e.topic("r", Mode.RING, ring=16)
    u = e.topic("u", Mode.RING, ring=16)
    e.subscribe(s, t, 1, 0, 0)
    e.subscribe(s, u, 2, 0, 0)
    e.publish(t, 0)
    e.publish(u, 0)
    drain(e)
    sink.take()
    e.detach(s)
    e.park_rings(s)  # the first resuming frame, still being handled
    e.park_rings(s)  # the second
    sink2 = RecordingSink(e, s)
    e.attach(s, sink2)
    e.publish(t, 1)
    e.publish(u, 1)
    e.unpark(s)  # the first frame is done: the second may still restate
    drain(e)
    assert sink2.take() == []
    e.subscribe(s, u, 3, u.epoch, 0)  # the second frame restates u from its start
    e.unpark(s)
    drain(e)
    got = [(m.topic, m.seq) for f in sink2.take() for m in f if isinstance(m, Push)]
    assert sorted(got) == [(t.number, 2), (u.number, 1), (u.number, 2)]
    assert s.parked == [] and s.resuming == 0


def test_a_late_joiner_gets_the_last_n_the_ring_holds_oldest_first() -> None:
    e = Engine(clock=FakeClock())
    t = e.topic("r", Mode.RING, ring=8)
    for i in range(12):
        e.publish(t, i)
    s, sink = engine_connect(e)
    e.subscribe(s, t, 1, 0, 0, last=3)
    s2, sink2 = engine_connect(e)
    e.subscribe(s2, t, 1, 0, 0, last=100)  # more than held: all it holds
    s3, sink3 = engine_connect(e)
    e.subscribe(s3, t, 1, 0, 0)  # no last: only what comes next
    drain(e)
    e.publish(t, 12)
    drain(e)
    assert seqs(sink.take()) == [10, 11, 12, 13]
    assert seqs(sink2.take()) == [5, 6, 7, 8, 9, 10, 11, 12, 13]
    assert seqs(sink3.take()) == [13]


# ----- through a real server ------------------------------------------------------------------


def slow_ring_app() -> Rubris:
    """A ring whose subscribe handler awaits: cycles run while a resuming frame is handled."""
    rubris = Rubris()

    @rubris.shared("feed", ring=32)
    async def feed(session: Session) -> None:
        await asyncio.sleep(0.05)

    @rubris.shared("snap", snapshot=True)
    async def snap(session: Session) -> Any:
        return {"v": 0}

    return rubris


async def ws_pushes(ws: ClientConnection, n: int) -> list[Message]:
    got: list[Message] = []
    while len([m for m in got if isinstance(m, Push)]) < n:
        got += await recv_msgs(ws, 1)
    return got


async def test_a_websocket_resume_restating_its_ring_loses_and_doubles_nothing() -> None:
    rubris = slow_ring_app()
    async with run_server(starlette_app(rubris)) as base:
        ws = await connect(ws_url(base), subprotocols=["rubris.v1"], compression=None)
        await ws.send(encode_frame([Hello(1, ""), Subscribe(1, "feed", 0, 0, b"")]))
        welcome, sub = await recv_msgs(ws, 2)
        assert isinstance(sub, Subscribed)
        for i in range(6):
            rubris.publish("feed", i)
        got = await ws_pushes(ws, 6)
        # the client's state says it holds 1..3: 4..6 were written as the connection died
        held = 3
        await ws.close()
        session = rubris.engine.sessions[welcome.session]  # type: ignore[attr-defined]
        await until(lambda: session.sink is None)
        rubris.publish("feed", 6)
        async with connect(ws_url(base), subprotocols=["rubris.v1"], compression=None) as ws2:
            await ws2.send(
                encode_frame(
                    [Hello(1, welcome.resume), Subscribe(2, "feed", sub.epoch, held, b"")]  # type: ignore[attr-defined]
                )
            )
            rubris.publish("feed", 7)  # while the subscribe handler awaits
            got = await ws_pushes(ws2, 5)
            await asyncio.sleep(0.1)
            rubris.publish("feed", 8)
            got += await ws_pushes(ws2, 1)
        answer = [m for m in got if isinstance(m, Subscribed)]
        assert [(m.req, m.recovered) for m in answer] == [(2, True)]
        assert [m.seq for m in got if isinstance(m, Push)] == [4, 5, 6, 7, 8, 9]
        assert [orjson.loads(m.payload) for m in got if isinstance(m, Push)] == [3, 4, 5, 6, 7, 8]


async def test_a_long_poll_resume_restating_its_ring_loses_nothing() -> None:
    rubris = slow_ring_app()
    async with run_server(starlette_app(rubris)) as base:
        async with httpx.AsyncClient(base_url=base + "/rubris", timeout=10) as c:
            w = await lp_hello(c, Subscribe(1, "feed", 0, 0, b""))
            r = await c.get(f"/lp/{w.session}", params={"ack": 0})
            sub = next(m for m in decode_frame(r.content) if isinstance(m, Subscribed))
            for i in range(4):
                rubris.publish("feed", i)
            await asyncio.sleep(0.05)
            # a poll's answer is lost along with the connection: the client holds seq 1 only
            r = await c.get(f"/lp/{w.session}", params={"ack": 1})
            assert r.status_code == 200
            w2 = await lp_hello(c, Subscribe(2, "feed", sub.epoch, 1, b""), resume=w.resume)
            assert w2.resumed and w2.session == w.session
            got: list[Message] = []
            ack = 0
            while len([m for m in got if isinstance(m, Push)]) < 3:
                r = await c.get(f"/lp/{w.session}", params={"ack": ack})
                if r.status_code == 200:
                    ack = int(r.headers["Rubris-Frame"])
                    got += decode_frame(r.content)
        answer = [m for m in got if isinstance(m, Subscribed)]
        assert [(m.req, m.recovered) for m in answer] == [(2, True)]
        assert [m.seq for m in got if isinstance(m, Push)] == [2, 3, 4]


async def test_last_n_over_the_wire_and_its_bad_values() -> None:
    rubris = slow_ring_app()
    async with run_server(starlette_app(rubris)) as base:
        for i in range(10):
            rubris.publish("feed", i)
        async with connect(ws_url(base), subprotocols=["rubris.v1"], compression=None) as ws:
            last = orjson.dumps({"last": 4})
            await ws.send(
                encode_frame(
                    [
                        Hello(1, ""),
                        Subscribe(1, "feed", 0, 0, last),
                        Subscribe(2, "snap", 0, 0, last),  # ignored on a snapshot
                    ]
                )
            )
            got = await ws_pushes(ws, 5)
            by_topic: dict[int, list[int]] = {}
            for m in got:
                if isinstance(m, Push):
                    by_topic.setdefault(m.topic, []).append(m.seq)
            subs = {m.req: m for m in got if isinstance(m, Subscribed)}
            assert by_topic[subs[1].topic] == [7, 8, 9, 10]
            assert by_topic[subs[2].topic] == [1]
            for bad in (b'{"last": 0}', b'{"last": "3"}', b'{"last": true}'):
                await ws.send(encode_frame([Subscribe(3, "feed", 0, 0, bad)]))
                [refused] = await recv_msgs(ws, 1)
                assert isinstance(refused, Rejected) and (refused.req, refused.code) == (3, 1)
