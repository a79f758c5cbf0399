"""How the client keeps its connection: the ``_Supervisor`` mixin of Client.

The supervisor opens a connection, says HELLO, waits for WELCOME, serves the connection with
its tasks (reader, writer, ACK timer, heartbeat), reconnects and resumes or restarts the session
when it drops, and at the end fails whatever still waits.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, Literal

from ..errors import ErrorCode, ProtocolError
from ..protocol import (
    VERSION,
    Ack,
    ClientMessage,
    Goodbye,
    Hello,
    Message,
    Mode,
    Nack,
    Ping,
    Subscribe,
    Unsubscribe,
    Welcome,
    decode_frame,
    encode,
    iter_messages,
)
from .consumer import Consumer, _Settler
from .errors import SubscriptionEnded, _Bye, _Fatal, _Lost, _lost
from .links import _Link, _NotNow
from .outbox import _Outbox
from .stats import ClientStats
from .subscription import Subscription, _StreamBox, _Topic
from .tables import _since, _Table

if TYPE_CHECKING:  # httpx is imported by the first long-poll connection (see _new_link)
    import httpx

__all__ = ["State"]

log = logging.getLogger("rubris_asgi.client")

State = Literal["connecting", "open", "reconnecting", "closed"]

_MAX_BATCH = 1 << 20  # largest client frame when the server announces no max_frame
_SLOW_RECONNECT = 1.0  # a connection that lived this long resets the backoff


class _Outage:
    """A connection lost and not back yet: since when, and the attempts made."""

    def __init__(self) -> None:
        self.since: float | None = None
        self.attempts = 0


class _Supervisor:
    """The connections of a client, one after the other; mixed into :class:`~.core.Client`.

    :meth:`_run` is the supervisor task that ``connect()`` starts; :meth:`_serve` runs one
    connection's tasks until it ends; :meth:`_finish` closes the client. The attributes and
    methods below are the Client's, declared here for the type checker.
    """

    url: str
    transport: str
    reconnect: bool
    ack_interval: float
    headers: dict[str, str] | None
    heartbeat: bool
    backoff: tuple[float, float]
    open_timeout: float
    poll_timeout: float
    state: State
    session_id: str | None
    resumed: bool
    welcome: Welcome | None
    error: BaseException | None
    stats: ClientStats
    raw_frames: list[bytes] | None
    _ws_url: str
    _lp_url: str
    _http_transport: httpx.AsyncBaseTransport | None
    _token: str
    _closing: bool
    _changed: asyncio.Event
    _outbox: _Outbox
    _first: asyncio.Future[None] | None
    _conn_tasks: list[asyncio.Task[None]]
    _link: _Link | None
    _http: httpx.AsyncClient | None
    _last_rx: float
    _busy: bool
    _watchers: int
    _reqs: itertools.count[int]
    _tokens: itertools.count[int]
    _subs: dict[_Topic, None]
    _topics: dict[int, _Topic]
    _sub_reqs: dict[int, _Topic]
    _restating: dict[int, _Topic]
    _settler: _Settler
    _calls: dict[int, asyncio.Future[Any]]
    _streams: dict[int, _StreamBox]
    _pings: dict[int, asyncio.Future[None]]
    _control: Callable[[ClientMessage], None]
    _flush_acks: Callable[[], None]
    _on_message: Callable[[Message], Coroutine[Any, Any, None]]

    # ------------------------------------------------------------------ supervisor

    def _set_state(self, state: State) -> None:
        self.state = state
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def _new_link(self) -> _Link:
        # The carrier's module, and with it websockets or httpx, is imported here rather than at
        # the top: `import rubris_asgi.client` then loads neither (see .links).
        if self.transport == "websocket":
            from .websocket import _WebSocketLink

            return _WebSocketLink(self._ws_url, self.headers, 64 * 1024 * 1024, self.open_timeout)
        from .longpoll import _http_client, _LongPollLink

        if self._http is None:
            self._http = _http_client(
                self.headers, self._http_transport, self.open_timeout, self.poll_timeout
            )
        return _LongPollLink(self._lp_url, self._http, self.backoff, self.open_timeout)

    def _hello_frame(self) -> bytes:
        """HELLO, and when it resumes, a SUBSCRIBE per ring and keyed topic held, in the same
        frame.

        A resumed session's ring topics go on from what the client holds, not from what the
        server wrote to the lost connection (protocol.md section 5, "Resume is exact"): the
        server answers each SUBSCRIBE with SUBSCRIBED (``recovered``) and replays from
        ``last_seq + 1``, a GAP first for what its ring lost, before anything newer. A keyed
        topic the same way from its table's seq (section 5b): the keys changed since, or RESET
        and the whole table. In the HELLO's frame, because the server holds the session's rings
        and tables back only until that frame has been handled. Should the server start a new
        session instead, these SUBSCRIBEs are its re-subscriptions (:meth:`_restart_session`
        does not repeat them). Snapshot, private and queue topics are not restated: the server
        keeps their state itself.
        """
        for req in self._restating:  # an earlier attempt's, never answered on a live connection
            self._sub_reqs.pop(req, None)
        self._restating = {}
        data = [encode(Hello(VERSION, self._token))]
        if not self._token:
            return data[0]
        for sub in self._subs:
            positioned = isinstance(sub, _Table) or (
                isinstance(sub, Subscription) and sub.mode == Mode.RING
            )
            if positioned and sub.active and sub._wanted and sub.epoch:
                req = next(self._reqs)
                self._sub_reqs[req] = sub
                self._restating[req] = sub
                data.append(encode(Subscribe(req, sub.name, sub.epoch, _since(sub), sub._params)))
        return b"".join(data)

    async def _handshake(self, link: _Link) -> tuple[Welcome, list[Message]]:
        frame = await link.open(self._hello_frame())
        self._account(frame)
        msgs = decode_frame(frame)
        self.stats.messages += len(msgs)
        if msgs and isinstance(msgs[0], Goodbye):  # refused before WELCOME, with a reason
            bye = msgs[0]
            if bye.code in (ErrorCode.SHUTTING_DOWN, ErrorCode.SLOW_CONSUMER, ErrorCode.TOO_MANY):
                raise _NotNow(
                    f"the server refused the session for now: {bye.reason} (code {bye.code})"
                )
            raise _Fatal(f"the server refused the session: {bye.reason} (code {bye.code})")
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
        outage = _Outage()  # since the connection was lost: what the log says
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
                        outage.attempts += 1
                        log.debug(
                            "%s: reconnect attempt %d failed: %s", self.url, outage.attempts, exc
                        )
                        await link.aclose()
                        await self._sleep(delay, exc)
                        delay = min(delay * 2, self.backoff[1])
                        continue
                    if self._closing:
                        break
                    self._on_welcome(welcome, initial)
                    if initial:
                        initial = False
                        if self._first is not None and not self._first.done():
                            self._first.set_result(None)
                    elif outage.since is not None:
                        log.info(
                            "rubris client %s: reconnected after %.1f s (%d attempts), %s",
                            self.url,
                            loop.time() - outage.since,
                            outage.attempts + 1,
                            "session resumed" if welcome.resumed else "new session",
                        )
                        outage = _Outage()
                    started = loop.time()
                    why: BaseException
                    try:
                        await self._serve(link, rest)
                    except _Lost as exc:
                        why = exc
                        if not self.reconnect:
                            error = exc
                            break
                    except _Bye as exc:
                        why = exc
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
                if self._closing:
                    break
                # one line per outage, whatever the number of attempts: what happened and what
                # the client does about it (each attempt is a DEBUG line)
                outage.since = loop.time()
                log.warning(
                    "rubris client %s: connection lost (%s); reconnecting, every %g to %g s",
                    self.url,
                    why,
                    self.backoff[0],
                    self.backoff[1],
                )
                if loop.time() - started >= _SLOW_RECONNECT:
                    delay = self.backoff[0]
                await self._sleep(delay, why)
                delay = min(delay * 2, self.backoff[1])
        finally:
            self._conn_tasks = []
            http, self._http = self._http, None
            if http is not None:
                await http.aclose()
            if error is not None and not (initial or self._closing or self._watchers):
                # nobody awaits this (connect() raises the first failure, wait_closed() every
                # other): say it, or a program would go on without its connection, silent
                log.error("rubris client %s: giving up: %s", self.url, error)
            self._finish(error)

    async def _sleep(self, delay: float, why: BaseException | None = None) -> None:
        """Wait ``delay`` with jitter (half to all of it, so that clients dropped together do
        not come back together), and at least what the server asked for (``Retry-After``)."""
        pause = delay * (0.5 + random.random() / 2)
        if isinstance(why, _NotNow) and why.retry_after is not None:
            pause = max(pause, why.retry_after * (1 + random.random() / 4))
        await asyncio.sleep(pause)

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
        # the rings restated in the HELLO's frame are the new session's subscriptions already
        restated = set(self._restating.values())
        self._sub_reqs.update(self._restating)
        self._outbox.discard((Subscribe, Unsubscribe, Ack, Nack))
        again: list[tuple[ClientMessage, bytes]] = []
        for sub in list(self._subs):
            sub.active = False
            if sub in restated:
                # its SUBSCRIBED will come; unwanted by then, it is answered with UNSUBSCRIBE
                continue
            if not sub._wanted:
                self._subs.pop(sub, None)
                sub._end(SubscriptionEnded(0, "unsubscribed"))
                continue
            epoch = since = 0
            if isinstance(sub, Subscription):
                if sub.mode in (Mode.RING, Mode.SNAPSHOT) and sub.epoch:
                    epoch, since = sub.epoch, sub.last_seq
                elif sub.mode == Mode.PRIVATE:
                    sub.last_seq = sub._acked = sub._unacked = 0
                    sub._ack_due = False
            elif isinstance(sub, _Table) and sub.epoch:
                # what the table holds: the new session sends what changed since, or RESET
                epoch, since = sub.epoch, sub.table.seq
            # a Consumer asks afresh with the same params (its prefetch); the server took back
            # what it held when the connection was lost, and _connection_lost emptied its buffer
            req = next(self._reqs)
            self._sub_reqs[req] = sub
            msg = Subscribe(req, sub.name, epoch, since, sub._subscribe_params())
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
            if isinstance(sub, Consumer):
                sub._cancel()
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
            self._connection_lost()
        for t in done:
            exc = t.exception()
            if exc is not None:
                raise exc
        raise _Lost("the connection ended")

    def _connection_lost(self) -> None:
        """The server takes back every queue item outstanding on a lost connection (even when
        the session is resumed): forget them, and any ACK or NACK of them not sent yet."""
        self._settler.new_connection()
        queues = set()
        for number, sub in self._topics.items():
            if isinstance(sub, Consumer):
                queues.add(number)
                sub._connection_lost()
        if queues:
            self._outbox.discard_where(
                lambda msg: isinstance(msg, Nack) or (isinstance(msg, Ack) and msg.topic in queues)
            )

    # ------------------------------------------------------------------ connection tasks

    async def _writer(self, link: _Link, max_frame: int) -> None:
        limit = max_frame or _MAX_BATCH
        outbox = self._outbox
        while True:
            batch = await outbox.take(limit)
            await link.send(b"".join(batch))
            outbox.written()

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
