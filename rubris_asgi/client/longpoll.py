"""The HTTP long-poll carrier of a connection (``httpx``: imported when a client first polls)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from urllib.parse import quote

import httpx

from ..errors import ErrorCode, ProtocolError
from ..protocol import Welcome
from .errors import _Fatal, _Lost
from .links import _Link, _no_endpoint, _NotNow

_OCTETS = "application/octet-stream"
_FRAME_HEADER = "Rubris-Frame"
_POLL_RETRIES = 5  # consecutive network failures of a poll before the connection counts as lost


def _http_client(
    headers: Mapping[str, str] | None,
    transport: httpx.AsyncBaseTransport | None,
    open_timeout: float,
    poll_timeout: float,
) -> httpx.AsyncClient:
    """The client's one ``httpx.AsyncClient``, shared by its long-poll connections."""
    return httpx.AsyncClient(
        headers=headers,
        transport=transport,
        timeout=httpx.Timeout(open_timeout, read=poll_timeout),
    )


def _http_failure(r: httpx.Response, what: str) -> Exception:
    text = r.text[:300].strip()
    status = r.status_code
    message = f"{what}: HTTP {status} {text}".rstrip()
    if status in (401, 403):  # rubris's refusals (origin, credentials) give their reason
        if not text:
            return _Fatal(_no_endpoint(str(r.request.url), status))
        return _Fatal(f"{r.request.url} refused the session (HTTP {status}): {text}")
    if status in (400, 413):
        return ProtocolError(message, ErrorCode.TOO_LARGE if status == 413 else ErrorCode.PROTOCOL)
    if status == 503 or status == 429 or status >= 500:
        # the node is starting, stopping or overloaded: not now
        return _NotNow(message, _retry_after(r.headers.get("retry-after")))
    return _Lost(message)


def _retry_after(value: str | None) -> float | None:
    """Seconds from a ``Retry-After`` header (its delay form; a date is ignored), at most 60."""
    try:
        return min(max(float(value), 0.0), 60.0) if value else None
    except ValueError:
        return None


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
        if r.status_code in (404, 405):  # no route: a rubris mount answers POST /lp
            raise _Fatal(_no_endpoint(self.base, r.status_code))
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
