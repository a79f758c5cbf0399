"""What the server does with each client message, whatever the transport.

Transports decode a frame, settle HELLO themselves (it decides the session), and hand every other
message here. A ``ProtocolError`` raised from here means the frame was bad: the transport answers
with GOODBYE and a close (WebSocket) or HTTP 400 (long-poll); application refusals never raise,
they become REJECTED or an error RESULT for that request alone.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Iterable, Mapping
from typing import Any

import orjson

from ..cluster import Broker, LocalBroker
from ..config import Config
from ..control.budget import Budget
from ..engine.channels import Channel, Registry
from ..engine.engine import Engine
from ..engine.flow import on_nak
from ..engine.keyed.presence import COUNT
from ..engine.keyed.topic import KeyedTopic
from ..engine.queues import QueueTopic
from ..engine.session import Session, SessionState
from ..errors import (
    BrokerUnavailable,
    ErrorCode,
    MessageTooLarge,
    ProtocolError,
    QueueFull,
    Reject,
    SessionClosed,
    TableFull,
)
from ..protocol import (
    Ack,
    Call,
    Codec,
    Kind,
    Message,
    Mode,
    Nack,
    Nak,
    Ping,
    Pong,
    Publish,
    Result,
    Stream,
    Subscribe,
    Unsubscribe,
    encode,
    encode_message,
    encode_uv,
)
from ..protocol.deflate import Decompressor, inflate
from ..protocol.naming import quoted

ENDED = (SessionState.CLOSED, SessionState.CLOSING)

log = logging.getLogger("rubris_asgi")

_CLIENT_KINDS = (Subscribe, Unsubscribe, Call, Ack, Nack, Nak, Ping, Publish)
# a streamed reply waits for room while its session is connected or waiting to be resumed
_LIVE = (SessionState.CONNECTED, SessionState.DETACHED)


class Dispatcher:
    """Applies client messages to the engine and runs the application's handlers."""

    def __init__(
        self,
        engine: Engine,
        registry: Registry,
        config: Config,
        decompressor: Decompressor | None = None,
        broker: Broker | None = None,
    ) -> None:
        self.engine = engine
        self.registry = registry
        self.config = config
        self.decompressor = decompressor
        self.broker: Broker = broker or LocalBroker()
        """Where shared topics are numbered: a subscriber's topic is followed there before the
        subscription reads it."""
        self.tasks: set[asyncio.Task[None]] = set()
        self.session_tasks: dict[str, set[asyncio.Task[None]]] = {}

    async def handle(self, s: Session, msgs: Iterable[Message]) -> None:
        for msg in msgs:
            if s.state is SessionState.CLOSED or s.state is SessionState.CLOSING:
                return
            b = s.inbound
            if b is not None and b.level < 0.0:  # over its input budget: slowed to it
                await self.pay(s)
                if s.state in ENDED:  # while it waited
                    return
            if not isinstance(msg, _CLIENT_KINDS):
                raise ProtocolError(
                    f"a client may not send {type(msg).__name__.upper()} here", ErrorCode.PROTOCOL
                )
            if isinstance(msg, Ping):
                self.engine.direct(s, encode(Pong(msg.token)))
            elif isinstance(msg, Ack):
                self.engine.ack(s, msg)
            elif isinstance(msg, Subscribe):
                await self._subscribe(s, msg)
            elif isinstance(msg, Call):
                self._call(s, msg)
            elif isinstance(msg, Unsubscribe):
                self.engine.unsubscribe(s, msg.topic)
            elif isinstance(msg, Nak):
                self.engine.telemetry.naks += 1
                on_nak(s, msg.fill, self.engine.clock(), self.config.flow)
            elif isinstance(msg, Publish):
                await self._publish(s, msg)
            elif isinstance(msg, Nack):
                self.engine.nack(s, msg.topic, msg.tag, msg.requeue)

    async def handle_first(self, s: Session, msgs: Iterable[Message]) -> None:
        """The messages after the HELLO of a connection's first frame, called as the session
        is attached. A resumed session's rings are parked (``Engine.park_rings``) before
        anything can be sent: the client's SUBSCRIBEs here reposition them, and whatever it
        did not restate goes on once the frame is handled, however that ends."""
        self.engine.park_rings(s)  # before the first await: no cycle comes in between
        try:
            await self.handle(s, msgs)
        finally:
            self.engine.unpark(s)

    # the input budget (control/budget.py)

    def spend(self, s: Session, nbytes: int) -> None:
        """Count ``nbytes`` of input decoded or inflated for ``s`` against its budget."""
        now = self.engine.clock()
        b = s.inbound
        if b is None:
            rate = self.config.limits.inbound_rate
            b = s.inbound = Budget(rate, rate, now)
        b.spend(nbytes, now)

    async def pay(self, s: Session) -> None:
        """Wait out ``s``'s debt, if any, before its connection is read again."""
        b = s.inbound
        if b is not None:
            wait = b.wait(self.engine.clock())
            if wait > 0.0:
                await asyncio.sleep(wait)

    def _inflate(self, s: Session, data: bytes) -> bytes:
        data = inflate(data, self.config.limits.max_inflated, self.decompressor)
        self.spend(s, len(data))
        return data

    def _payload(self, s: Session, data: bytes, compressed: bool) -> Any:
        """The JSON value of a client payload (inflated under the limit); None when empty."""
        if compressed:
            data = self._inflate(s, data)
        if not data:
            return None
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            raise ProtocolError(f"payload is not valid JSON: {exc}", ErrorCode.PROTOCOL) from None

    def _name_ok(self, name: str) -> bool:
        return len(name.encode()) <= self.config.limits.max_topic_name

    def _too_long(self, what: str, name: str) -> str:
        """The reason of a refused name over ``max_topic_name``: the name shown cut short."""
        limit = self.config.limits.max_topic_name
        return f"{what} {quoted(name)} too long ({len(name.encode())} bytes, at most {limit})"

    async def _subscribe(self, s: Session, m: Subscribe) -> None:
        e = self.engine
        if not self._name_ok(m.name):
            e.reject(s, m.req, ErrorCode.TOO_LARGE, self._too_long("topic name", m.name))
            return
        found = self.registry.match(m.name)
        if found is None:
            # one answer for every name that is not offered, naming only what the client sent:
            # the typo is shown, nothing that exists is
            e.reject(s, m.req, ErrorCode.UNKNOWN, f"unknown topic {quoted(m.name)}")
            return
        ch, kwargs = found
        if ch.hidden:
            watched = m.name[: -len(ch.companion)]
            e.reject(
                s,
                m.req,
                ErrorCode.NOT_AUTHORISED,
                f"the members of {quoted(watched)} are not shown (presence='count'): "
                f"subscribe to {quoted(watched + COUNT)}",
            )
            return
        try:
            params = self._payload(s, m.params, m.compressed)
            last = _last(params) if ch.shared else 0
            every = _every(params, ch)
        except ProtocolError as exc:
            e.reject(s, m.req, exc.code, str(exc))
            return
        if m.name not in s.names and len(s.subs) >= self.config.limits.max_subscriptions:
            e.reject(s, m.req, ErrorCode.TOO_MANY, "too many subscriptions")
            return
        if ch.wants_params:
            kwargs = {**kwargs, "params": params}
        initial: Any = None
        try:
            if ch.handler is not None:
                initial = ch.handler(s, **kwargs)
                if inspect.isawaitable(initial):
                    initial = await initial
                if ch.companion:  # asked whether it may watch the topic: not its value
                    initial = NOBODY if ch.companion == COUNT else None
        except Reject as r:
            e.reject(s, m.req, r.code, r.reason)
            return
        except Exception:
            log.exception("subscribe handler for %r failed", m.name)
            e.reject(s, m.req, ErrorCode.REJECTED, f"subscribe to {quoted(m.name)} failed")
            return
        if s.state is SessionState.CLOSED or s.state is SessionState.CLOSING:
            return
        try:
            if ch.shared:
                t = e.topic_of(m.name, ch)
                if self.broker.distributed:
                    await self.broker.follow(t)  # its epoch, seq, ring or snapshot: Redis's
                    if s.state in ENDED:  # while Redis answered
                        return
                if initial is not None:
                    if isinstance(t, KeyedTopic):
                        _first_table(e, t, initial, m.name)
                    else:
                        e.publish_first(t, initial)
                e.subscribe(s, t, m.req, m.epoch, m.since, last, every)
            elif ch.mode == Mode.QUEUE:
                prefetch = _prefetch(params, ch)
                e.subscribe_queue(s, e.queue_of(m.name, ch, self.registry), m.req, prefetch)
            else:
                e.subscribe_private(
                    s,
                    m.name,
                    m.req,
                    capacity=ch.queue,
                    batch=ch.batch,
                    codec=ch.codec,
                    compress_at=ch.compress_at,
                )
        except (ProtocolError, MessageTooLarge, BrokerUnavailable, TableFull) as exc:
            e.reject(s, m.req, exc.code, str(exc))

    async def _publish(self, s: Session, m: Publish) -> None:
        """PUBLISH: into the intake (all or nothing), or a queue topic's item into its queue;
        REJECTED when refused.

        A connection's messages are handled one after the other (``handle`` awaits each, and
        the transports await ``handle`` before the next frame or POST), and the REJECTED goes
        out in order with the other direct answers: a client that sees the PONG of a later
        PING with no REJECTED before it knows the PUBLISH was taken (protocol.md section 4).
        """
        e = self.engine
        found = self.registry.match(m.name) if self._name_ok(m.name) else None
        if found is None or not found[0].client_publish:
            # the answer of any name not offered to PUBLISH, too long ones included: it shows
            # the client its own name, and tells nothing of what exists
            e.reject(s, m.req, ErrorCode.UNKNOWN, f"unknown topic {quoted(m.name)}")
            return
        ch, kwargs = found
        if not ch.hook_wants_payload:  # decided before any inflating or parsing
            refused = await self._may_publish(s, m.name, ch, kwargs, b"")
            if refused is not None:
                e.reject(s, m.req, *refused)
                return
        try:
            payload = m.payload
            if m.compressed:
                payload = self._inflate(s, payload)
            payload = _checked_payload(ch.codec, payload)
        except ProtocolError as exc:
            e.reject(s, m.req, exc.code, str(exc))
            return
        if ch.hook_wants_payload:
            refused = await self._may_publish(s, m.name, ch, kwargs, payload)
            if refused is not None:
                e.reject(s, m.req, *refused)
                return
        if s.state in ENDED:  # while the application decided
            return
        try:
            if ch.mode == Mode.QUEUE:  # an item, straight into its queue (O(1), bounded)
                e.check_item(len(payload))
                self._enqueue(s, m, e.queue_of(m.name, ch, self.registry), payload)
                return
            e.check_payload(len(payload))
            t = e.topic_of(m.name, ch)
        except (QueueFull, BrokerUnavailable) as exc:  # a shared queue's Redis away
            e.reject(s, m.req, ErrorCode.TOO_MANY, str(exc))
            return
        except (ProtocolError, MessageTooLarge) as exc:
            e.reject(s, m.req, exc.code, str(exc))
            return
        down = self.broker.unavailable(t.name)
        if down is not None:
            e.reject(s, m.req, ErrorCode.TOO_MANY, down)
        elif not e.offer([(t, payload)], s):
            e.reject(s, m.req, ErrorCode.TOO_MANY, f"ingest full ({e.intake.fill} %)")

    async def _may_publish(
        self, s: Session, name: str, ch: Channel, kwargs: dict[str, str], payload: bytes
    ) -> tuple[int, str] | None:
        """None when ``s`` may PUBLISH to ``name``; else the REJECTED's code and reason.

        The channel's publish hook decides each PUBLISH. Without one, a session may publish
        where it may subscribe: where it holds a subscription (its handler accepted it), or
        where the subscribe handler, asked once for this session and topic, accepts it (its
        value ignored). That verdict is remembered for the session's life, for at most
        ``max_subscriptions`` topics (past that the handler is asked each time)."""
        hook = ch.publish_hook
        if hook is None and name in s.names:
            return None
        known = s.may_publish
        if hook is None and known is not None and name in known:
            return known[name]
        verdict: tuple[int, str] | None = None
        try:
            if hook is not None:
                args: dict[str, Any] = dict(kwargs)
                if ch.hook_wants_payload:
                    args["payload"] = payload
                got = hook(s, **args)
                if inspect.isawaitable(got):
                    got = await got
                if got is False:
                    verdict = (
                        ErrorCode.NOT_AUTHORISED,
                        f"not allowed to publish to {quoted(name)}",
                    )
                return verdict
            if ch.handler is not None:
                args = {**kwargs, "params": None} if ch.wants_params else dict(kwargs)
                got = ch.handler(s, **args)
                if inspect.isawaitable(got):
                    await got
        except Reject as r:
            verdict = (r.code, r.reason)
        except Exception:  # the application's bug: refused, logged, not remembered
            log.exception("publish check for %r failed", name)
            return (ErrorCode.REJECTED, f"publish check for {quoted(name)} failed")
        if hook is None:
            if known is None:
                known = s.may_publish = {}
            if len(known) < self.config.limits.max_subscriptions:
                known[name] = verdict
        return verdict

    def _enqueue(self, s: Session, m: Publish, q: QueueTopic, payload: bytes) -> None:
        """A queue PUBLISH: the item into ``q``, its producer told the fill with FLOW (protocol
        section 8); REJECTED 6 naming the queue and its fill when it is full. Refusals are
        counted (``Telemetry.errors``), never logged one by one."""
        e = self.engine
        producers = e.producers_of(q)
        try:
            e.enqueue(q, payload)
        except QueueFull as exc:
            producers.refused(s)
            e.reject(s, m.req, ErrorCode.TOO_MANY, f"{exc}: fill {producers.fill} %")
            return
        producers.published(s)

    def _call(self, s: Session, m: Call) -> None:
        if not self._name_ok(m.method):
            self._error(s, m.call, ErrorCode.TOO_LARGE, self._too_long("method name", m.method))
            return
        method = self.registry.methods.get(m.method)
        if method is None:
            # as for topics: the client's own name back, never a list of the methods
            self._error(s, m.call, ErrorCode.UNKNOWN, f"unknown method {quoted(m.method)}")
            return
        calls = s.calls
        if calls is None:
            calls = s.calls = set()
        if m.call in calls:
            raise ProtocolError(f"call id {m.call} is already in flight", ErrorCode.PROTOCOL)
        if len(calls) >= self.config.limits.max_calls_in_flight:
            self._error(s, m.call, ErrorCode.TOO_MANY, "too many calls in flight")
            return
        try:
            args = self._payload(s, m.payload, m.compressed)
        except ProtocolError as exc:
            self._error(s, m.call, exc.code, str(exc))
            return
        calls.add(m.call)
        task = asyncio.get_running_loop().create_task(self._run_call(s, m.call, method, args))
        self.tasks.add(task)
        self.session_tasks.setdefault(s.id, set()).add(task)
        task.add_done_callback(self._forget(s.id))

    def _forget(self, sid: str) -> Any:
        def done(task: asyncio.Task[None]) -> None:
            self.tasks.discard(task)
            mine = self.session_tasks.get(sid)
            if mine is not None:
                mine.discard(task)
                if not mine:
                    del self.session_tasks[sid]

        return done

    async def _run_call(self, s: Session, call: int, method: Any, args: Any) -> None:
        e = self.engine
        try:
            if method.stream:
                async for item in method.handler(s, args):
                    if s.state is SessionState.CLOSED:
                        return
                    await self._room(s)
                    e.direct(s, self._reply(Kind.STREAM, call, 0, item))
                e.direct(s, encode(Stream(call, True, b"")))
            else:
                result = method.handler(s, args)
                if inspect.isawaitable(result):
                    result = await result
                try:
                    reply = self._reply(Kind.RESULT, call, 0, result)
                except MessageTooLarge:
                    self._error(s, call, ErrorCode.TOO_LARGE, "reply too large")
                    return
                e.direct(s, reply)
        except Reject as r:
            self._error(s, call, r.code, r.reason)
        except (ProtocolError, MessageTooLarge, QueueFull, SessionClosed) as exc:
            # rubris's own refusal of what the handler did for this caller (a send on a private
            # topic it did not subscribe to, a full queue, a message over the limit): the caller
            # can fix it, so it is told what and why with the error's code, not "internal error"
            log.debug("method %r refused: %s", method.name, exc)
            self._error(s, call, exc.code, str(exc))
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("method %r failed", method.name)
            self._error(s, call, ErrorCode.REJECTED, "internal error")
        finally:
            if s.calls is not None:
                s.calls.discard(call)

    async def _room(self, s: Session) -> None:
        # a streamed reply must not flood the direct queue of a client that reads slowly
        limit = self.config.limits.max_direct_queue // 2
        # polling, not an Event: an event per session would put a set() on every frame of the hot
        # path to serve the rare streamed reply that outruns its reader
        while len(s.direct or ()) > limit and s.state in _LIVE:  # noqa: ASYNC110
            await asyncio.sleep(0.005)

    def _reply(self, kind: Kind, call: int, flag: int, value: Any) -> bytes:
        payload = orjson.dumps(value)
        data, compressed = self.engine.compression.maybe_compress(
            payload, self.registry.compress_at
        )
        return encode_message(kind, encode_uv(call) + bytes((flag,)) + data, compressed)

    def _error(self, s: Session, call: int, code: int, message: str) -> None:
        self.engine.telemetry.error("result", code)
        payload = orjson.dumps({"code": int(code), "message": message})
        self.engine.direct(s, encode(Result(call, 1, payload)))

    def cancel_session(self, s: Session) -> None:
        """Cancel the calls still running for an ended session."""
        for task in self.session_tasks.pop(s.id, set()):
            task.cancel()

    async def cancel_all(self) -> None:
        tasks = list(self.tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)


