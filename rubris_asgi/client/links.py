"""The carriers of one connection: WebSocket and HTTP long-poll; endpoints of a mount URL."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from urllib.parse import quote, urlsplit, urlunsplit

import httpx
from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.typing import Subprotocol

from ..errors import ErrorCode, ProtocolError
from ..protocol import SUBPROTOCOL, Welcome
from .concurrency import _within
from .errors import _Fatal, _Lost

log = logging.getLogger("rubris_asgi.client")

_OCTETS = "application/octet-stream"
_FRAME_HEADER = "Rubris-Frame"
_POLL_RETRIES = 5  # consecutive network failures of a poll before the connection counts as lost


class _Link:
    """One connection attempt's carrier: WebSocket or long-poll."""

    async def open(self, hello: bytes) -> bytes:
        """Send HELLO; return the first server frame (it starts with WELCOME)."""
        raise NotImplementedError

    def bind(self, welcome: Welcome) -> None:
        """The session is known (long-poll URLs need its id)."""

    async def recv(self) -> bytes:
        raise NotImplementedError

    async def send(self, frame: bytes) -> None:
        raise NotImplementedError

    async def aclose(self) -> None:
        """Release the connection; never raises."""


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


def _http_failure(r: httpx.Response, what: str) -> Exception:
    text = r.text[:200].strip()
    message = f"{what}: HTTP {r.status_code} {text}".rstrip()
    if r.status_code in (400, 401, 403, 413):
        code = ErrorCode.TOO_LARGE if r.status_code == 413 else ErrorCode.PROTOCOL
        if r.status_code in (401, 403):
            return _Fatal(message)
        return ProtocolError(message, code)
    return _Lost(message)


class _LongPollLink(_Link):
    def __init__(
        self,
        base: str,
        http: httpx.AsyncClient,
        backoff: tuple[float, float],
        open_timeout: float,
    ) -> None:
        self.base = base
        self.http = http
        self.backoff = backoff
        self.open_timeout = open_timeout
        self.session_url = ""
        self.ack = 0  # the number of the last frame received

    async def open(self, hello: bytes) -> bytes:
        try:
            r = await self.http.post(
                self.base,
                content=hello,
                headers={"content-type": _OCTETS},
                timeout=self.open_timeout,
            )
        except httpx.TransportError as exc:
            raise _Lost(f"POST {self.base} failed: {exc!r}") from exc
        if r.status_code != 200:
            raise _http_failure(r, f"POST {self.base}")
        return r.content

    def bind(self, welcome: Welcome) -> None:
        self.session_url = f"{self.base}/{quote(welcome.session, safe='')}"
        self.ack = 0  # frames are numbered from 1 per long-poll session

    async def recv(self) -> bytes:
        failures = 0
        delay = self.backoff[0]
        while True:
            try:
                r = await self.http.get(self.session_url, params={"ack": self.ack})
            except httpx.TransportError as exc:
                # the response may be lost on the way: the server sends frame ack+1 again
                failures += 1
                if failures > _POLL_RETRIES:
                    raise _Lost(f"polling failed {failures} times: {exc!r}") from exc
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.backoff[1])
                continue
            failures = 0
            status = r.status_code
            if status == 200:
                raw = r.headers.get(_FRAME_HEADER, "")
                number = int(raw) if raw.isdigit() else self.ack + 1
                if number <= self.ack:
                    continue  # a frame we already have
                self.ack = number
                if r.content:
                    return r.content
                continue
            if status == 204:
                continue
            if status == 409:
                raise _Fatal("another poll took over this long-poll session (HTTP 409)")
            if status == 404:
                raise _Lost("the long-poll session is gone (HTTP 404)")
            raise _http_failure(r, "poll")

    async def send(self, frame: bytes) -> None:
        try:
            r = await self.http.post(
                self.session_url,
                content=frame,
                headers={"content-type": _OCTETS},
                timeout=self.open_timeout,
            )
        except httpx.TransportError as exc:
            raise _Lost(f"POST {self.session_url} failed: {exc!r}") from exc
        if r.status_code == 404:
            raise _Lost("the long-poll session is gone (HTTP 404)")
        if not 200 <= r.status_code < 300:
            raise _http_failure(r, "POST")


def _endpoints(url: str) -> tuple[str, str]:
    """``(ws_url, lp_url)`` of a mount URL given as http(s):// or ws(s)://."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme in ("http", "ws"):
        http_scheme, ws_scheme = "http", "ws"
    elif scheme in ("https", "wss"):
        http_scheme, ws_scheme = "https", "wss"
    else:
        raise ValueError(f"url: expected http://, https://, ws:// or wss://, got {url!r}")
    path = parts.path.rstrip("/")
    ws_url = urlunsplit((ws_scheme, parts.netloc, path + "/ws", parts.query, ""))
    lp_url = urlunsplit((http_scheme, parts.netloc, path + "/lp", "", ""))
    return ws_url, lp_url
