"""The Client: construction, lifecycle, public operations, sending.

How it keeps its connection (the supervisor and the connection tasks: reader, writer, ACKs,
heartbeat) is the ``_Supervisor`` mixin of :mod:`.supervisor`; what it does with each server
message is the ``_ServerMessages`` mixin of :mod:`.handlers`; what it PUBLISHes (``publish``,
``enqueue``, ``enqueue_many``) is the ``_Producing`` mixin of :mod:`.producing`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Callable, Mapping
from typing import TYPE_CHECKING, Any, Literal

import orjson

from ..control.codel import CoDel
from ..control.ratelimit import RateLimiter
from ..errors import ErrorCode, ProtocolError, RubrisError
from ..protocol import (
    Ack,
    Call,
    ClientMessage,
    Mode,
    Nak,
    Ping,
    Subscribe,
    Unsubscribe,
    Welcome,
    encode,
)
from .batches import watch_batch as _watch_batch
from .concurrency import _within
from .consumer import Consumer, QueueItem, _Settler
from .errors import _lost
from .following import _Following
from .handlers import _ServerMessages
from .links import _endpoints, _Link
from .outbox import _Outbox
from .outcomes import Rejection, _Outcomes, _RefusalLog
from .payloads import _dumps
from .presence import Presence
from .producing import _Producing
from .stats import ClientStats
from .subscription import GapInfo, PushInfo, Subscription, _StreamBox, _Topic
from .supervisor import State, _Supervisor
from .tables import TableSubscription, _rate_params

if TYPE_CHECKING:  # httpx is imported by the first long-poll connection (supervisor._new_link)
    import httpx

__all__ = ["Client", "ClientStats", "Rejection", "State"]

CLOSE_FLUSH = 1.0
"""Seconds ``close()`` waits for what was handed over (PUBLISHes, ACKs) to be written."""


class Client(_Supervisor, _ServerMessages, _Producing, _Following):
    """An asyncio client of one rubris session (see the :mod:`rubris_asgi.client` docstring).

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
        clock: the monotonic clock of ``QueueItem.received`` and client-side CoDel, in seconds
            (default ``time.monotonic``; tests pass one they move by hand).
        on_refused: called with each :class:`Rejection` of a :meth:`publish` the server
            refused (sync or async, in the reader, in order; its errors are logged). The
            refusals of :meth:`enqueue` are raised to its caller instead.

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
        clock: Callable[[], float] | None = None,
        on_refused: Callable[[Rejection], Any] | None = None,
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
        self._clock: Callable[[], float] = clock or time.monotonic

        self.state: State = "closed"
        self.session_id: str | None = None
        self.resumed = False
        self.welcome: Welcome | None = None
        self.error: BaseException | None = None
        self.stats = ClientStats()
        self.publish_limiter = RateLimiter()
        """Paces :meth:`publish` and :meth:`enqueue` by the server's FLOW messages (the fill
        of the intake, or of the queue enqueued to)."""
        self.raw_frames: list[bytes] | None = [] if record else None
        self.rejections: deque[Rejection] = deque(maxlen=100)
        """The last 100 refusals of :meth:`publish` (``on_refused`` is told every one)."""
        self.on_refused = on_refused

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
        self._watchers = 0  # tasks in wait_closed(): they are told why the client gave up

        self._reqs = itertools.count(1)
        self._call_ids = itertools.count(1)
        self._tokens = itertools.count(1)
        self._subs: dict[_Topic, None] = {}  # live subscriptions and consumers, in order
        self._topics: dict[int, _Topic] = {}
        self._sub_reqs: dict[int, _Topic] = {}
        self._restating: dict[int, _Topic] = {}  # SUBSCRIBEs of the last resuming HELLO frame
        self._settler = _Settler(self._control)  # queue ACKs and NACKs; numbers connections
        self._workers: set[asyncio.Task[None]] = set()  # consumers' handler tasks
        self._pub_reqs: OrderedDict[int, tuple[str, Any]] = OrderedDict()
        self._outcomes = _Outcomes(self._outcome_ping)  # what enqueue() waits for
        self._refusals = _RefusalLog()
        self._calls: dict[int, asyncio.Future[Any]] = {}
        self._call_methods: dict[int, str] = {}  # by call id: what its CallError names
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
            self._outcomes = _Outcomes(self._outcome_ping)
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
        and consumers end, and consumers' handlers are cancelled (the server takes back the items
        not acknowledged: to finish the item in hand first, ``await consumer.close()`` before).
        Safe to call twice, and from a callback or handler (then it does not wait for that one).

        What was handed over before goes out first, on an open connection: the PUBLISHes of
        :meth:`publish`, the ACKs of items already settled (a handler that returned), waiting
        at most ``CLOSE_FLUSH`` (1 s) for the writer.
        """
        if self.state == "open" and self._link is not None and not self._closing:
            self._settler.flush()  # the ACKs of this loop turn, due at its end
            if not self._outbox.idle.is_set():
                with contextlib.suppress(asyncio.TimeoutError):
                    await _within(self._outbox.idle.wait(), CLOSE_FLUSH)
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
        me = asyncio.current_task()
        workers = [t for t in self._workers if t is not me]
        if workers:  # consumers' handlers, cancelled by _finish
            await asyncio.wait(workers)

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

    async def wait_closed(self) -> None:
        """Wait until the client is closed: by :meth:`close` (then return), or by itself, when it
        gave up on the connection (a refusal for good, or ``reconnect=False`` and a drop).

        A program that only serves callbacks and consumers waits on this rather than on an
        event that never comes, so that a client that gave up ends it, with the reason.

        Raises:
            ConnectionLost: the client closed by itself; ``__cause__`` says why.
        """
        self._watchers += 1
        try:
            while self.state != "closed":
                await self._changed.wait()
        finally:
            self._watchers -= 1
        if self.error is not None:
            raise _lost(f"the client gave up: {self.error}", self.error)

    # ------------------------------------------------------------------ public operations

    async def subscribe(
        self,
        name: str,
        callback: Callable[[Any, PushInfo], Any] | None = None,
        *,
        params: Any = None,
        on_gap: Callable[[GapInfo], Any] | None = None,
        last: int | None = None,
        max_rate: float | None = None,
    ) -> Subscription:
        """Subscribe to ``name`` and wait for SUBSCRIBED.

        ``callback(value, info)`` may be sync or async; it runs in the reader, in order. Without
        one, iterate the returned :class:`Subscription`. ``params`` is sent as JSON.

        ``last=n`` (a late joiner, protocol.md section 5): on a ring topic the server first
        delivers the last ``n`` messages its ring holds (all of them if it holds fewer), oldest
        first, then the new ones. It is sent as ``{"last": n}`` merged into ``params`` (which
        must then be a dict, or None), and only until the first SUBSCRIBED: a later
        re-subscribe (a new session after a reconnect) goes on from the last seq received
        instead. A snapshot topic ignores it (its value comes anyway); on a private topic the
        application's subscribe handler sees it among its params.

        ``max_rate=r`` (protocol.md section 5b), on a snapshot topic: after the first value,
        at most one value every 1/r s, the latest each time. Sent as ``{"max_rate": r}``
        merged into ``params`` (which must then be a dict, or None), on every SUBSCRIBE; the
        server refuses it on other kinds of topic (code 1).

        On a resumed session the client restates where each ring topic stands (SUBSCRIBE with
        ``epoch`` and ``last_seq``, in the frame of the resuming HELLO); the server replays
        what it still holds after that, with a GAP first (to ``on_gap``) for what it lost.
        Nothing is delivered twice: a ring message at or below ``last_seq`` is dropped.

        Raises:
            SubscribeRejected: the server refused.
            RubrisError: this client already holds a subscription to ``name``.
            ConnectionLost: the client closed first.
            ValueError: ``last`` is not an integer of at least 1, ``max_rate`` not a finite
                number above 0.
            TypeError: ``last`` or ``max_rate`` with ``params`` that are not a dict (a JSON
                object).
        """
        first: bytes | None = None
        n = 0
        if last is not None and (isinstance(last, bool) or not isinstance(last, int) or last < 1):
            raise ValueError(f"last must be an integer of at least 1, got {last!r}")
        rate = _rate_params(max_rate)
        for asked, given in (("last", last), ("max_rate", max_rate)):
            if given is not None and params is not None and not isinstance(params, dict):
                kind = type(params).__name__
                raise TypeError(f"{asked} needs params that are a JSON object (a dict), got {kind}")
        if rate:  # on every SUBSCRIBE, unlike ``last``
            params = {**(params or {}), **rate}
        if last is not None:
            n = last
            first = orjson.dumps({**(params or {}), "last": last})
        self._check_free(name)
        body = b"" if params is None else orjson.dumps(params)
        sub = Subscription(self.stats, name, callback, body, on_gap, n, first)
        await self._subscribe(sub)
        return sub

    async def consume(
        self,
        name: str,
        handler: Callable[[QueueItem], Any] | None = None,
        *,
        prefetch: int | None = None,
        codel_target: float | None = 0.020,
        codel_interval: float = 0.100,
    ) -> Consumer:
        """Consume the queue topic ``name`` (one of its competing consumers); wait for SUBSCRIBED.

        Without ``handler``, iterate the returned :class:`Consumer` and settle each
        :class:`QueueItem` with ``item.ack()`` or ``item.nack()``. With one, ``handler(item)``
        (sync or async) gets the items one at a time, in its own task; the item is ACKed when
        it returns and NACKed with requeue when it raises (unless it settled the item itself).
        See :mod:`rubris_asgi.client.consumer` for batching, CoDel, REVOKE and reconnects.

        Args:
            prefetch: the most unacknowledged items the server may hand this consumer (sent as
                SUBSCRIBE params ``{"prefetch": n}``; the server refuses one over its maximum);
                None lets the server size it from the round trip and processing time.
            codel_target: client-side CoDel's target sojourn in the local buffer, seconds (None
                turns client-side CoDel off) ...
            codel_interval: ... and its interval: about the worst processing time of one item.

        Raises:
            SubscribeRejected: the server refused (code 0: ``name`` is not a queue topic).
            RubrisError: this client already holds a subscription to ``name``.
            ConnectionLost: the client closed first.
            ValueError: ``prefetch`` below 1, or CoDel settings not above 0.
        """
        if prefetch is not None and prefetch < 1:
            raise ValueError(f"prefetch must be at least 1, got {prefetch}")
        codel = None if codel_target is None else CoDel(codel_target, codel_interval)
        self._check_free(name)
        body = b"" if prefetch is None else orjson.dumps({"prefetch": prefetch})
        consumer = Consumer(
            self.stats,
            name,
            handler,
            body,
            prefetch,
            codel,
            self._settler,
            self._clock,
            self._leave,
        )
        await self._subscribe(consumer)
        if handler is not None:
            consumer._start(self._workers)
        return consumer

    async def watch_batch(
        self,
        batch: str,
        *,
        on_update: Callable[[dict[str, Any]], Any] | None = None,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """Follow ``batch.{batch}`` until the batch completes or expires; return that state.

        ``on_update(state)`` (sync or async) gets every state, the first and last included.
        Raises ``SubscribeRejected`` (code 3: unknown batch) and ``asyncio.TimeoutError``;
        always unsubscribes. :func:`~.batches.watch_batch` tells the rest."""
        return await _watch_batch(self, batch, on_update=on_update, timeout=timeout)

    def _check_free(self, name: str) -> None:
        for s in self._subs:
            if s.name == name and s._wanted:
                raise RubrisError(f"already subscribed to {name!r}; unsubscribe first")

    async def _subscribe(self, sub: _Topic) -> None:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        sub._pending = fut
        req = next(self._reqs)
        self._subs[sub] = None
        self._sub_reqs[req] = sub
        try:
            await self._send(Subscribe(req, sub.name, 0, 0, sub._subscribe_params()))
            await fut
        except BaseException:
            sub._pending = None
            sub._wanted = False  # a SUBSCRIBED that still comes is answered with UNSUBSCRIBE
            if not sub.active:
                self._subs.pop(sub, None)
            raise

    async def unsubscribe(
        self, sub: Subscription | Consumer | TableSubscription | Presence
    ) -> None:
        """Unsubscribe and wait for UNSUBSCRIBED (or the end of the session).

        For a :class:`Consumer` this is :meth:`Consumer.close`; a table or presence keeps
        what it held.
        """
        if sub._stats is not self.stats:  # each client has its own, for good
            raise ValueError("this subscription belongs to another client")
        if isinstance(sub, Consumer):
            await sub.close()
        elif not sub.ended:
            await asyncio.shield(self._leave(sub))

    def _leave(self, sub: _Topic) -> asyncio.Future[None]:
        """Send UNSUBSCRIBE (once); the future is done at UNSUBSCRIBED or the end."""
        if sub._unsub is None:
            sub._unsub = asyncio.get_running_loop().create_future()
        fut = sub._unsub
        if sub.ended:
            if not fut.done():
                fut.set_result(None)
        elif sub._wanted:
            sub._wanted = False
            if sub.active:
                self._control(Unsubscribe(sub.topic))
            # else a (re-)SUBSCRIBE is in flight: its SUBSCRIBED is answered with UNSUBSCRIBE
        return fut

    async def call(self, method: str, args: Any = None, *, timeout: float | None = 30) -> Any:
        """Call ``method`` with ``args`` (JSON) and return its result.

        Raises:
            CallError: the method answered with an error.
            ConnectionLost: the session was lost before the answer.
            asyncio.TimeoutError: no answer within ``timeout`` seconds.
        """
        cid = next(self._call_ids)
        payload = _dumps(args, method)  # a value that is not JSON fails here, named
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._calls[cid] = fut
        self._call_methods[cid] = method
        try:
            await self._send(Call(cid, method, payload))
            if timeout is None:
                return await fut
            return await _within(fut, timeout)
        finally:
            self._calls.pop(cid, None)
            self._call_methods.pop(cid, None)

    async def stream(self, method: str, args: Any = None) -> AsyncIterator[Any]:
        """Call a streaming ``method``; yields its items as they arrive.

        Raises:
            CallError: the method answered with an error (after the items before it).
            ConnectionLost: the session was lost before the end.
        """
        cid = next(self._call_ids)
        payload = _dumps(args, method)
        box = _StreamBox()
        self._streams[cid] = box
        self._call_methods[cid] = method
        try:
            await self._send(Call(cid, method, payload))
            while True:
                more, item = await box.get()
                if not more:
                    return
                yield item
        finally:
            box.abandon()
            self._streams.pop(cid, None)
            self._call_methods.pop(cid, None)

    # What the end of a connection, and of the client, means for enqueue()'s outcomes
    # (producing.py): here rather than in _Producing because they extend the supervisor's.

    def _connection_lost(self) -> None:
        super()._connection_lost()
        outcomes = self._outcomes
        if outcomes.waiting or outcomes.barriers:
            reqs, tokens = self._unsent()
            outcomes.lost(reqs, tokens, "the connection was lost after its PUBLISH was sent")

    def _finish(self, error: BaseException | None) -> None:
        outcomes = self._outcomes
        unsent = self._unsent()[0] if outcomes.waiting else set()
        super()._finish(error)
        if outcomes.waiting:
            why = "the client is closed" if self._closing else f"connection lost: {self.error}"
            outcomes.close(unsent, why, self.error)
        self._refusals.close()

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
                isinstance(sub, Subscription)
                and sub.mode == Mode.PRIVATE
                and sub.last_seq
                and (sub.last_seq > sub._acked or sub._ack_due)
            ):
                self._send_ack(sub)
