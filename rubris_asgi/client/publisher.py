"""Publishing from any Python program: ``Publisher`` (asyncio) and ``SyncPublisher`` (threads).

Both speak the HTTP API of protocol.md section 8b (``POST {mount}/api/publish``, NDJSON) through
httpx (the ``client`` extra). Small messages are gathered into one request of up to ``batch``
entries (or ``batch_bytes``); the asyncio form also sends a partial batch ``linger`` seconds
after its first entry. A request carries at most ``REQUEST_SPAN`` (50 ms) of the current send
limit, so a slowed publisher sends smaller requests and hears the fill often. One request is in
flight at a time, so the server sees a publisher's messages in the order they were published.

Pacing is the source document on backpressure: every answer carries ``Rubris-Fill``, the
server's intake fill; a :class:`~rubris_asgi.ratelimit.RateLimiter` lowers the send rate on a
fill of 50 % or more (the strongest in a 50 ms window wins) and raises it stepwise while the
fill stays low. Before each request the publisher waits for that many messages' worth of rate.
Several publishers pace themselves alike without the server knowing about them.

Failures: 429 (the intake is full) and 503, and connection errors, are retried with backoff
(at least ``Retry-After``) for up to ``retry_for`` seconds, then :class:`PublishError`. A request
the server refused for its content (400, 404, 413, 415) or its credentials (401, 403) is not
retried: :class:`PublishError` with the status, reason and the index of the entry at fault.
A request whose answer was lost on the way may have been accepted: retrying it can publish its
messages twice (shared topics are at-least-once from outside the process).

    >>> async def main() -> None:  # doctest: +SKIP
    ...     async with Publisher("http://127.0.0.1:8000/rubris", token="...") as pub:
    ...         for i in range(10_000):
    ...             await pub.publish("prices.AAPL", {"bid": 100 + i / 100})
"""

from __future__ import annotations

import asyncio
import base64
import random
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from ..control.ratelimit import RateLimiter
from ..errors import RubrisError

if TYPE_CHECKING:
    import httpx

# httpx (about 200 ms of imports) is imported where a request is made or an HTTP client built,
# not at the top: `from rubris_asgi.client import PublishError` (to catch it) loads no httpx.

__all__ = ["PublishError", "Publisher", "PublisherStats", "SyncPublisher"]

_RETRYABLE = frozenset({429, 502, 503, 504})
REQUEST_SPAN = 0.05
"""Seconds of the current send limit one request carries at most (see ``request_size``)."""
_BACKOFF_BASE = 0.05
_BACKOFF_MAX = 2.0


class PublishError(RubrisError):
    """A request the server refused (``status``, ``reason``, ``index`` of the entry at fault),
    or one that could not be delivered within ``retry_for`` (``status`` 0: no answer)."""

    def __init__(self, status: int, reason: str, index: int | None = None) -> None:
        where = f" (entry {index})" if index is not None else ""
        super().__init__(f"HTTP {status}: {reason}{where}" if status else reason)
        self.status = status
        self.reason = reason
        self.index = index


@dataclass
class PublisherStats:
    """What a publisher sent: ``accepted`` messages, ``requests`` answered 200, ``retries``
    (429/503/connection errors), ``refusals`` (429 answers), and the last ``fill`` seen."""

    accepted: int = 0
    requests: int = 0
    retries: int = 0
    refusals: int = 0
    fill: int = 0


class _Batch:
    """Entries gathered into one NDJSON body."""

    def __init__(self) -> None:
        self.lines: list[bytes] = []
        self.size = 0
        self.started = 0.0

    def add(self, line: bytes, now: float) -> None:
        if not self.lines:
            self.started = now
        self.lines.append(line)
        self.size += len(line) + 1

    def take(self, most: int) -> tuple[bytes, int]:
        """The first ``most`` entries as one body, and how many they are."""
        lines, self.lines = self.lines[:most], self.lines[most:]
        body = b"\n".join(lines) + b"\n"
        self.size -= len(body)
        return body, len(lines)


def _line(topic: str, data: Any) -> bytes:
    if isinstance(data, (bytes, bytearray, memoryview)):
        return orjson.dumps({"topic": topic, "data_b64": base64.b64encode(data).decode()})
    return orjson.dumps({"topic": topic, "data": data})


