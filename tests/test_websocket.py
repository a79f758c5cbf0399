"""The WebSocket transport at the wire level, against a real uvicorn."""

from __future__ import annotations

import asyncio

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from rubris_asgi.protocol import (
    Goodbye,
    Hello,
    Ping,
    Pong,
    Push,
    Subscribe,
    Subscribed,
    Welcome,
    decode_frame,
    encode_frame,
)

from .apps import make_rubris, starlette_app
from .server import run_server


def ws_url(base: str) -> str:
    return base.replace("http://", "ws://") + "/rubris/ws"


async def recv_msgs(ws: object, n: int, timeout: float = 5.0) -> list[object]:
    out: list[object] = []
    while len(out) < n:
        frame = await asyncio.wait_for(ws.recv(), timeout)  # type: ignore[attr-defined]
        out.extend(decode_frame(frame))
    return out


async def test_hello_welcome_and_subprotocol() -> None:
    rubris = make_rubris()
    async with run_server(starlette_app(rubris)) as base:
        async with connect(ws_url(base), subprotocols=["rubris.v1"], compression=None) as ws:
            assert ws.subprotocol == "rubris.v1"
            await ws.send(encode_frame([Hello(1, ""), Subscribe(1, "snap.a", 0, 0, b""), Ping(9)]))
            msgs = await recv_msgs(ws, 4)
            assert isinstance(msgs[0], Welcome) and not msgs[0].resumed
            assert len(msgs[0].session) >= 22 and len(msgs[0].resume) >= 44
            assert isinstance(msgs[1], Subscribed) and msgs[1].name == "snap.a"
            assert msgs[2] == Pong(9)
            assert isinstance(msgs[3], Push) and msgs[3].payload == b'{"initial":"a"}'


@pytest.mark.parametrize(
    ("first", "code", "close"),
    [
        ("text", 1, 1002),
        (encode_frame([Ping(1)]), 1, 1002),
        (encode_frame([Hello(2, "")]), 2, 1002),
        (b"\x21\x09\x01", 1, 1002),
    ],
)
async def test_bad_first_frame_gets_goodbye_and_close(first: object, code: int, close: int) -> None:
    rubris = make_rubris()
    async with run_server(starlette_app(rubris)) as base:
        async with connect(ws_url(base), subprotocols=["rubris.v1"], compression=None) as ws:
            await ws.send(first)  # type: ignore[arg-type]
            [bye] = decode_frame(await asyncio.wait_for(ws.recv(), 5))
            assert isinstance(bye, Goodbye) and bye.code == code
            with pytest.raises(ConnectionClosed):
                await asyncio.wait_for(ws.recv(), 5)
            assert ws.close_code == close
        assert rubris.engine.sessions == {}


async def test_text_frame_after_hello_ends_the_session_only() -> None:
    rubris = make_rubris()
    async with run_server(starlette_app(rubris)) as base:
        url = ws_url(base)
        async with connect(url, subprotocols=["rubris.v1"], compression=None) as good:
            await good.send(encode_frame([Hello(1, ""), Subscribe(1, "ring.x", 0, 0, b"")]))
            await recv_msgs(good, 2)
            async with connect(url, subprotocols=["rubris.v1"], compression=None) as bad:
                await bad.send(encode_frame([Hello(1, "")]))
                await recv_msgs(bad, 1)
                await bad.send("not binary")
                msgs = await recv_msgs(bad, 1)
                assert isinstance(msgs[0], Goodbye) and msgs[0].code == 1
            rubris.publish("ring.x", 1)
            [push] = await recv_msgs(good, 1)
            assert isinstance(push, Push) and push.payload == b"1"


async def test_resume_keeps_subscriptions_and_private_messages() -> None:
    rubris = make_rubris()
    async with run_server(starlette_app(rubris)) as base:
        url = ws_url(base)
        ws = await connect(url, subprotocols=["rubris.v1"], compression=None)
        await ws.send(encode_frame([Hello(1, ""), Subscribe(1, "inbox", 0, 0, b"")]))
        welcome, sub = await recv_msgs(ws, 2)
        assert isinstance(welcome, Welcome) and isinstance(sub, Subscribed)
        session = rubris.engine.sessions[welcome.session]
        for i in range(3):
            rubris.send_nowait(session, "inbox", i)
        got = await recv_msgs(ws, 3)
        assert [m.seq for m in got if isinstance(m, Push)] == [1, 2, 3]
        await ws.close()  # no ACK sent: all three are still unacknowledged
        for _ in range(100):
            if session.sink is None:
                break
            await asyncio.sleep(0.01)
        rubris.send_nowait(session, "inbox", 3)
        async with connect(url, subprotocols=["rubris.v1"], compression=None) as ws2:
            await ws2.send(encode_frame([Hello(1, welcome.resume)]))
            again = await recv_msgs(ws2, 5)
            assert isinstance(again[0], Welcome) and again[0].resumed
            assert again[0].session == welcome.session
            assert [m.seq for m in again if isinstance(m, Push)] == [1, 2, 3, 4]


async def test_unknown_resume_token_gets_a_new_session() -> None:
    rubris = make_rubris()
    async with run_server(starlette_app(rubris)) as base:
        async with connect(ws_url(base), subprotocols=["rubris.v1"], compression=None) as ws:
            await ws.send(encode_frame([Hello(1, "nope.nope")]))
            [welcome] = await recv_msgs(ws, 1)
            assert isinstance(welcome, Welcome) and not welcome.resumed


@pytest.mark.slow  # seconds of timeouts waited out: the full suite's, not the inner loop's
async def test_a_silent_client_is_closed_after_twice_the_heartbeat_and_can_resume() -> None:
    from rubris_asgi import Timing

    rubris = make_rubris(timing=Timing(heartbeat=0.5, session_timeout=5.0, poll_timeout=1.0))
    async with run_server(starlette_app(rubris)) as base:
        # ping_interval=None: the client library's own pings would keep the socket alive
        async with connect(ws_url(base), compression=None, ping_interval=None) as ws:
            await ws.send(encode_frame([Hello(1, ""), Subscribe(1, "snap.a", 0, 0, b"")]))
            welcome, *_ = await recv_msgs(ws, 3)
            assert isinstance(welcome, Welcome)
            began = asyncio.get_running_loop().time()
            with pytest.raises(ConnectionClosed) as closed:
                while True:
                    await asyncio.wait_for(ws.recv(), 5)
            took = asyncio.get_running_loop().time() - began
        assert closed.value.rcvd is not None
        assert (closed.value.rcvd.code, closed.value.rcvd.reason) == (1000, "heartbeat timeout")
        assert 0.9 < took < 2.5, took  # 2 x 0.5 s, looked for at each sweep (0.25 s)
        s = rubris.engine.sessions[welcome.session]
        assert s.state.name == "DETACHED" and not rubris.websocket.connections
        async with connect(ws_url(base), compression=None) as ws:
            await ws.send(encode_frame([Hello(1, welcome.resume)]))
            [again] = await recv_msgs(ws, 1)
            assert isinstance(again, Welcome) and again.resumed and again.session == s.id