def _checked_payload(codec: int, payload: bytes) -> bytes:
    """A client's PUBLISH payload as its topic stores it; ``ProtocolError`` if it does not fit
    the topic's codec. An empty JSON payload is ``null``."""
    if codec == Codec.JSON:
        if not payload:
            return b"null"
        try:
            orjson.loads(payload)
        except orjson.JSONDecodeError as exc:
            raise ProtocolError(f"payload is not valid JSON: {exc}", ErrorCode.PROTOCOL) from None
    elif codec == Codec.TEXT:
        try:
            payload.decode()
        except UnicodeDecodeError:
            raise ProtocolError("payload is not valid UTF-8", ErrorCode.PROTOCOL) from None
    return payload


def _last(params: Any) -> int:
    """A late joiner's ``{"last": n}`` (protocol §5): how many of a ring's latest messages it
    asks for first; 0 when it asks for none. The topic's own handler sees the params too."""
    if not isinstance(params, dict) or params.get("last") is None:
        return 0
    n = params["last"]
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ProtocolError("last must be an integer of at least 1", ErrorCode.PROTOCOL)
    return n


NOBODY = {"members": 0, "sessions": 0}
"""The first value of a ``{topic}@count`` nobody has joined yet."""


def _every(params: Any, ch: Channel) -> float:
    """The interval of a ``{"max_rate": r}`` (protocol §5b: r > 0 messages a second, on
    snapshot and keyed topics only); 0.0 without one. REJECTED 1 otherwise."""
    if not isinstance(params, dict) or "max_rate" not in params:
        return 0.0
    r = params["max_rate"]
    if not isinstance(r, (int, float)) or isinstance(r, bool) or not r > 0:
        raise ProtocolError(
            f"max_rate must be a number > 0 (messages a second), got {orjson.dumps(r).decode()}",
            ErrorCode.PROTOCOL,
        )
    if ch.mode not in (Mode.SNAPSHOT, Mode.KEYED):
        raise ProtocolError(
            f"max_rate applies to snapshot and keyed topics, not to a {Mode(ch.mode).name.lower()} "
            "topic",
            ErrorCode.PROTOCOL,
        )
    return 1.0 / r


def _first_table(e: Engine, t: KeyedTopic, initial: Any, name: str) -> None:
    """A keyed channel handler's value: the topic's first table, while it has none."""
    if t.seq != 0:
        return
    if not isinstance(initial, Mapping):
        log.error(
            "subscribe handler for %r returned a %s: a keyed channel's handler returns its "
            "first table, a mapping of key to value (or None)",
            name,
            type(initial).__name__,
        )
        return
    e.replace_table(t, initial)


def _prefetch(params: Any, ch: Channel) -> int | None:
    """A consumer's own prefetch from SUBSCRIBE params (``{"prefetch": n}``), if it fixes one."""
    if not isinstance(params, dict) or params.get("prefetch") is None:
        return None
    n = params["prefetch"]
    top = ch.queue_settings.max_prefetch if ch.queue_settings else 1
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= top:
        raise ProtocolError(f"prefetch must be an integer from 1 to {top}", ErrorCode.PROTOCOL)
    return n
