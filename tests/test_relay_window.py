"""A WebSocket carried to its session's node through Redis, with a window of frames in flight
(rubris_asgi/server/relay/): served like a local session, a slow client cut by the local rules,
a lost stretch of the stream noticed and resumed from, a gone entry node costing nothing."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
from collections.abc import AsyncIterator
from typing import Any

import pytest
from websockets.asyncio.client import ClientConnection, connect

from rubris_asgi import Rubris, Session
from rubris_asgi.client import Client
from rubris_asgi.cluster import RedisBroker
from rubris_asgi.config import Config, Timing, WriterConfig
from rubris_asgi.protocol import (
    Goodbye,
    Hello,
    Ping,
    Pong,
    Publish,
    Rejected,
    Subscribe,
    Subscribed,
    Welcome,
    encode_frame,
    iter_messages,
)
from rubris_asgi.server.relay.records import FRAME, FRAMES_IN_FLIGHT, record

from .apps import starlette_app
from .lbkit import Balancer
from .rediskit import RedisServer, redis_server  # noqa: F401 (the fixture)
from .server import run_server
from .wirekit import until

pytestmark = pytest.mark.redis


@pytest.fixture
def url(redis_server: RedisServer) -> str:  # noqa: F811 (the fixture)
    redis_server.flush()
    return redis_server.url


def node(url: str, max_blocked: float = 10.0, heartbeat: float = 5.0) -> Rubris:
    config = Config(
        timing=Timing(session_timeout=20.0, heartbeat=heartbeat),
        writer=WriterConfig(max_blocked=max_blocked),
    )
    r = Rubris(config, broker=RedisBroker(url))

    @r.shared("feed.{name}", ring=4096)
    async def feed(session: Session, name: str) -> None:
        return None

    @r.private("inbox", queue=256, batch=4)
    async def inbox(session: Session) -> None:
        return None

    return r


@contextlib.asynccontextmanager
async def two(url: str, **kw: Any) -> AsyncIterator[list[tuple[Rubris, str]]]:
    rubrises = [node(url, **kw), node(url, **kw)]
    async with contextlib.AsyncExitStack() as stack:
        bases = [await stack.enter_async_context(run_server(starlette_app(r))) for r in rubrises]
        yield list(zip(rubrises, bases, strict=True))


async def carried(lb: Balancer, a: Rubris, b: Rubris, c: Client) -> Session:
    """Move ``c`` (connected to A through ``lb``) to B: its session stays on A, carried."""
    lb.route(1)
    lb.cut()
    await until(
        lambda: c.stats.reconnects >= 1 and c.state == "open", what=lambda: "resumed through B"
    )
    assert c.resumed and len(a.relays.homes) == 1 and len(b.relays.entries) == 1
    assert c.session_id is not None
    return a.engine.sessions[c.session_id]


async def test_a_carried_session_keeps_a_window_of_frames_in_flight_and_loses_nothing(
    url: str,
) -> None:
    """3,000 ring messages and 300 private ones published at once reach a carried client in
    order, each once; the home had several frames on their way at a time (not one frame per
    round trip), never more than its window."""
    async with two(url) as [(a, base_a), (b, base_b)], Balancer([base_a, base_b]) as lb:
        async with Client(lb.base + "/rubris", backoff=(0.05, 0.2), ack_every=8) as c:
            got: list[int] = []
            private: list[int] = []
            await c.subscribe("feed.x", lambda v, info: got.append(v))
            await c.subscribe("inbox", lambda v, info: private.append(v))
            s = await carried(lb, a, b, c)
            sink = a.relays.homes[s.id]
            most = 0

            async def watch() -> None:
                nonlocal most
                while True:
                    most = max(most, sink.window.outstanding)
                    await asyncio.sleep(0)

            watcher = asyncio.get_running_loop().create_task(watch())
            try:
                for i in range(3000):
                    a.publish("feed.x", i)
                    if i % 10 == 0:
                        await a.send(s, "inbox", i // 10)
                await until(
                    lambda: len(got) == 3000 and len(private) == 300, 20, what=lambda: "all of it"
                )
            finally:
                watcher.cancel()
            assert got == list(range(3000))
            assert private == list(range(300))
            assert 1 < most <= FRAMES_IN_FLIGHT


async def test_a_carried_client_that_reads_nothing_is_cut_as_a_slow_consumer(url: str) -> None:
    """A client resumed through B stops reading: B's socket fills, B confirms nothing, A's
    window fills and holds the next frame; past ``max_blocked`` A ends the session with
    GOODBYE 7 (slow consumer), as it would a local one, and lets go of the held frame."""
    async with two(url, max_blocked=1.0) as [(a, base_a), (_, base_b)]:
        ws_a = base_a.replace("http", "ws") + "/rubris/ws"
        ws_b = base_b.replace("http", "ws") + "/rubris/ws"
        opened = await connect(ws_a, subprotocols=["rubris.v1"])  # type: ignore[list-item]
        await opened.send(encode_frame([Hello(1, ""), Subscribe(1, "feed.big", 0, 0, b"")]))
        welcome = await first(opened, Welcome)
        await first(opened, Subscribed)
        await opened.close()
        await until(
            lambda: a.engine.sessions[welcome.session].sink is None, what=lambda: "detached"
        )
        stuck: ClientConnection = await connect(
            ws_b,
            subprotocols=["rubris.v1"],  # type: ignore[list-item]
            max_queue=1,
            max_size=None,
        )
        await stuck.send(encode_frame([Hello(1, welcome.resume)]))
        assert (await first(stuck, Welcome)).resumed
        stuck.transport.pause_reading()  # reads nothing more, as a client that hangs
        s = a.engine.sessions[welcome.session]
        big = base64.b64encode(os.urandom(45_000)).decode()  # 60 KB that deflate cannot halve
        try:
            for _ in range(400):  # 24 MB: far past what the sockets' buffers hold
                if s.id not in a.engine.sessions:
                    break
                a.publish("feed.big", big)
                await asyncio.sleep(0.005)
            await until(lambda: s.id not in a.engine.sessions, 10, what=lambda: "ended as slow")
            assert a.engine.telemetry.closed_blocked == 1
            assert not a.relays.homes and not a.relays.blocked
            assert a.engine.pool.stats.in_use_block == 0  # the held frame's lease came back
        finally:
            stuck.transport.abort()


async def test_a_lost_stretch_of_the_stream_closes_the_carried_connection_and_it_resumes(
    url: str,
) -> None:
    """A frame that arrives out of turn (the one before it lost between the nodes) is never
    written: the entry closes with 1013, the client resumes and gets every private message."""
    async with two(url) as [(a, base_a), (b, base_b)], Balancer([base_a, base_b]) as lb:
        async with Client(lb.base + "/rubris", backoff=(0.05, 0.2), ack_every=1) as c:
            private: list[int] = []
            await c.subscribe("inbox", lambda v, info: private.append(v))
            s = await carried(lb, a, b, c)
            await a.send(s, "inbox", 0)
            await until(lambda: private == [0], what=lambda: "the first")
            sink = a.relays.homes[s.id]
            # a stretch lost: frame n + 1 never arrives, n + 2 does
            a.relays.tell(sink.via, record(FRAME, sink.conn, sink.window.sent + 2, b"junk"))
            await until(
                lambda: c.stats.reconnects >= 2 and c.state == "open", what=lambda: "resumed again"
            )
            assert c.resumed
            for i in range(1, 20):
                await a.send(s, "inbox", i)
            await until(lambda: len(private) == 20, what=lambda: "the rest")
            assert private == list(range(20))


async def test_an_entry_node_that_stops_leaves_its_carried_sessions_waiting_for_a_resume(
    url: str,
) -> None:
    """Node B, carrying a session of A, stops: A's session waits (detached, nothing lost) and
    the client resumes it on A directly."""
    a = node(url)
    b = node(url)
    async with run_server(starlette_app(a)) as base_a:
        stack = contextlib.AsyncExitStack()
        base_b = await stack.enter_async_context(run_server(starlette_app(b)))
        async with Balancer([base_a, base_b]) as lb:
            async with Client(lb.base + "/rubris", backoff=(0.05, 0.2), ack_every=1) as c:
                private: list[int] = []
                await c.subscribe("inbox", lambda v, info: private.append(v))
                s = await carried(lb, a, b, c)
                lb.route(0)
                await stack.aclose()  # B stops: its connections close, its relays with them
                await until(lambda: not a.relays.homes, what=lambda: "A's sink let go")
                for i in range(10):
                    await a.send(s, "inbox", i)  # queued for the session, waiting for it
                await until(
                    lambda: c.state == "open" and s.sink is not None, 10, what=lambda: "back on A"
                )
                assert c.resumed and c.session_id == s.id
                await until(lambda: len(private) == 10, what=lambda: "all of it")
                assert private == list(range(10))


async def test_pings_are_answered_where_they_arrive_never_before_an_earlier_answer(
    url: str,
) -> None:
    """Through B, a PUBLISH that is refused and a PING right behind it: the PING goes to A
    behind the PUBLISH and its PONG comes after the REJECTED (protocol.md section 4). Once A
    has confirmed everything, a PING is answered by B alone: A hears nothing of it."""
    async with two(url) as [(a, base_a), (b, base_b)]:
        ws_a = base_a.replace("http", "ws") + "/rubris/ws"
        ws_b = base_b.replace("http", "ws") + "/rubris/ws"
        opened = await connect(ws_a, subprotocols=["rubris.v1"])  # type: ignore[list-item]
        await opened.send(encode_frame([Hello(1, "")]))
        welcome = await first(opened, Welcome)
        await opened.close()
        await until(
            lambda: a.engine.sessions[welcome.session].sink is None, what=lambda: "detached"
        )
        async with connect(ws_b, subprotocols=["rubris.v1"]) as ws:  # type: ignore[list-item]
            await ws.send(encode_frame([Hello(1, welcome.resume)]))
            assert (await first(ws, Welcome)).resumed
            sink = a.relays.homes[welcome.session]
            await ws.send(encode_frame([Publish(1, "feed.x", b"1")]))  # no client PUBLISH here
            await ws.send(encode_frame([Ping(7)]))
            answers = [await next_of(ws, (Rejected, Pong)), await next_of(ws, (Rejected, Pong))]
            assert [type(m) for m in answers] == [Rejected, Pong]
            [relay] = b.relays.entries.values()
            await until(
                lambda: sink.ins.next == 3 and not relay.ins.outstanding, what=lambda: "confirmed"
            )
            await until(lambda: not relay.queue and relay.writer is None, what=lambda: "written")
            for token in (8, 9):
                await ws.send(encode_frame([Ping(token)]))
                assert (await next_of(ws, (Pong,))).token == token
            assert sink.ins.next == 3  # A heard neither


async def test_an_entry_that_hears_nothing_from_the_home_ends_its_connections(url: str) -> None:
    """The home stops hearing the records (a node stalled, or dead on a host whose connection
    Redis keeps): the entry, whose PINGs it answers alone, would otherwise carry the client
    for ever. Nothing heard for two heartbeats (1 s here), its connection ends and the client
    reconnects; the home, hearing nothing either, lets go of the session's connection too."""
    async with two(url, heartbeat=1.0) as [(a, base_a), (b, base_b)]:
        async with Balancer([base_a, base_b]) as lb:
            async with Client(lb.base + "/rubris", backoff=(0.05, 0.2)) as c:
                s = await carried(lb, a, b, c)
                assert a.broker is not None
                deaf = a.broker.nodes._told.pop("ws")  # type: ignore[attr-defined]
                await until(lambda: s.sink is None, 6, what=lambda: "the home let go")
                await until(lambda: not b.relays.entries, 6, what=lambda: "the entry let go")
                a.broker.nodes._told["ws"] = deaf  # type: ignore[attr-defined]
                await until(
                    lambda: c.state == "open" and s.sink is not None, 10, what=lambda: "resumed"
                )
                assert c.resumed and c.session_id == s.id


async def next_of(ws: ClientConnection, kinds: tuple[type, ...]) -> Any:
    """The next message of one of ``kinds`` that ``ws`` receives."""
    while True:
        frame = await asyncio.wait_for(ws.recv(), 5)
        assert isinstance(frame, bytes)
        for m in iter_messages(frame):
            if isinstance(m, kinds):
                return m


async def first(ws: ClientConnection, kind: type) -> Any:
    """The first message of type ``kind`` that ``ws`` receives."""
    while True:
        frame = await asyncio.wait_for(ws.recv(), 5)
        assert isinstance(frame, bytes)
        for m in iter_messages(frame):
            if isinstance(m, Goodbye):
                raise AssertionError(f"GOODBYE {m.code}: {m.reason}")
            if isinstance(m, kind):
                return m