class RequestCore:
    """What both publisher forms and the Spark sink share: settings, the batch, the limiter,
    reading answers, and the paced and retried request of the thread form."""

    def __init__(
        self,
        url: str,
        token: str | None,
        batch: int,
        batch_bytes: int,
        retry_for: float,
        limiter: RateLimiter | None,
        path: str = "publish",
    ) -> None:
        if batch < 1 or batch_bytes < 1 or retry_for < 0:
            raise ValueError("batch and batch_bytes must be >= 1, retry_for >= 0")
        self.endpoint = f"{url.rstrip('/')}/api/{path}"
        self.headers = {"Content-Type": "application/x-ndjson"}
        if token is not None:
            self.headers["Authorization"] = f"Bearer {token}"
        self.batch_max = batch
        self.batch_bytes = batch_bytes
        self.retry_for = retry_for
        self.limiter = limiter or RateLimiter()
        self.stats = PublisherStats()
        self.batch = _Batch()

    def full(self) -> bool:
        return len(self.batch.lines) >= self.batch_max or self.batch.size >= self.batch_bytes

    def request_size(self) -> int:
        """Entries in the next request: at most ``batch``, and about ``REQUEST_SPAN`` seconds'
        worth of the current limit, so that a slowed publisher still hears the fill often
        (a 1,000-entry request at 1,000 messages/s would bring one answer a second)."""
        return max(1, min(self.batch_max, int(self.limiter.rate * REQUEST_SPAN)))

    def answer(self, response: httpx.Response, n: int) -> float | None:
        """Account an answer: None when accepted, else the seconds to wait before a retry.

        Raises ``PublishError`` for an answer that a retry would not change.
        """
        fill = response.headers.get("rubris-fill", "")
        if fill.isdigit():
            self.stats.fill = int(fill)
            self.limiter.on_fill(int(fill))
        status = response.status_code
        if status == 200:
            self.stats.accepted += n
            self.stats.requests += 1
            return None
        if status in _RETRYABLE:
            if status == 429:
                self.stats.refusals += 1
            after = response.headers.get("retry-after", "")
            return float(after) if after.isdigit() else 0.0
        try:
            body = response.json()
            raise PublishError(status, str(body.get("error")), body.get("index"))
        except (ValueError, AttributeError):
            raise PublishError(status, response.text[:200]) from None

    def retry_wait(self, started: float, attempt: int, at_least: float, why: str) -> float:
        """Seconds to wait before retry number ``attempt`` (backoff, at least ``at_least``);
        ``PublishError`` once ``retry_for`` has passed since ``started``."""
        if time.monotonic() - started >= self.retry_for:
            raise PublishError(0, f"not delivered within {self.retry_for:g} s: {why}")
        self.stats.retries += 1
        grown: float = min(_BACKOFF_MAX, _BACKOFF_BASE * 2.0**attempt)
        return max(at_least, grown * random.uniform(0.5, 1.0))

    def post_blocking(
        self,
        http: httpx.Client,
        body: bytes,
        n: int,
        sleep: Callable[[float], None] = time.sleep,
        params: dict[str, str] | None = None,
    ) -> httpx.Response:
        """Send one request of ``n`` entries from a thread: paced (the limiter's tokens first),
        retried as the class says; returns the 200 answer."""
        import httpx

        self.limiter.acquire_blocking(n)
        started = time.monotonic()
        attempt = 0
        while True:
            try:
                response = http.post(
                    self.endpoint, content=body, headers=self.headers, params=params
                )
                wait = self.answer(response, n)
                why = f"HTTP {response.status_code}"
            except httpx.TransportError as exc:
                wait, why = 0.0, f"{type(exc).__name__}: {exc}"
            if wait is None:
                return response
            sleep(self.retry_wait(started, attempt, wait, why))
            attempt += 1


