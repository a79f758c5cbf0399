"""The asyncio client: subscribe, call and publish over WebSocket or HTTP long-poll.

One :class:`Client` holds one session with a rubris server mounted at ``url`` (the mount URL,
e.g. ``http://127.0.0.1:8000/rubris``; the WebSocket endpoint ``{mount}/ws`` and the long-poll
endpoint ``{mount}/lp`` are derived from it). It speaks the wire contract of protocol.md through
:mod:`rubris_asgi.protocol` and inflates COMPRESSED payloads with a hard limit.

Example (against a running server)::

    import asyncio

    from rubris_asgi.client import Client


    async def main() -> None:
        async with Client("http://127.0.0.1:8000/rubris") as client:
            sub = await client.subscribe("prices.AAPL")
            print(await client.call("place_order", {"qty": 1}))
            async for value, info in sub:
                print(info.seq, value)


    asyncio.run(main())

How it runs: :meth:`Client.connect` starts one supervisor task that opens a connection, sends
HELLO and waits for WELCOME; then, per connection, one reader task (frames strictly in order;
on long-poll the reader *is* the poll loop), one writer task (client frames in order; on
long-poll one POST at a time, its 202 awaited), an ACK timer and, on WebSocket, a heartbeat.
When the connection drops the supervisor reconnects with exponential backoff and resumes the
session with the token of the last WELCOME; when the server could not resume it, every live
subscription is subscribed again (ring and snapshot topics with ``epoch``/``since``, so a ring
replays what the client missed) and the calls in flight fail with :class:`ConnectionLost`.
:meth:`Client.close` cancels every task the client started and waits for them.

Subscription callbacks, sync or async, run inside the reader, one after the other in the order
of the wire: a callback must not wait for something only a later frame brings (``await
client.call(...)`` inside a callback waits for ever); start a task for that instead.

Everything is bounded: client messages wait for room in a 10 000-message outbox, a subscription
without a callback keeps at most 10 000 values (the oldest is dropped and counted in
``stats.dropped``; NAK tells the server at 50, 75, 87 and 100 %), and a streamed reply that is
not consumed pushes back on the reader.

Exceptions (all :class:`~rubris_asgi.errors.RubrisError`)::

    ConnectionLost       the connection or session is gone (also a builtin ConnectionError)
    CallError            a call answered with an error: .code, .message
    SubscribeRejected    SUBSCRIBE answered with REJECTED: .code, .reason
    SubscriptionEnded    the subscription is over (unsubscribed, or ended by the server)
    ProtocolError        the server sent something malformed (the client closes)
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import logging
import random
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeVar
from urllib.parse import quote, urlsplit, urlunsplit

import httpx
import orjson
from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.typing import Subprotocol

from .compression import inflate
from .errors import ErrorCode, ProtocolError, RubrisError
from .protocol import (
    SUBPROTOCOL,
    VERSION,
    Ack,
    Call,
    ClientMessage,
    Codec,
    Flow,
    Gap,
    Goodbye,
    Hello,
    Message,
    Mode,
    Nack,
    Nak,
    Ping,
    Pong,
    Publish,
    Push,
    Rejected,
    Result,
    Stream,
    Subscribe,
    Subscribed,
    Unsubscribe,
    Unsubscribed,
    Welcome,
    decode_frame,
    encode,
    iter_messages,
)

__all__ = [
    "CallError",
    "Client",
    "ClientStats",
    "ConnectionLost",
    "GapInfo",
    "PushInfo",
    "Rejection",
    "SubscribeRejected",
    "Subscription",
    "SubscriptionEnded",
    "State",
]

log = logging.getLogger("rubris_asgi.client")

T = TypeVar("T")

State = Literal["connecting", "open", "reconnecting", "closed"]

QUEUE_SIZE = 10_000
"""Values a subscription without a callback keeps; items a streamed reply buffers."""
OUTBOX_SIZE = 10_000
"""Client messages waiting to be sent before ``subscribe``/``call``/... wait for room."""
GAPS_KEPT = 1_000
"""``Subscription.gaps`` keeps the latest this many."""
NAK_LEVELS = (100, 87, 75, 50)
"""Fill percentages of a subscription queue at which NAK is sent (protocol.md section 8)."""

_OCTETS = "application/octet-stream"
_FRAME_HEADER = "Rubris-Frame"
_MAX_BATCH = 1 << 20  # largest client frame when the server announces no max_frame
_POLL_RETRIES = 5  # consecutive network failures of a poll before the connection counts as lost
_SLOW_RECONNECT = 1.0  # a connection that lived this long resets the backoff


# --------------------------------------------------------------------------- public values


@dataclass(frozen=True)
class PushInfo:
    """Where a pushed value came from."""

    name: str
    topic: int
    seq: int
    compressed: bool


@dataclass(frozen=True)
class GapInfo:
    """Messages ``start … start+count-1`` of ``name`` will never arrive."""

    name: str
    start: int
    count: int


@dataclass(frozen=True)
class Rejection:
    """A PUBLISH the server refused (``name`` is empty when the request is no longer known)."""

    req: int
    name: str
    code: int
    reason: str


@dataclass
class ClientStats:
    """Counters of what the client received.

    ``compressed`` counts messages that came COMPRESSED and ``bytes_saved`` what inflating them
    added; ``gaps`` counts GAP messages; ``dropped`` counts values a full subscription queue
    discarded; ``goodbye`` is the last GOODBYE as ``(code, reason)``; ``reconnects`` counts
    WELCOMEs after the first; ``flow`` is the fill of the last FLOW (0 before any).
    """

    frames: int = 0
    messages: int = 0
    bytes_in: int = 0
    compressed: int = 0
    bytes_saved: int = 0
    gaps: int = 0
    dropped: int = 0
    rejected: int = 0
    reconnects: int = 0
    flow: int = 0
    goodbye: tuple[int, str] | None = None


class ConnectionLost(RubrisError, ConnectionError):
    """The connection (or the session behind it) is gone; ``__cause__`` says why when known."""


class CallError(RubrisError):
    """A call answered with an error RESULT: ``code`` (protocol.md section 9) and ``message``."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"{message} (code {code})")
        self.code = code
        self.message = message


