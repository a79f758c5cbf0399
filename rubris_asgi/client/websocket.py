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
from .links import _Link, _no_endpoint, _NotNow

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
            raise _refused(self.url, exc.response.status_code, exc.response.body) from exc
        try:
            await self.ws.send(hello)
            return await _within(self._recv(), self.open_timeout)
        except asyncio.TimeoutError:
            raise _Lost(f"no WELCOME from {self.url} within {self.open_timeout} s") from None
        except ConnectionClosed as exc:  # closed before WELCOME: refused, or "not now"
            raise _closed(self.url, exc, welcomed=False) from exc

    async def recv(self) -> bytes:
        try:
            return await self._recv()
        except ConnectionClosed as exc:
            raise _closed(self.url, exc, welcomed=True) from exc

    async def _recv(self) -> bytes:
        assert self.ws is not None
        data = await self.ws.recv()
        if isinstance(data, str):
            raise ProtocolError("the server sent a text frame", ErrorCode.PROTOCOL)
        return data

    async def send(self, frame: bytes) -> None:
        assert self.ws is not None
        try:
            await self.ws.send(frame)
        except ConnectionClosed as exc:
            raise _closed(self.url, exc, welcomed=True) from exc

    async def aclose(self) -> None:
        ws, self.ws = self.ws, None
        if ws is not None:
            try:
                await ws.close()
            except Exception:  # a broken socket has nothing left to say
                log.debug("closing the WebSocket failed", exc_info=True)


def _refused(url: str, status: int, body: bytes | bytearray | None) -> Exception:
    """The handshake answered ``status`` instead of 101: refused for good, or "not now"."""
    reason = bytes(body or b"").decode(errors="replace").strip()[:300]
    if status in (401, 403, 404) and not reason:
        return _Fatal(_no_endpoint(url, status))
    if status in (400, 401, 403, 404):  # rubris's refusals: origin, credentials, bad request
        return _Fatal(f"{url} refused the connection (HTTP {status}): {reason}")
    # 5xx, 429, a proxy's answer: the node may be starting, stopping or overloaded
    return _NotNow(f"{url} answered HTTP {status}: {reason or 'try again later'}")


def _closed(url: str, exc: ConnectionClosed, welcomed: bool) -> Exception:
    """A closed WebSocket as the supervisor sees it: "not now" (1012 restarting, 1013 try again
    later), refused for good (closed by policy before WELCOME, where a server that cannot answer
    a refused handshake with a status closes it), or lost."""
    frame = exc.rcvd
    code = frame.code if frame is not None else None
    reason = frame.reason if frame is not None else ""
    if code in (1012, 1013):
        what = "is restarting" if code == 1012 else "says try again later"
        return _NotNow(f"{url} {what} ({code}{': ' + reason if reason else ''})")
    if not welcomed and code is not None and (code in _REFUSALS or 4000 <= code < 5000):
        return _Fatal(f"{url} refused the connection (close {code}): {reason or 'no reason'}")
    return _Lost(f"connection closed: {exc}")


_REFUSALS = frozenset({1002, 1003, 1007, 1008, 1009, 1010})
"""Close codes that say the connection itself is refused (protocol, policy, size)."""
