"""The WebSocket carrier of a connection (``websockets``: imported at a client's first one)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping

from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.typing import Subprotocol

from ..errors import ErrorCode, ProtocolError
from ..protocol import SUBPROTOCOL
from .concurrency import _within
from .errors import _Fatal, _Lost
from .links import _Link

log = logging.getLogger("rubris_asgi.client")


class _WebSocketLink(_Link):
    def __init__(
        self, url: str, headers: Mapping[str, str] | None, max_size: int, open_timeout: float
    ) -> None:
        self.url = url
        self.headers = dict(headers) if headers else None
        self.max_size = max_size
        self.open_timeout = open_timeout
        self.ws: ClientConnection | None = None

    async def open(self, hello: bytes) -> bytes:
        try:
            self.ws = await ws_connect(
                self.url,
                subprotocols=[Subprotocol(SUBPROTOCOL)],
                compression=None,
                max_size=self.max_size,
                additional_headers=self.headers,
                open_timeout=self.open_timeout,
                ping_interval=None,  # the protocol's own PING/PONG is the heartbeat
                close_timeout=2,
            )
        except InvalidStatus as exc:
            status = exc.response.status_code
            if status in (401, 403):
                raise _Fatal(f"WebSocket handshake refused: HTTP {status}") from exc
            raise _Lost(f"WebSocket handshake refused: HTTP {status}") from exc
        await self.send(hello)
        try:
            return await _within(self.recv(), self.open_timeout)
        except asyncio.TimeoutError:
            raise _Lost(f"no WELCOME within {self.open_timeout} s") from None

    async def recv(self) -> bytes:
        assert self.ws is not None
        try:
            data = await self.ws.recv()
        except ConnectionClosed as exc:
            raise _Lost(f"connection closed: {exc}") from exc
        if isinstance(data, str):
            raise ProtocolError("the server sent a text frame", ErrorCode.PROTOCOL)
        return data

    async def send(self, frame: bytes) -> None:
        assert self.ws is not None
        try:
            await self.ws.send(frame)
        except ConnectionClosed as exc:
            raise _Lost(f"connection closed: {exc}") from exc

    async def aclose(self) -> None:
        ws, self.ws = self.ws, None
        if ws is not None:
            try:
                await ws.close()
            except Exception:  # a broken socket has nothing left to say
                log.debug("closing the WebSocket failed", exc_info=True)
