"""Raw-wire helpers for the reliability and security tests: a WebSocket or long-poll peer that
speaks frames directly, so a test sees exactly the codes the server sends."""

from __future__ import annotations

import asyncio
import base64
import os
import socket
import struct
import weakref
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

import httpx
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from rubris_asgi.protocol import (
    Goodbye,
    Hello,
    Message,
    Welcome,
    decode_frame,
    encode_frame,
)


def ws_url(base: str, mount: str = "/rubris") -> str:
    return base.replace("http://", "ws://") + mount + "/ws"


async def ws_open(base: str, **kwargs: Any) -> ClientConnection:
    kwargs.setdefault("subprotocols", ["rubris.v1"])
    kwargs.setdefault("compression", None)
    return await connect(ws_url(base), **kwargs)


_backlog: weakref.WeakKeyDictionary[ClientConnection, deque[Message]] = weakref.WeakKeyDictionary()


async def _next(ws: ClientConnection, timeout: float) -> Message:
    """The next message from ``ws``, keeping the rest of its frame for later."""
    queue = _backlog.setdefault(ws, deque())
    while not queue:
        frame = await asyncio.wait_for(ws.recv(), max(timeout, 0.001))
        assert isinstance(frame, bytes), frame
        queue.extend(decode_frame(frame))
    return queue.popleft()


async def recv_msgs(ws: ClientConnection, n: int, timeout: float = 5.0) -> list[Message]:
    """The next ``n`` messages."""
    return [await _next(ws, timeout) for _ in range(n)]


async def recv_until(
    ws: ClientConnection, pred: Callable[[Message], bool], timeout: float = 5.0
) -> Message:
    """The first message matching ``pred`` (those before it are dropped)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        m = await _next(ws, deadline - loop.time())
        if pred(m):
            return m


async def ws_hello(ws: ClientConnection, *extra: Message, resume: str = "") -> Welcome:
    await ws.send(encode_frame([Hello(1, resume), *extra]))
    [w] = await recv_msgs(ws, 1)
    assert isinstance(w, Welcome), w
    return w


async def expect_goodbye_and_close(
    ws: ClientConnection, code: int, close: int, timeout: float = 5.0
) -> Goodbye:
    """The next message is GOODBYE ``code``; then the socket closes with ``close``."""
    bye = await recv_until(ws, lambda m: isinstance(m, Goodbye), timeout)
    assert isinstance(bye, Goodbye)
    assert bye.code == code, bye
    try:
        extra = await _next(ws, timeout)
        raise AssertionError(f"a frame after GOODBYE: {extra!r}")
    except ConnectionClosed:
        pass
    assert ws.close_code == close, (ws.close_code, ws.close_reason)
    return bye


async def lp_hello(c: httpx.AsyncClient, *extra: Message, resume: str = "") -> Welcome:
    r = await c.post("/lp", content=encode_frame([Hello(1, resume), *extra]))
    assert r.status_code == 200, (r.status_code, r.text)
    w = decode_frame(r.content)[0]
    assert isinstance(w, Welcome)
    return w


async def lp_collect(
    c: httpx.AsyncClient, sid: str, pred: Callable[[Message], bool], timeout: float = 5.0
) -> Message:
    """Poll ``sid`` until a message matching ``pred`` arrives."""
    ack = 0
    deadline = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < deadline:
        r = await c.get(f"/lp/{sid}", params={"ack": ack})
        if r.status_code == 200:
            ack = int(r.headers["Rubris-Frame"])
            for m in decode_frame(r.content):
                if pred(m):
                    return m
        elif r.status_code != 204:
            raise AssertionError(f"poll answered {r.status_code}: {r.text}")
    raise AssertionError("message not received in time")


async def until(
    cond: Callable[[], Any],
    timeout: float = 5.0,
    step: float = 0.01,
    what: Callable[[], Any] | None = None,
) -> None:
    """Wait for ``cond()``; on timeout, fail with ``what()`` (the state that was awaited)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not cond():
        if loop.time() > deadline:
            state = f": {what()}" if what is not None else ""
            raise AssertionError(f"condition not reached in time{state}")
        await asyncio.sleep(step)


# ------------------------------------------------------------------ a hand-made WebSocket peer


def ws_client_frame(payload: bytes, opcode: int = 0x2, fin: bool = True) -> bytes:
    """One masked client-to-server WebSocket frame (RFC 6455 section 5.2)."""
    head = bytes([(0x80 if fin else 0) | opcode])
    n = len(payload)
    if n < 126:
        head += bytes([0x80 | n])
    elif n < 1 << 16:
        head += bytes([0x80 | 126]) + struct.pack("!H", n)
    else:
        head += bytes([0x80 | 127]) + struct.pack("!Q", n)
    mask = os.urandom(4)
    masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    return head + mask + masked


async def raw_ws_handshake(
    port: int,
    path: str = "/rubris/ws",
    *,
    rcvbuf: int | None = None,
    headers: Iterable[tuple[str, str]] = (),
) -> tuple[socket.socket, int, bytes]:
    """Open a TCP socket and upgrade it by hand; returns (socket, HTTP status, leftover bytes).

    ``rcvbuf`` sets SO_RCVBUF before connecting, so a peer that never reads fills up fast.
    The socket is non-blocking; the caller closes it.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    try:
        await loop.sock_connect(sock, ("127.0.0.1", port))
        key = base64.b64encode(os.urandom(16)).decode()
        lines = [
            f"GET {path} HTTP/1.1",
            f"Host: 127.0.0.1:{port}",
            "Upgrade: websocket",
            "Connection: Upgrade",
            f"Sec-WebSocket-Key: {key}",
            "Sec-WebSocket-Version: 13",
            "Sec-WebSocket-Protocol: rubris.v1",
            *(f"{k}: {v}" for k, v in headers),
        ]
        await loop.sock_sendall(sock, ("\r\n".join(lines) + "\r\n\r\n").encode())
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = await asyncio.wait_for(loop.sock_recv(sock, 4096), 5)
            if not chunk:
                break
            data += chunk
        head, _, rest = data.partition(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1]) if head else 0
        return sock, status, rest
    except BaseException:
        sock.close()
        raise


def parse_server_frames(data: bytes) -> tuple[list[tuple[int, bytes]], bytes]:
    """Split unmasked server-to-client WebSocket frames: ([(opcode, payload)], leftover)."""
    out: list[tuple[int, bytes]] = []
    pos = 0
    while True:
        if len(data) - pos < 2:
            break
        b0, b1 = data[pos], data[pos + 1]
        n = b1 & 0x7F
        head = 2
        if n == 126:
            if len(data) - pos < 4:
                break
            n = struct.unpack_from("!H", data, pos + 2)[0]
            head = 4
        elif n == 127:
            if len(data) - pos < 10:
                break
            n = struct.unpack_from("!Q", data, pos + 2)[0]
            head = 10
        if len(data) - pos < head + n:
            break
        out.append((b0 & 0x0F, data[pos + head : pos + head + n]))
        pos += head + n
    return out, data[pos:]
