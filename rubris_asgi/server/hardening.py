"""What every HTTP answer and request body of rubris share, so that a client cannot hold it.

- :func:`receive_body`: a body rubris reads itself (the HTTP API, a long-poll POST) must come
  whole within ``Timing.body_timeout`` and stay under its limit. No ASGI server bounds how long
  a body may take: without a deadline a client sending a byte a second keeps a request, its
  task and what it holds alive for as long as it likes, and a few thousand such clients hold
  the server. The deadline covers the whole body, not the gap between chunks, so dribbling
  just fast enough does not help.
- The response headers that keep a browser from reading an answer as something else:
  ``X-Content-Type-Options: nosniff`` (JSON or JavaScript is never sniffed into HTML) and a
  Content-Security-Policy, strict for data, as loose as a script needs for the browser files.

The head of a request (request line and headers) and an idle kept-alive connection are the
server's to bound, before rubris sees anything: ``serve()`` does it on uvicorn (serving.py).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable
from typing import TypeVar

from starlette.requests import Request

from ..errors import ProtocolError

T = TypeVar("T")

NOSNIFF = "nosniff"
DATA_CSP = "default-src 'none'; frame-ancestors 'none'"
"""The policy of an answer that is data (JSON, text): nothing in it may load or run, and no page
may frame it."""
SCRIPT_CSP = "default-src 'self'; object-src 'none'; frame-ancestors 'none'"
"""The policy of a browser file (JavaScript). A page's policy is its own; this one matters only
if the file is opened as a document, or runs as a worker, where it must still import its
modules and reach its own server."""
DATA_HEADERS = {"X-Content-Type-Options": NOSNIFF, "Content-Security-Policy": DATA_CSP}
"""The headers of every data answer (the HTTP API's JSON, plain-text errors)."""


class BodyTooLarge(Exception):
    """A request body over its limit (each caller answers it in its own words: 413)."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"the body is over the limit of {limit} bytes")
        self.limit = limit


class BodyTimeout(ProtocolError):
    """A request body that did not arrive whole within ``Timing.body_timeout``: HTTP 408.

    A ``ProtocolError`` (code 1) so that the long-poll transport answers it as the rest of its
    bad input; the HTTP API answers it in its own shape."""

    status = 408

    def __init__(self, seconds: float) -> None:
        super().__init__(f"request body not received within {seconds:g} s")
        self.seconds = seconds


async def receive_body(request: Request, limit: int, seconds: float) -> bytes:
    """The whole body of ``request``: ``BodyTooLarge`` past ``limit`` bytes (at once when its
    Content-Length says so, else as it streams in), ``BodyTimeout`` when it is not all there
    ``seconds`` after this call. Either way the rest of the body is not read (after a timeout
    the caller should answer with ``Connection: close``: the client is too slow to wait for)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge(limit)
    try:
        return await _within(seconds, _collect(request, limit))
    except asyncio.TimeoutError:
        raise BodyTimeout(seconds) from None


def may_have_body(request: Request) -> bool:
    """Whether ``request`` may carry a body. HTTP/1 says so in its head: without a
    Content-Length (or with 0) and without Transfer-Encoding it has none. HTTP/2 and 3 need
    neither, so there one may always come."""
    if request.scope.get("http_version", "1.1") not in ("1.0", "1.1"):
        return True
    headers = request.headers
    return headers.get("content-length", "0") != "0" or "transfer-encoding" in headers


async def _collect(request: Request, limit: int) -> bytes:
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise BodyTooLarge(limit)
    return bytes(body)


if sys.version_info >= (3, 11):

    async def _within(seconds: float, aw: Awaitable[T]) -> T:
        # a timer on this task: no second task per request, as wait_for makes before 3.12
        async with asyncio.timeout(seconds):
            return await aw

else:

    async def _within(seconds: float, aw: Awaitable[T]) -> T:
        return await asyncio.wait_for(aw, seconds)
