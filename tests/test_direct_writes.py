"""Prepared frames written straight to uvicorn's socket (server/direct.py, issue 29).

The bytes a client receives are the WebSocket frames the server's own ``send`` would have
written; the direct path is taken only where it is exact (uvicorn's ``websockets-sansio``, no
extension negotiated, ``direct_writes`` on), and everything else goes through ``send``.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from websockets.asyncio.client import connect
from websockets.frames import Frame, Opcode

from rubris_asgi import Config, Rubris, Session, Timing
from rubris_asgi.config import WriterConfig
from rubris_asgi.protocol import Hello, Push, Subscribe, decode_frame, encode_frame
from rubris_asgi.server.direct import binary_frame

from .apps import starlette_app
from .server import run_server
from .wirekit import until


@pytest.mark.parametrize("n", [0, 1, 125, 126, 127, 65535, 65536, 70000])
def test_a_prepared_frame_is_the_frame_websockets_would_write(n: int) -> None:
    payload = bytes(range(256)) * (n // 256) + bytes(n % 256)
    expected = Frame(Opcode.BINARY, payload).serialize(mask=False, extensions=[])
    assert binary_frame(payload) == expected


def ticker(direct: bool = True) -> Rubris:
    config = Config(timing=Timing(session_timeout=5.0), writer=WriterConfig(direct_writes=direct))
    rubris = Rubris(config)

    @rubris.shared("ticks", ring=64, compress_at=None)  # the payloads as published
    async def ticks(session: Session) -> None:
        return None

    return rubris


async def receive_ticks(
    base: str, rubris: Rubris, n: int, **connect_options: Any
) -> tuple[list[bytes], list[bool]]:
    """Subscribe to ``ticks``, publish ``n`` of them one by one: the PUSH payloads, and for
    each connection the server holds, whether it writes to the socket directly."""
    url = base.replace("http://", "ws://") + "/rubris/ws"
    async with connect(url, subprotocols=["rubris.v1"], **connect_options) as ws:
        await ws.send(encode_frame([Hello(1, ""), Subscribe(1, "ticks", 0, 0, b"")]))
        got: list[bytes] = []
        await until(lambda: "ticks" in rubris.engine.topics and rubris.engine.topics["ticks"].subs)
        direct = [conn._direct is not None for conn in rubris.websocket.connections]
        for i in range(n):
            rubris.publish("ticks", {"i": i, "pad": "x" * (i * 40)})  # 1-byte to 16-bit lengths
            await asyncio.sleep(0.005)
        while len(got) < n:
            frame = await asyncio.wait_for(ws.recv(), 5)
            got += [m.payload for m in decode_frame(frame) if isinstance(m, Push)]  # type: ignore[arg-type]
        return got, direct


async def test_under_uvicorn_frames_go_straight_to_the_socket_and_arrive_whole() -> None:
    rubris = ticker()
    async with run_server(starlette_app(rubris)) as base:
        got, direct = await receive_ticks(base, rubris, 40, compression=None)
    assert got == [f'{{"i":{i},"pad":"{"x" * (i * 40)}"}}'.encode() for i in range(40)]
    assert direct == [True]


@pytest.mark.parametrize(
    ("direct", "ws", "deflate"),
    [
        (False, "websockets-sansio", False),
        (True, "wsproto", False),
        (True, "websockets-sansio", True),
    ],
    ids=["switched-off", "wsproto", "permessage-deflate"],
)
async def test_elsewhere_frames_go_through_the_servers_send(
    direct: bool, ws: str, deflate: bool
) -> None:
    rubris = ticker(direct)
    async with run_server(starlette_app(rubris), ws=ws, ws_per_message_deflate=deflate) as base:
        options = {} if deflate else {"compression": None}
        got, on_socket = await receive_ticks(base, rubris, 20, **options)
    assert len(got) == 20
    assert on_socket == [False]