class SubscribeRejected(RubrisError):
    """SUBSCRIBE was answered with REJECTED: ``code`` and the server's ``reason``."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(f"{reason} (code {code})")
        self.code = code
        self.reason = reason


class SubscriptionEnded(RubrisError):
    """The subscription is over: ``code`` 0 when the client unsubscribed or closed, else the
    server's code (UNSUBSCRIBED or REJECTED on a re-subscribe) and ``reason``."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(f"{reason} (code {code})" if code else reason)
        self.code = code
        self.reason = reason


# --------------------------------------------------------------------------- internal signals


class _Lost(Exception):
    """The connection ended in a way a reconnect can repair."""


class _Fatal(Exception):
    """The connection ended in a way a reconnect cannot repair (auth, protocol, superseded)."""


class _Bye(Exception):
    """The server said GOODBYE."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(f"server said goodbye: {reason} (code {code})")
        self.code = code
        self.reason = reason


def _lost(message: str, cause: BaseException | None = None) -> ConnectionLost:
    exc = ConnectionLost(message)
    exc.__cause__ = cause
    return exc


# --------------------------------------------------------------------------- subscriptions


class Subscription:
    """One subscribed topic. Without a callback it is an async iterator of ``(value, PushInfo)``.

    The attributes mirror the latest SUBSCRIBED (``topic``, ``mode``, ``codec``, ``epoch``,
    ``head``, ``recovered``) and are updated in place when a reconnect subscribes again;
    ``last_seq`` is the latest sequence number received, ``gaps`` the GAPs seen (latest
    :data:`GAPS_KEPT`). Iteration ends when the subscription ends (``end_code``/``end_reason``
    say how); it raises :class:`ConnectionLost` when the client lost its connection for good.

    >>> async def show(sub: Subscription) -> None:  # doctest: +SKIP
    ...     value, info = await sub.get(timeout=5)
    ...     async for value, info in sub:
    ...         print(info.seq, value)
    """

    def __init__(
        self,
        client: Client,
        name: str,
        callback: Callable[[Any, PushInfo], Any] | None,
        params: bytes,
        on_gap: Callable[[GapInfo], Any] | None,
    ) -> None:
        self.name = name
        self.topic = 0
        self.mode = 0
        self.codec = 0
        self.epoch = 0
        self.head = 0
        self.recovered = False
        self.last_seq = 0
        self.gaps: list[GapInfo] = []
        self.active = False  # between SUBSCRIBED and the end, and not waiting for a re-subscribe
        self.end_code: int | None = None
        self.end_reason = ""
        self._client = client
        self._callback = callback
        self._on_gap = on_gap
        self._params = params
        self._queue: deque[tuple[Any, PushInfo]] = deque()
        self._wake = asyncio.Event()
        self._ended: BaseException | None = None
        self._wanted = True  # False once unsubscribe() (or a cancelled subscribe()) asked
        self._pending: asyncio.Future[None] | None = None  # subscribe() waiting for SUBSCRIBED
        self._unsub: asyncio.Future[None] | None = None  # unsubscribe() waiting
        self._acked = 0  # private topics: the last upto sent in an ACK
        self._unacked = 0  # private topics: messages since that ACK
        self._ack_due = False  # a duplicate came: the server may have missed our ACK
        self._nak_level = 0

    def __repr__(self) -> str:
        return (
            f"Subscription({self.name!r}, topic={self.topic}, mode={self.mode},"
            f" last_seq={self.last_seq}, ended={self.ended})"
        )

    @property
    def ended(self) -> bool:
        return self._ended is not None

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> tuple[Any, PushInfo]:
        try:
            return await self.get()
        except SubscriptionEnded:
            raise StopAsyncIteration from None

    async def get(self, timeout: float | None = None) -> tuple[Any, PushInfo]:
        """The next ``(value, PushInfo)``.

        Raises:
            asyncio.TimeoutError: nothing came within ``timeout`` seconds.
            SubscriptionEnded: the subscription is over and every value has been taken.
            ConnectionLost: the client lost its connection for good.
        """
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            if self._queue:
                item = self._queue.popleft()
                if self._nak_level and len(self._queue) * 2 < QUEUE_SIZE:
                    self._nak_level = 0
                return item
            if self._ended is not None:
                raise _copy(self._ended)
            self._wake.clear()
            if deadline is None:
                await self._wake.wait()
            else:
                await _within(self._wake.wait(), max(0.0, deadline - loop.time()))

    def qsize(self) -> int:
        """Values waiting to be taken."""
        return len(self._queue)

    # the client's side

    def _put(self, value: Any, info: PushInfo) -> int:
        """Queue a value (dropping the oldest when full); returns a NAK level to send or 0."""
        q = self._queue
        if len(q) >= QUEUE_SIZE:
            q.popleft()
            self._client.stats.dropped += 1
        q.append((value, info))
        self._wake.set()
        fill = len(q) * 100 // QUEUE_SIZE
        for level in NAK_LEVELS:
            if fill >= level:
                if level > self._nak_level:
                    self._nak_level = level
                    return level
                break
        return 0

    def _end(self, exc: BaseException) -> None:
        if self._ended is None:
            self._ended = exc
            if isinstance(exc, SubscriptionEnded):
                self.end_code = exc.code
                self.end_reason = exc.reason
            else:
                self.end_code = 0
                self.end_reason = str(exc)
        self.active = False
        self._wake.set()
        unsub, self._unsub = self._unsub, None
        if unsub is not None and not unsub.done():
            unsub.set_result(None)


def _copy(exc: BaseException) -> BaseException:
    """A fresh instance to raise, so that one stored error does not grow every traceback."""
    if isinstance(exc, SubscriptionEnded):
        return SubscriptionEnded(exc.code, exc.reason)
    if isinstance(exc, ConnectionLost):
        return _lost(str(exc), exc.__cause__)
    return exc


class _StreamBox:
    """Items of one streamed reply between the reader and the consumer; pushes back when full."""

    def __init__(self) -> None:
        self.items: deque[Any] = deque()
        self.readable = asyncio.Event()
        self.writable = asyncio.Event()
        self.done = False
        self.error: BaseException | None = None
        self.abandoned = False

    async def put(self, item: Any) -> None:
        while len(self.items) >= QUEUE_SIZE and not self.abandoned:
            self.writable.clear()
            await self.writable.wait()
        if not self.abandoned:
            self.items.append(item)
            self.readable.set()

    def finish(self, error: BaseException | None = None) -> None:
        if not self.done:
            self.done = True
            self.error = error
            self.readable.set()

    def abandon(self) -> None:
        self.abandoned = True
        self.writable.set()

    async def get(self) -> tuple[bool, Any]:
        while True:
            if self.items:
                item = self.items.popleft()
                self.writable.set()
                return True, item
            if self.done:
                if self.error is not None:
                    raise self.error
                return False, None
            self.readable.clear()
            await self.readable.wait()


# --------------------------------------------------------------------------- outbox


_Out = tuple[ClientMessage, bytes]


class _Outbox:
    """Client messages in send order, bounded; the writer takes them a frame at a time."""

    def __init__(self, maxsize: int = OUTBOX_SIZE) -> None:
        self.items: deque[_Out] = deque()
        self.maxsize = maxsize
        self.ready = asyncio.Event()
        self.room = asyncio.Event()
        self.room.set()
        self.closed: ConnectionLost | None = None

    def __len__(self) -> int:
        return len(self.items)

    async def put(self, item: _Out) -> None:
        while len(self.items) >= self.maxsize and self.closed is None:
            self.room.clear()
            await self.room.wait()
        if self.closed is not None:
            raise _copy(self.closed)
        self.put_nowait(item)

    def put_nowait(self, item: _Out) -> None:
        """Control messages (ACK, PING, NAK) skip the bound: they are few by construction."""
        if self.closed is None:
            self.items.append(item)
            self.ready.set()

    def push_front(self, items: list[_Out]) -> None:
        self.items.extendleft(reversed(items))
        if self.items:
            self.ready.set()

    def discard(self, kinds: tuple[type[Any], ...]) -> None:
        self.items = deque(i for i in self.items if not isinstance(i[0], kinds))
        self.room.set()

    async def take(self, limit: int) -> list[bytes]:
        """At least one message, then as many more as fit in ``limit`` bytes, in order."""
        while not self.items:
            self.ready.clear()
            await self.ready.wait()
        out: list[bytes] = []
        size = 0
        items = self.items
        while items:
            data = items[0][1]
            if out and size + len(data) > limit:
                break
            items.popleft()
            out.append(data)
            size += len(data)
        if len(items) < self.maxsize:
            self.room.set()
        return out

    def fail(self, exc: ConnectionLost) -> None:
        self.closed = exc
        self.items.clear()
        self.room.set()


# --------------------------------------------------------------------------- transports


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


# --------------------------------------------------------------------------- the client


class Client:
    """An asyncio client of one rubris session (see the module docstring).

    Args:
        url: the mount URL (``http://host:port/rubris``; ``ws://`` works too).
        transport: ``"websocket"`` or ``"longpoll"``.
        reconnect: reconnect with backoff and resume when the connection drops.
        ack_every: private topics are acknowledged after this many messages ...
        ack_interval: ... or after this many seconds, whichever comes first.
        max_inflated: the most bytes a COMPRESSED payload may inflate to (else the client
            closes with ProtocolError code 5).
        headers: extra HTTP headers for the handshake and every long-poll request.
        heartbeat: PING every WELCOME.heartbeat_ms on WebSocket and drop a connection silent
            for twice that.
        backoff: ``(first, most)`` seconds between reconnect attempts (doubling, with jitter).
        record: keep every received frame in :attr:`raw_frames` (for tests; unbounded).
        open_timeout: seconds for a connection attempt to reach WELCOME.
        poll_timeout: the read timeout of a long-poll GET (above the server's poll timeout).
        http_transport: an ``httpx`` transport for long-poll (e.g. ``httpx.MockTransport``).

    ``state`` is ``"connecting"``, ``"open"``, ``"reconnecting"`` or ``"closed"``; ``error``
    is what closed the client when it was not :meth:`close`.
    """

    def __init__(
        self,
        url: str,
        *,
        transport: Literal["websocket", "longpoll"] = "websocket",
        reconnect: bool = True,
        ack_every: int = 32,
        ack_interval: float = 0.2,
        max_inflated: int = 16 * 1024 * 1024,
        headers: Mapping[str, str] | None = None,
        heartbeat: bool = True,
        backoff: tuple[float, float] = (0.05, 2.0),
        record: bool = False,
        open_timeout: float = 10.0,
        poll_timeout: float = 60.0,
        http_transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        if transport not in ("websocket", "longpoll"):
            raise ValueError(f"transport: expected 'websocket' or 'longpoll', got {transport!r}")
        if ack_every < 1:
            raise ValueError(f"ack_every must be at least 1, got {ack_every}")
        if ack_interval <= 0:
            raise ValueError(f"ack_interval must be positive, got {ack_interval}")
        if not 0 < backoff[0] <= backoff[1]:
            raise ValueError(f"backoff: expected 0 < first <= most, got {backoff}")
        self.url = url
        self._ws_url, self._lp_url = _endpoints(url)
        self.transport: str = transport
        self.reconnect = reconnect
        self.ack_every = ack_every
        self.ack_interval = ack_interval
        self.max_inflated = max_inflated
        self.headers = dict(headers) if headers else None
        self.heartbeat = heartbeat
        self.backoff = backoff
        self.open_timeout = open_timeout
        self.poll_timeout = poll_timeout
        self._http_transport = http_transport

        self.state: State = "closed"
        self.session_id: str | None = None
        self.resumed = False
        self.welcome: Welcome | None = None
        self.error: BaseException | None = None
        self.stats = ClientStats()
        self.raw_frames: list[bytes] | None = [] if record else None
        self.rejections: deque[Rejection] = deque(maxlen=100)

        self._token = ""
        self._closing = False
        self._changed = asyncio.Event()
        self._outbox = _Outbox()
        self._runner: asyncio.Task[None] | None = None
        self._first: asyncio.Future[None] | None = None
        self._conn_tasks: list[asyncio.Task[None]] = []
        self._link: _Link | None = None  # the connection being served
        self._http: httpx.AsyncClient | None = None
        self._last_rx = 0.0
        self._busy = False

        self._reqs = itertools.count(1)
        self._call_ids = itertools.count(1)
        self._tokens = itertools.count(1)
        self._subs: dict[Subscription, None] = {}  # live subscriptions, in subscribe order
        self._topics: dict[int, Subscription] = {}
        self._sub_reqs: dict[int, Subscription] = {}
        self._pub_reqs: OrderedDict[int, str] = OrderedDict()
        self._calls: dict[int, asyncio.Future[Any]] = {}
        self._streams: dict[int, _StreamBox] = {}
        self._pings: dict[int, asyncio.Future[None]] = {}

    def __repr__(self) -> str:
        return f"Client({self.url!r}, transport={self.transport!r}, state={self.state!r})"

    # ------------------------------------------------------------------ lifecycle

    async def connect(self) -> None:
        """Connect and wait for WELCOME.

        Raises:
            ConnectionLost: the first attempt failed (its cause is chained); nothing is retried.
        """
        if self._runner is not None and not self._runner.done():
            raise RubrisError("connect() was already called; close() first")
        if self._outbox.closed is not None:  # a closed client starting again
            self._outbox = _Outbox()
        self._closing = False
        self.error = None
        self._token = ""  # a new connect() starts a new session
        self._set_state("connecting")
        loop = asyncio.get_running_loop()
        first: asyncio.Future[None] = loop.create_future()
        self._first = first
        self._runner = loop.create_task(self._run(), name="rubris-client-supervisor")
        try:
            await first
        except asyncio.CancelledError:
            await self.close()
            raise

    async def close(self) -> None:
        """Close the connection and cancel every task the client started (waiting for them).

        Calls, pings and streams still waiting fail with :class:`ConnectionLost`; subscriptions
        end. Safe to call twice, and from a callback (then it does not wait).
        """
        self._closing = True
        runner = self._runner
        if runner is not None and not runner.done():
            runner.cancel()
            me = asyncio.current_task()
            if me is not runner and me not in self._conn_tasks:
                # cancel again should a library have lost the cancellation (the runner also
                # checks _closing between steps)
                while not runner.done():
                    await asyncio.wait({runner}, timeout=5)
                    runner.cancel()
        self._finish(None)

    async def __aenter__(self) -> Client:
        await self.connect()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def wait_connected(self, timeout: float | None = None) -> None:
        """Wait until the state is ``"open"``.

        Raises:
            ConnectionLost: the client is closed.
            asyncio.TimeoutError: not open within ``timeout`` seconds.
        """
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            if self.state == "open":
                return
            if self.state == "closed":
                raise _lost("the client is closed", self.error)
            changed = self._changed
            if deadline is None:
                await changed.wait()
            else:
                await _within(changed.wait(), max(0.0, deadline - loop.time()))

    # ------------------------------------------------------------------ public operations

    async def subscribe(
        self,
        name: str,
        callback: Callable[[Any, PushInfo], Any] | None = None,
        *,
        params: Any = None,
        on_gap: Callable[[GapInfo], Any] | None = None,
    ) -> Subscription:
        """Subscribe to ``name`` and wait for SUBSCRIBED.

        ``callback(value, info)`` may be sync or async; it runs in the reader, in order. Without
        one, iterate the returned :class:`Subscription`. ``params`` is sent as JSON.

        Raises:
            SubscribeRejected: the server refused.
            RubrisError: this client already holds a subscription to ``name``.
            ConnectionLost: the client closed first.
        """
        for s in self._subs:
            if s.name == name and s._wanted:
                raise RubrisError(f"already subscribed to {name!r}; unsubscribe first")
        body = b"" if params is None else orjson.dumps(params)
        sub = Subscription(self, name, callback, body, on_gap)
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        sub._pending = fut
        req = next(self._reqs)
        self._subs[sub] = None
        self._sub_reqs[req] = sub
        try:
            await self._send(Subscribe(req, name, 0, 0, body))
            await fut
        except BaseException:
            sub._pending = None
            sub._wanted = False  # a SUBSCRIBED that still comes is answered with UNSUBSCRIBE
            if not sub.active:
                self._subs.pop(sub, None)
            raise
        return sub

    async def unsubscribe(self, sub: Subscription) -> None:
        """Unsubscribe and wait for UNSUBSCRIBED (or the end of the session)."""
        if sub._client is not self:
            raise ValueError("this subscription belongs to another client")
        if sub.ended:
            return
        if sub._unsub is None:
            sub._unsub = asyncio.get_running_loop().create_future()
        fut = sub._unsub
        if sub._wanted:
            sub._wanted = False
            if sub.active:
                await self._send(Unsubscribe(sub.topic))
            # else a (re-)SUBSCRIBE is in flight: its SUBSCRIBED is answered with UNSUBSCRIBE
        await fut

    async def call(self, method: str, args: Any = None, *, timeout: float | None = 30) -> Any:
        """Call ``method`` with ``args`` (JSON) and return its result.

        Raises:
            CallError: the method answered with an error.
            ConnectionLost: the session was lost before the answer.
            asyncio.TimeoutError: no answer within ``timeout`` seconds.
        """
        cid = next(self._call_ids)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._calls[cid] = fut
        try:
            await self._send(Call(cid, method, _dumps(args)))
            if timeout is None:
                return await fut
            return await _within(fut, timeout)
        finally:
            self._calls.pop(cid, None)

    async def stream(self, method: str, args: Any = None) -> AsyncIterator[Any]:
        """Call a streaming ``method``; yields its items as they arrive.

        Raises:
            CallError: the method answered with an error (after the items before it).
            ConnectionLost: the session was lost before the end.
        """
        cid = next(self._call_ids)
        box = _StreamBox()
        self._streams[cid] = box
        try:
            await self._send(Call(cid, method, _dumps(args)))
            while True:
                more, item = await box.get()
                if not more:
                    return
                yield item
        finally:
            box.abandon()
            self._streams.pop(cid, None)

    async def publish(self, name: str, value: Any) -> None:
        """PUBLISH ``value`` (JSON) to ``name``; a refusal arrives later in :attr:`rejections`."""
        req = next(self._reqs)
        self._pub_reqs[req] = name
        while len(self._pub_reqs) > 1024:
            self._pub_reqs.popitem(last=False)
        await self._send(Publish(req, name, orjson.dumps(value)))

    async def send_nak(self, fill: int) -> None:
        """Tell the server the client's inbound buffer is ``fill`` % full (50, 75, 87, 100)."""
        if not 0 <= fill <= 255:
            raise ValueError(f"fill must be 0-255, got {fill}")
        await self._send(Nak(fill))

    async def ping(self, timeout: float | None = 10) -> float:
        """Round trip in seconds of a PING and its PONG."""
        token = next(self._tokens)
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        self._pings[token] = fut
        try:
            start = loop.time()
            await self._send(Ping(token))
            await _within(fut, timeout)
            return loop.time() - start
        finally:
            self._pings.pop(token, None)

    # ------------------------------------------------------------------ sending

    async def _send(self, msg: ClientMessage) -> None:
        data = encode(msg)
        w = self.welcome
        if w is not None and w.max_frame and len(data) > w.max_frame:
            raise ProtocolError(
                f"{type(msg).__name__.upper()} of {len(data)} bytes is over the server's"
                f" max_frame of {w.max_frame}",
                ErrorCode.TOO_LARGE,
            )
        await self._outbox.put((msg, data))

    def _control(self, msg: ClientMessage) -> None:
        self._outbox.put_nowait((msg, encode(msg)))

    def _send_ack(self, sub: Subscription) -> None:
        self._control(Ack.private(sub.topic, sub.last_seq))
        sub._acked = sub.last_seq
        sub._unacked = 0
        sub._ack_due = False

    def _flush_acks(self) -> None:
        for sub in self._topics.values():
            if (
                sub.mode == Mode.PRIVATE
                and sub.last_seq
                and (sub.last_seq > sub._acked or sub._ack_due)
            ):
                self._send_ack(sub)

    # ------------------------------------------------------------------ supervisor

    def _set_state(self, state: State) -> None:
        self.state = state
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def _new_link(self) -> _Link:
        if self.transport == "websocket":
            return _WebSocketLink(self._ws_url, self.headers, 64 * 1024 * 1024, self.open_timeout)
        if self._http is None:
            self._http = httpx.AsyncClient(
                headers=self.headers,
                transport=self._http_transport,
                timeout=httpx.Timeout(self.open_timeout, read=self.poll_timeout),
            )
        return _LongPollLink(self._lp_url, self._http, self.backoff, self.open_timeout)

    async def _handshake(self, link: _Link) -> tuple[Welcome, list[Message]]:
        frame = await link.open(encode(Hello(VERSION, self._token)))
        self._account(frame)
        msgs = decode_frame(frame)
        self.stats.messages += len(msgs)
        if not msgs or not isinstance(msgs[0], Welcome):
            got = type(msgs[0]).__name__.upper() if msgs else "nothing"
            raise ProtocolError(f"expected WELCOME first, got {got}", ErrorCode.PROTOCOL)
        link.bind(msgs[0])
        return msgs[0], msgs[1:]

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        delay = self.backoff[0]
        initial = True
        error: BaseException | None = None
        try:
            while not self._closing:
                link = self._new_link()
                try:
                    try:
                        welcome, rest = await self._handshake(link)
                    except asyncio.CancelledError:
                        raise
                    except Exception as exc:
                        if (
                            initial
                            or not self.reconnect
                            or isinstance(exc, (_Fatal, ProtocolError))
                        ):
                            error = exc
                            break
                        log.debug("reconnect failed: %r", exc)
                        await link.aclose()
                        await self._sleep(delay)
                        delay = min(delay * 2, self.backoff[1])
                        continue
                    if self._closing:
                        break
                    self._on_welcome(welcome, initial)
                    if initial:
                        initial = False
                        if self._first is not None and not self._first.done():
                            self._first.set_result(None)
                    started = loop.time()
                    try:
                        await self._serve(link, rest)
                    except _Lost as exc:
                        log.debug("connection lost: %s", exc)
                        if not self.reconnect:
                            error = exc
                            break
                    except _Bye as exc:
                        # only a server going away and a slow consumer are worth another try
                        retry = exc.code in (ErrorCode.SLOW_CONSUMER, ErrorCode.SHUTTING_DOWN)
                        if not (retry and self.reconnect):
                            error = exc
                            break
                    except Exception as exc:  # ProtocolError, _Fatal, or a bug
                        error = exc
                        break
                finally:
                    await link.aclose()
                self._set_state("reconnecting")
                if loop.time() - started >= _SLOW_RECONNECT:
                    delay = self.backoff[0]
                await self._sleep(delay)
                delay = min(delay * 2, self.backoff[1])
        finally:
            self._conn_tasks = []
            http, self._http = self._http, None
            if http is not None:
                await http.aclose()
            self._finish(error)

    async def _sleep(self, delay: float) -> None:
        await asyncio.sleep(delay * (0.5 + random.random() / 2))

    def _on_welcome(self, w: Welcome, initial: bool) -> None:
        self.welcome = w
        self.session_id = w.session
        self.resumed = w.resumed
        self._token = w.resume
        if not initial:
            self.stats.reconnects += 1
            if not w.resumed:
                self._restart_session()
        self._set_state("open")

    def _restart_session(self) -> None:
        """A new session replaced the old one: fail what it owed, subscribe again."""
        why = "the session was not resumed after a reconnect"
        for fut in (*self._calls.values(), *self._pings.values()):
            if not fut.done():
                fut.set_exception(_lost(why))
        for box in self._streams.values():
            box.finish(_lost(why))
        self._topics.clear()
        self._sub_reqs.clear()
        self._outbox.discard((Subscribe, Unsubscribe, Ack, Nack))
        again: list[tuple[ClientMessage, bytes]] = []
        for sub in list(self._subs):
            sub.active = False
            if not sub._wanted:
                self._subs.pop(sub, None)
                sub._end(SubscriptionEnded(0, "unsubscribed"))
                continue
            epoch = since = 0
            if sub.mode in (Mode.RING, Mode.SNAPSHOT) and sub.epoch:
                epoch, since = sub.epoch, sub.last_seq
            elif sub.mode in (Mode.PRIVATE, Mode.QUEUE):
                sub.last_seq = sub._acked = sub._unacked = 0
                sub._ack_due = False
            req = next(self._reqs)
            self._sub_reqs[req] = sub
            msg = Subscribe(req, sub.name, epoch, since, sub._params)
            again.append((msg, encode(msg)))
        self._outbox.push_front(again)

    def _finish(self, error: BaseException | None) -> None:
        """The client is closed: fail every waiter, end every subscription."""
        if error is not None and self.error is None and not self._closing:
            # the internal signals are not part of the API: they become ConnectionLost
            self.error = _lost(str(error)) if isinstance(error, (_Lost, _Fatal, _Bye)) else error
        if self.state == "closed" and self._outbox.closed is not None:
            return
        if error is not None and not self._closing:
            message = f"connection lost: {error}"
        else:
            message = "the client is closed"
        cause = self.error
        first = self._first
        if first is not None and not first.done():
            first.set_exception(_lost(message, cause))
        self._outbox.fail(_lost(message, cause))
        for fut in (*self._calls.values(), *self._pings.values()):
            if not fut.done():
                fut.set_exception(_lost(message, cause))
        for box in self._streams.values():
            box.finish(_lost(message, cause))
        for sub in list(self._subs):
            if sub._pending is not None and not sub._pending.done():
                sub._pending.set_exception(_lost(message, cause))
            if self.error is not None:
                sub._end(_lost(message, cause))
            else:
                sub._end(SubscriptionEnded(0, "the client is closed"))
        self._subs.clear()
        self._topics.clear()
        self._sub_reqs.clear()
        self._set_state("closed")

    async def _serve(self, link: _Link, first: list[Message]) -> None:
        """Run one connection until it ends; raises why it ended."""
        loop = asyncio.get_running_loop()
        self._last_rx = loop.time()
        w = self.welcome
        assert w is not None
        tasks = [
            loop.create_task(self._reader(link, first), name="rubris-client-reader"),
            loop.create_task(self._writer(link, w.max_frame), name="rubris-client-writer"),
            loop.create_task(self._acker(), name="rubris-client-acks"),
        ]
        if self.transport == "websocket" and self.heartbeat and w.heartbeat_ms > 0:
            hb = loop.create_task(self._heartbeat(w.heartbeat_ms / 1000), name="rubris-client-hb")
            tasks.append(hb)
        self._conn_tasks = tasks
        self._link = link
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self._conn_tasks = []
            self._link = None
        for t in done:
            exc = t.exception()
            if exc is not None:
                raise exc
        raise _Lost("the connection ended")

    # ------------------------------------------------------------------ connection tasks

    async def _writer(self, link: _Link, max_frame: int) -> None:
        limit = max_frame or _MAX_BATCH
        while True:
            batch = await self._outbox.take(limit)
            await link.send(b"".join(batch))

    async def _acker(self) -> None:
        while True:
            await asyncio.sleep(self.ack_interval)
            self._flush_acks()

    async def _heartbeat(self, interval: float) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(interval)
            # a reader busy in a slow callback is our silence, not the server's
            if not self._busy and loop.time() - self._last_rx > 2 * interval:
                raise _Lost(f"nothing from the server for {2 * interval:.3g} s")
            self._control(Ping(next(self._tokens)))

    async def _reader(self, link: _Link, first: list[Message]) -> None:
        loop = asyncio.get_running_loop()
        for msg in first:
            await self._on_message(msg)
        while True:
            frame = await link.recv()
            self._last_rx = loop.time()
            self._account(frame)
            self._busy = True
            try:
                for msg in iter_messages(frame):
                    self.stats.messages += 1
                    await self._on_message(msg)
            finally:
                self._busy = False
                # frames that came while a slow callback ran are waiting to be read
                self._last_rx = loop.time()

    def _account(self, frame: bytes) -> None:
        st = self.stats
        st.frames += 1
        st.bytes_in += len(frame)
        if self.raw_frames is not None:
            self.raw_frames.append(frame)

    # ------------------------------------------------------------------ inbound messages

    async def _on_message(self, msg: Message) -> None:
        if isinstance(msg, Push):
            await self._on_push(msg)
        elif isinstance(msg, Result):
            await self._on_result(msg)
        elif isinstance(msg, Stream):
            await self._on_stream(msg)
        elif isinstance(msg, Subscribed):
            self._on_subscribed(msg)
        elif isinstance(msg, Rejected):
            self._on_rejected(msg)
        elif isinstance(msg, Unsubscribed):
            self._on_unsubscribed(msg)
        elif isinstance(msg, Gap):
            await self._on_gap(msg)
        elif isinstance(msg, Pong):
            fut = self._pings.get(msg.token)
            if fut is not None and not fut.done():
                fut.set_result(None)
        elif isinstance(msg, Goodbye):
            self.stats.goodbye = (msg.code, msg.reason)
            raise _Bye(msg.code, msg.reason)
        elif isinstance(msg, Flow):
            self.stats.flow = msg.fill
        else:
            raise ProtocolError(
                f"the server sent {type(msg).__name__.upper()}, which is not a server message",
                ErrorCode.PROTOCOL,
            )

    def _inflate(self, payload: bytes, compressed: bool) -> bytes:
        if not compressed:
            return payload
        data = inflate(payload, self.max_inflated)
        self.stats.compressed += 1
        self.stats.bytes_saved += len(data) - len(payload)
        return data

    async def _on_push(self, m: Push) -> None:
        sub = self._topics.get(m.topic)
        if sub is None:
            return  # unsubscribed meanwhile
        private = sub.mode == Mode.PRIVATE
        if private and m.seq <= sub.last_seq:
            sub._ack_due = True  # a replay after resume: ours already, but say so again
            return
        payload = self._inflate(m.payload, m.compressed)
        value = _decode(sub.codec, payload, sub.name)
        sub.last_seq = max(sub.last_seq, m.seq)
        info = PushInfo(sub.name, m.topic, m.seq, m.compressed)
        if sub._callback is not None:
            await _invoke(sub._callback, value, info, what=f"callback of {sub.name!r}")
        else:
            level = sub._put(value, info)
            if level:
                self._control(Nak(level))
        if private:
            sub._unacked += 1
            if sub._unacked >= self.ack_every:
                self._send_ack(sub)

    async def _on_result(self, m: Result) -> None:
        fut = self._calls.get(m.call)
        box = self._streams.get(m.call) if fut is None else None
        if fut is None and box is None:
            return  # timed out or abandoned
        payload = self._inflate(m.payload, m.compressed)
        if m.status == 0:
            value = _decode(Codec.JSON, payload, "RESULT")
            if fut is not None:
                if not fut.done():
                    fut.set_result(value)
            elif box is not None:
                if payload:
                    await box.put(value)
                box.finish()
            return
        err = _call_error(payload)
        if fut is not None:
            if not fut.done():
                fut.set_exception(err)
        elif box is not None:
            box.finish(err)

    async def _on_stream(self, m: Stream) -> None:
        box = self._streams.get(m.call)
        if box is None:
            return
        payload = self._inflate(m.payload, m.compressed)
        if payload or not m.last:
            await box.put(_decode(Codec.JSON, payload, "STREAM"))
        if m.last:
            box.finish()

    def _on_subscribed(self, m: Subscribed) -> None:
        sub = self._sub_reqs.pop(m.req, None)
        if sub is None:
            return
        if m.epoch != sub.epoch:
            # a new numbering: nothing held so far compares with it
            sub.last_seq = m.head if m.mode == Mode.RING else 0
            sub._acked = sub._unacked = 0
        sub.topic = m.topic
        sub.mode = m.mode
        sub.codec = m.codec
        sub.epoch = m.epoch
        sub.head = m.head
        sub.recovered = m.recovered
        self._topics[m.topic] = sub
        if not sub._wanted:
            self._control(Unsubscribe(m.topic))
        sub.active = True
        fut, sub._pending = sub._pending, None
        if fut is not None and not fut.done():
            fut.set_result(None)

    def _on_rejected(self, m: Rejected) -> None:
        sub = self._sub_reqs.pop(m.req, None)
        if sub is not None:
            self._subs.pop(sub, None)
            fut, sub._pending = sub._pending, None
            if fut is not None and not fut.done():
                fut.set_exception(SubscribeRejected(m.code, m.reason))
            sub._end(SubscriptionEnded(m.code, m.reason))
            return
        self.stats.rejected += 1
        self.rejections.append(Rejection(m.req, self._pub_reqs.pop(m.req, ""), m.code, m.reason))
        log.warning("request %d refused: %s (code %d)", m.req, m.reason, m.code)

    def _on_unsubscribed(self, m: Unsubscribed) -> None:
        sub = self._topics.pop(m.topic, None)
        if sub is None:
            return
        self._subs.pop(sub, None)
        if m.code == 0:
            sub._end(SubscriptionEnded(0, "unsubscribed"))
        else:
            sub._end(SubscriptionEnded(m.code, m.reason))

    async def _on_gap(self, m: Gap) -> None:
        sub = self._topics.get(m.topic)
        if sub is None:
            return
        info = GapInfo(sub.name, m.start, m.count)
        sub.gaps.append(info)
        if len(sub.gaps) > GAPS_KEPT:
            del sub.gaps[: len(sub.gaps) - GAPS_KEPT]
        self.stats.gaps += 1
        if m.count:
            sub.last_seq = max(sub.last_seq, m.start + m.count - 1)
        if sub._on_gap is not None:
            await _invoke(sub._on_gap, info, what=f"on_gap of {sub.name!r}")


# --------------------------------------------------------------------------- helpers


async def _within(aw: Awaitable[T], timeout: float | None) -> T:
    """``asyncio.wait_for`` without its Python < 3.12 flaw: when the awaited thing finishes just
    as the caller is cancelled, ``wait_for`` returns and the cancellation is lost (this made
    ``close()`` hang during a reconnect). ``asyncio.wait`` never loses it."""
    task = asyncio.ensure_future(aw)
    try:
        done, _ = await asyncio.wait({task}, timeout=timeout)
    except asyncio.CancelledError:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        raise
    if not done:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        raise asyncio.TimeoutError
    return task.result()


def _dumps(args: Any) -> bytes:
    return b"" if args is None else orjson.dumps(args)


def _decode(codec: int, payload: bytes, what: str) -> Any:
    if codec == Codec.JSON:
        if not payload:
            return None
        try:
            return orjson.loads(payload)
        except orjson.JSONDecodeError as exc:
            raise ProtocolError(f"{what}: payload is not JSON: {exc}", ErrorCode.PROTOCOL) from None
    if codec == Codec.TEXT:
        try:
            return payload.decode()
        except UnicodeDecodeError as exc:
            raise ProtocolError(
                f"{what}: payload is not UTF-8: {exc}", ErrorCode.PROTOCOL
            ) from None
    return payload  # BYTES, and codecs this client does not know


def _call_error(payload: bytes) -> CallError:
    try:
        body = orjson.loads(payload) if payload else None
    except orjson.JSONDecodeError:
        body = None
    if isinstance(body, dict):
        code = body.get("code", 0)
        return CallError(code if isinstance(code, int) else 0, str(body.get("message", "")))
    return CallError(0, payload.decode("utf-8", "replace"))


async def _invoke(fn: Callable[..., Any], *args: Any, what: str) -> None:
    """Run an application callback, sync or async; its errors are logged, never raised."""
    try:
        result = fn(*args)
        if inspect.isawaitable(result):
            await result
    except asyncio.CancelledError:
        raise
    except Exception:
        log.exception("%s failed", what)
