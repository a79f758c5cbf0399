"""End to end: the Python client against a real server, over both transports.

The transport tests run on uvicorn, hypercorn and granian: rubris relies on no one server's
internals (granian's send is a future completed on its own threads, not a coroutine).
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest
from fastapi import FastAPI

from rubris_asgi import Mode, Timing
from rubris_asgi.client import CallError, Client, SubscribeRejected
from rubris_asgi.protocol import COMPRESSED, Kind, iter_messages

from .apps import make_rubris, starlette_app
from .server import SERVERS, run_server

TRANSPORTS = ["websocket", "longpoll"]


async def until(cond: Any, timeout: float = 5.0) -> None:
    for _ in range(int(timeout / 0.01)):
        if cond():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached in time")


@pytest.mark.parametrize("server", SERVERS)
@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_snapshot_on_subscribe_then_live_updates(transport: str, server: str) -> None:
    rubris = make_rubris()
    async with run_server(starlette_app(rubris), server=server) as base:
        async with Client(base + "/rubris", transport=transport) as c:  # type: ignore[arg-type]
            sub = await c.subscribe("snap.AAPL")
            assert sub.mode == Mode.SNAPSHOT
            value, info = await sub.get(timeout=5)
            assert value == {"initial": "AAPL"} and info.seq == 1
            rubris.publish("snap.AAPL", {"bid": 2})
            value, info = await sub.get(timeout=5)
            assert value == {"bid": 2} and info.seq == 2
            with pytest.raises(SubscribeRejected) as rej:
                await c.subscribe("snap.forbidden")
            assert rej.value.code == 10 and rej.value.reason == "not for you"
            with pytest.raises(SubscribeRejected) as rej:
                await c.subscribe("no.such.topic")
            assert rej.value.code == 3


@pytest.mark.parametrize("server", SERVERS)
@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_callbacks_see_every_ring_message_in_order(transport: str, server: str) -> None:
    rubris = make_rubris()
    async with run_server(starlette_app(rubris), server=server) as base:
        async with Client(base + "/rubris", transport=transport) as c:  # type: ignore[arg-type]
            got: list[int] = []
            await c.subscribe("ring.t", lambda value, info: got.append(value))
            for i in range(5):
                rubris.publish("ring.t", i)
                await asyncio.sleep(0.01)
            await until(lambda: len(got) == 5)
            assert got == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("server", SERVERS)
@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_gap_after_lapping(transport: str, server: str) -> None:
    rubris = make_rubris()  # ring.* keeps 8
    async with run_server(starlette_app(rubris), server=server) as base:
        async with Client(base + "/rubris", transport=transport) as c:  # type: ignore[arg-type]
            sub = await c.subscribe("ring.fast")
            session = rubris.engine.sessions[c.session_id]  # type: ignore[index]
            # hold the session out of the cycles while 20 messages go by
            rubris.engine.scheduler.hold(session, rubris.engine.clock() + 0.5)
            for i in range(1, 21):
                rubris.publish("ring.fast", i)
            await until(lambda: sub.gaps, timeout=5)
            assert (sub.gaps[0].start, sub.gaps[0].count) == (1, 12)
            seqs = []
            while len(seqs) < 8:
                _, info = await sub.get(timeout=5)
                seqs.append(info.seq)
            assert seqs == list(range(13, 21))


@pytest.mark.parametrize("server", SERVERS)
@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_rpc_results_errors_and_streams(transport: str, server: str) -> None:
    rubris = make_rubris()
    async with run_server(starlette_app(rubris), server=server) as base:
        async with Client(base + "/rubris", transport=transport) as c:  # type: ignore[arg-type]
            assert await c.call("echo", {"a": [1, 2]}) == {"a": [1, 2]}
            with pytest.raises(CallError) as err:
                await c.call("fail")
            assert (err.value.code, err.value.message) == (10, "no such thing")
            with pytest.raises(CallError) as err:
                await c.call("missing")
            assert err.value.code == 3
            # a send on a private topic this session never subscribed to: the caller is told
            # what to fix (issue 27), not "internal error"
            with pytest.raises(CallError) as err:
                await c.call("fill_inbox", 1)
            assert err.value.code == 3
            assert "subscribe to 'inbox'" in err.value.message
            assert [x async for x in c.stream("count", 5)] == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("server", SERVERS)
@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_compressed_on_the_wire(transport: str, server: str) -> None:
    rubris = make_rubris()  # compress_at=256
    async with run_server(starlette_app(rubris), server=server) as base:
        client = Client(base + "/rubris", transport=transport, record=True)  # type: ignore[arg-type]
        async with client as c:
            sub = await c.subscribe("snap.book")
            await sub.get(timeout=5)
            doc = {"levels": [[100.0 + i / 100, 500] for i in range(100)]}
            rubris.publish("snap.book", doc)
            value, info = await sub.get(timeout=5)
            assert value == doc and info.compressed
            raw = b"".join(c.raw_frames or [])
            pushes = [
                m
                for f in c.raw_frames or []
                for m in iter_messages(f)
                if m.__class__.__name__ == "Push"
            ]
            compressed = [m for m in pushes if m.compressed]  # type: ignore[attr-defined]
            assert compressed, "no COMPRESSED PUSH on the wire"
            # the kind byte itself carries the flag
            assert bytes([Kind.PUSH | COMPRESSED]) in raw
            # kept only because it halves the payload (the 50 % rule)
            assert len(compressed[0].payload) * 2 <= len(orjson.dumps(doc))  # type: ignore[attr-defined]
            assert c.stats.bytes_saved > 0


@pytest.mark.parametrize("server", SERVERS)
@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_private_lossless_across_a_forced_disconnect(transport: str, server: str) -> None:
    rubris = make_rubris()
    async with run_server(starlette_app(rubris), server=server) as base:
        received: list[int] = []
        async with Client(
            base + "/rubris",
            transport=transport,  # type: ignore[arg-type]
            # ACK late enough that messages are in flight when the plug is pulled
            ack_every=8,
            ack_interval=0.3,
        ) as c:
            await c.subscribe("inbox", lambda v, info: received.append(v["i"]))
            session = rubris.engine.sessions[c.session_id]  # type: ignore[index]
            sent = 0

            async def producer() -> None:
                nonlocal sent
                for i in range(60):
                    await rubris.send(session, "inbox", {"i": i})  # waits while full (16)
                    sent += 1
                    await asyncio.sleep(0.002)

            task = asyncio.create_task(producer())
            await until(lambda: len(received) >= 5)
            # pull the plug on the connection, server side
            if transport == "websocket":
                for conn in list(rubris.websocket.connections):
                    await conn.abort(8, "test drop")
            else:
                rubris.engine.detach(session)
                rubris.longpoll.sessions.pop(session.id).end()
            await asyncio.wait_for(task, 20)
            await until(lambda: len(set(received)) == 60, timeout=15)
            assert sorted(set(received)) == list(range(60))
            assert c.session_id == session.id  # the session was resumed, not replaced
            # duplicates from the replay are dropped by the client
            assert received == sorted(received)


async def test_mounted_in_fastapi_under_any_path() -> None:
    rubris = make_rubris()
    app = FastAPI(lifespan=rubris.lifespan)
    app.mount("/deep/push", rubris)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"ok": "yes"}

    async with run_server(app) as base:
        async with Client(base + "/deep/push") as c:
            assert await c.call("echo", 7) == 7
        async with Client(base + "/deep/push", transport="longpoll") as c:
            assert await c.call("echo", 8) == 8


@pytest.mark.parametrize("server", SERVERS)
async def test_clean_shutdown_sends_goodbye_and_leaves_no_task(server: str) -> None:
    before = set(asyncio.all_tasks())
    rubris = make_rubris(timing=Timing(poll_timeout=1.0, session_timeout=5.0, shutdown_drain=2))
    async with run_server(starlette_app(rubris), server=server) as base:
        c = Client(base + "/rubris", reconnect=False)
        await c.connect()
        await c.subscribe("snap.x")
        await rubris.drain()
        await until(lambda: c.stats.goodbye is not None)
        assert c.stats.goodbye[0] == 9  # type: ignore[index]
        await c.close()
    assert not rubris.started
    await asyncio.sleep(0.05)
    left = {t for t in asyncio.all_tasks() - before if not t.done()}
    left.discard(asyncio.current_task())  # type: ignore[arg-type]
    assert left == set(), left


async def test_starlette_authentication_reaches_handlers() -> None:
    from starlette.applications import Starlette
    from starlette.authentication import AuthCredentials, AuthenticationBackend, SimpleUser
    from starlette.middleware import Middleware
    from starlette.middleware.authentication import AuthenticationMiddleware
    from starlette.requests import HTTPConnection
    from starlette.routing import Mount

    class HeaderAuth(AuthenticationBackend):
        async def authenticate(self, conn: HTTPConnection) -> Any:
            name = conn.headers.get("x-user")
            return (AuthCredentials(["authenticated"]), SimpleUser(name)) if name else None

    rubris = make_rubris()
    app = Starlette(
        routes=[Mount("/rubris", rubris)],
        middleware=[Middleware(AuthenticationMiddleware, backend=HeaderAuth())],
        lifespan=rubris.lifespan,
    )
    async with run_server(app) as base:
        for transport in TRANSPORTS:
            async with Client(
                base + "/rubris",
                transport=transport,  # type: ignore[arg-type]
                headers={"x-user": "alice"},
            ) as c:
                me = await c.call("whoami")
                assert me == {"session": c.session_id, "user": "alice"}
                session = rubris.engine.sessions[c.session_id]  # type: ignore[index]
                assert session.user.username == "alice"