class Publisher:
    """Publish to shared topics through the HTTP API, batched and paced (asyncio).

    Args:
        url: the mount URL (``http://host:port/rubris``).
        token: the API's bearer token (``Rubris(api_token=...)``).
        batch / batch_bytes: the most entries / NDJSON bytes in one request.
        linger: send a partial batch this long after its first entry (seconds).
        retry_for: how long 429s, 503s and connection errors are retried before ``PublishError``.
        limiter: the rate limiter (default: ``RateLimiter()``); publishers of one event loop
            that should pace together can share one.
        client: an ``httpx.AsyncClient`` to use (default: one of its own, closed with this).
    """

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        batch: int = 1000,
        batch_bytes: int = 1 << 20,
        linger: float = 0.005,
        retry_for: float = 30.0,
        limiter: RateLimiter | None = None,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        import httpx

        self._core = RequestCore(url, token, batch, batch_bytes, retry_for, limiter)
        self.linger = linger
        self._http = client or httpx.AsyncClient(timeout=30.0)
        self._own_http = client is None
        self._lock = asyncio.Lock()  # one request in flight: the server sees our order
        self._timer: asyncio.TimerHandle | None = None
        self._lingering: asyncio.Task[None] | None = None
        self._failure: BaseException | None = None

    @property
    def stats(self) -> PublisherStats:
        return self._core.stats

    @property
    def limiter(self) -> RateLimiter:
        return self._core.limiter

    async def publish(self, topic: str, data: Any) -> None:
        """Queue one message (``bytes`` go as ``data_b64`` for bytes topics); sends a full
        batch before returning. Raises the ``PublishError`` of an earlier batch sent in the
        background (by ``linger``)."""
        self._raise_failure()
        core = self._core
        core.batch.add(_line(topic, data), time.monotonic())
        if core.full():
            await self.flush()
        elif self._timer is None and self.linger > 0:
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(self.linger, self._linger)

    async def publish_many(self, entries: Iterable[tuple[str, Any]]) -> None:
        """Queue ``(topic, data)`` pairs, in order."""
        for topic, data in entries:
            await self.publish(topic, data)

    async def flush(self) -> None:
        """Send everything queued and wait for the answers."""
        self._raise_failure()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        async with self._lock:
            core = self._core
            while core.batch.lines:
                body, n = core.batch.take(core.request_size())
                await self._send(body, n)

    def _linger(self) -> None:
        self._timer = None
        if self._lingering is None or self._lingering.done():
            self._lingering = asyncio.get_running_loop().create_task(self._flush_quietly())

    async def _flush_quietly(self) -> None:
        try:
            await self.flush()
        except PublishError as exc:
            self._failure = exc  # raised to the next publish() or flush()
        except Exception as exc:
            self._failure = exc

    def _raise_failure(self) -> None:
        failure, self._failure = self._failure, None
        if failure is not None:
            raise failure

    async def _send(self, body: bytes, n: int) -> None:
        import httpx

        core = self._core
        await core.limiter.acquire(n)
        started = time.monotonic()
        attempt = 0
        while True:
            try:
                response = await self._http.post(core.endpoint, content=body, headers=core.headers)
                wait = core.answer(response, n)
                why = f"HTTP {response.status_code}"
            except httpx.TransportError as exc:
                wait, why = 0.0, f"{type(exc).__name__}: {exc}"
            if wait is None:
                return
            await asyncio.sleep(core.retry_wait(started, attempt, wait, why))
            attempt += 1

    async def aclose(self) -> None:
        """Send what is queued, then close the HTTP client (if it is ours)."""
        try:
            await self.flush()
        finally:
            if self._lingering is not None:
                await asyncio.gather(self._lingering, return_exceptions=True)
            if self._own_http:
                await self._http.aclose()

    async def __aenter__(self) -> Publisher:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class SyncPublisher:
    """The same for synchronous code and threads (httpx.Client; ``time.sleep`` to pace).

    A partial batch is sent by ``flush()``, ``close()``, the end of a ``with`` block, or the
    next ``publish()`` once ``linger`` has passed since its first entry (there is no timer
    thread). Not shared between threads without a lock of your own.
    """

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        batch: int = 1000,
        batch_bytes: int = 1 << 20,
        linger: float = 0.005,
        retry_for: float = 30.0,
        limiter: RateLimiter | None = None,
        client: httpx.Client | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        import httpx

        self._core = RequestCore(url, token, batch, batch_bytes, retry_for, limiter)
        self.linger = linger
        self._http = client or httpx.Client(timeout=30.0)
        self._own_http = client is None
        self._sleep = sleep

    @property
    def stats(self) -> PublisherStats:
        return self._core.stats

    def publish(self, topic: str, data: Any) -> None:
        core = self._core
        now = time.monotonic()
        core.batch.add(_line(topic, data), now)
        if core.full() or now - core.batch.started >= self.linger:
            self.flush()

    def publish_many(self, entries: Iterable[tuple[str, Any]]) -> None:
        for topic, data in entries:
            self.publish(topic, data)

    def flush(self) -> None:
        core = self._core
        while core.batch.lines:
            body, n = core.batch.take(core.request_size())
            self._send(body, n)

    def _send(self, body: bytes, n: int) -> None:
        self._core.post_blocking(self._http, body, n, self._sleep)

    def close(self) -> None:
        try:
            self.flush()
        finally:
            if self._own_http:
                self._http.close()

    def __enter__(self) -> SyncPublisher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
