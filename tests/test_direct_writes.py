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
from rubris_asgi.server.direct import DirectSocket, Outbox, binary_frame

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


def server_frames(data: bytes) -> list[tuple[int, bytes]]:
    """The (opcode, payload) of each whole frame in ``data``, as a server sends them (unmasked)."""
    frames = []
    i = 0
    while i + 2 <= len(data):
        opcode, n = data[i] & 0x0F, data[i + 1] & 0x7F
        head = 2
        if n == 126:
            n, head = int.from_bytes(data[i + 2 : i + 4], "big"), 4
        elif n == 127:
            n, head = int.from_bytes(data[i + 2 : i + 10], "big"), 10
        if i + head + n > len(data):
            break
        frames.append((opcode, data[i + head : i + head + n]))
        i += head + n
    return frames


def client_frame(opcode: int, payload: bytes) -> bytes:
    """A masked client frame (RFC 6455 section 5.3), payload under 126 bytes."""
    mask = b"\x01\x02\x03\x04"
    masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    return bytes((0x80 | opcode, 0x80 | len(payload))) + mask + masked


@pytest.mark.parametrize("rounds", range(3))
async def test_no_data_frame_follows_the_close_while_frames_flow(rounds: int) -> None:
    """A client closes while a message is published every millisecond: the server answers its
    close, and nothing written straight to the socket comes after that close frame (raw bytes
    read to the end of the connection). Under uvicorn 0.54 the transport is closed in the same
    callback as the close is answered, so this holds through the direct path's own check or the
    transport's; it is the tripwire for a uvicorn that would answer a close and keep writing."""
    rubris = ticker()
    async with run_server(starlette_app(rubris)) as base:
        port = int(base.rsplit(":", 1)[1])
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            b"GET /rubris/ws HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
            b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
            b"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: rubris.v1\r\n\r\n"
        )
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 101"), head
        hello = encode_frame([Hello(1, ""), Subscribe(1, "ticks", 0, 0, b"")])
        writer.write(client_frame(0x2, hello))
        await until(lambda: "ticks" in rubris.engine.topics and rubris.engine.topics["ticks"].subs)
        assert [conn._direct is not None for conn in rubris.websocket.connections] == [True]
        stop = asyncio.Event()

        async def publish() -> None:
            i = 0
            while not stop.is_set():
                rubris.publish("ticks", {"i": i})
                i += 1
                await asyncio.sleep(0.001)

        publisher = asyncio.create_task(publish())
        data = b""
        while sum(op == 0x2 for op, _ in server_frames(data)) < 20:  # frames are flowing
            data += await asyncio.wait_for(reader.read(65536), 5)
        writer.write(client_frame(0x8, (1000).to_bytes(2, "big")))
        while chunk := await asyncio.wait_for(reader.read(65536), 5):  # to the server's EOF
            data += chunk
        stop.set()
        await publisher
        writer.close()
    frames = server_frames(data)
    opcodes = [op for op, _ in frames]
    assert 0x8 in opcodes, opcodes[-5:]
    assert opcodes.index(0x8) == len(opcodes) - 1, opcodes[-5:]  # the close is the last frame
    assert frames[-1][1][:2] == (1000).to_bytes(2, "big")


class Wire:
    """A transport as DirectSocket sees it: what it was given, in order."""

    def __init__(self, log: list[tuple[str, bytes]], name: str, fail: bool = False) -> None:
        self.log, self.name, self.fail = log, name, fail
        self.closing = False
        self.buffered = 0

    def is_closing(self) -> bool:
        return self.closing

    def get_write_buffer_size(self) -> int:
        return self.buffered

    def write(self, data: bytes) -> None:
        if self.fail:
            raise RuntimeError("handle is closed")
        self.log.append((self.name, data))


def test_the_outbox_writes_in_order_every_batch_and_on_flush_and_past_a_failed_write() -> None:
    log: list[tuple[str, bytes]] = []
    outbox = Outbox()
    sockets = [
        DirectSocket(Wire(log, f"c{i}", fail=i == 3), outbox) for i in range(Outbox.BATCH + 10)
    ]
    for i, sock in enumerate(sockets[: Outbox.BATCH - 1]):
        assert sock.write(b"f%d" % i)
    assert log == []  # decided, not written yet
    assert sockets[Outbox.BATCH - 1].write(b"last of a batch")
    assert len(log) == Outbox.BATCH - 1  # the whole batch, less the one whose write failed
    assert [name for name, _ in log[:4]] == ["c0", "c1", "c2", "c4"]
    for i, sock in enumerate(sockets[Outbox.BATCH :]):
        assert sock.write(b"g%d" % i)
    outbox.flush()  # the cycle's end
    assert len(log) == Outbox.BATCH + 9 and outbox.waiting == []


def test_a_socket_closing_or_with_bytes_waiting_is_not_written_directly() -> None:
    log: list[tuple[str, bytes]] = []
    outbox = Outbox()
    closing, full = Wire(log, "closing"), Wire(log, "full")
    closing.closing = True
    full.buffered = 1  # the server's send would wait (or buffer behind it): ASGI it is
    assert not DirectSocket(closing, outbox).write(b"x")
    assert not DirectSocket(full, outbox).write(b"x")
    outbox.flush()
    assert log == []


async def test_two_hundred_clients_get_every_message_in_order_through_the_outbox() -> None:
    """More clients than a batch: frames written every 64 and at each cycle's end."""
    rubris = ticker()
    url_of = lambda base: base.replace("http://", "ws://") + "/rubris/ws"  # noqa: E731
    async with run_server(starlette_app(rubris)) as base:
        clients = [
            await connect(url_of(base), subprotocols=["rubris.v1"], compression=None)
            for _ in range(200)
        ]
        try:
            for ws in clients:
                await ws.send(encode_frame([Hello(1, ""), Subscribe(1, "ticks", 0, 0, b"")]))
            topics = rubris.engine.topics
            await until(lambda: "ticks" in topics and len(topics["ticks"].subs) == 200)
            assert all(c._direct is not None for c in rubris.websocket.connections)
            for i in range(5):
                rubris.publish("ticks", {"i": i})
                await asyncio.sleep(0.01)

            async def pushes(ws: Any) -> list[bytes]:
                got: list[bytes] = []
                while len(got) < 5:
                    frame = await asyncio.wait_for(ws.recv(), 5)
                    got += [m.payload for m in decode_frame(frame) if isinstance(m, Push)]  # type: ignore[arg-type]
                return got

            every = await asyncio.gather(*(pushes(ws) for ws in clients))
        finally:
            await asyncio.gather(*(ws.close() for ws in clients))
    assert all(got == [b'{"i":%d}' % i for i in range(5)] for got in every)
