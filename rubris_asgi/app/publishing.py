"""What the application calls on a running ``Rubris`` to publish, enqueue and send: the
``_Publishing`` mixin of :class:`~.rubris.Rubris`.

Each call reaches the engine through the same few steps: find the topic (``shared_named``,
``queue_named``, ``private_for``), hand it the value, and say what went wrong in the caller's
terms (a value that is not JSON names the topic: ``_not_json``). The calls made from another
thread than the server's event loop are handed to it (``call_in_loop``); the async ones refuse
another loop (``_on_loop``).
"""

from __future__ import annotations

import asyncio
import functools
import threading
from typing import Any, NoReturn

from ..batches import ItemRef, parse_item
from ..batches.service import Batches
from ..cluster import Broker
from ..cluster.ends import SessionEnds
from ..cluster.sends import RemoteSends
from ..engine.channels import Registry
from ..engine.engine import Engine
from ..engine.queues import QueueStats
from ..engine.session import Session, SessionState
from ..engine.topics import encode_payload
from ..errors import ErrorCode, QueueFull, SessionClosed
from ..ops.stats import Stats, collect_stats
from ..protocol import Codec
from ..protocol.naming import quoted, raise_refused
from ..server.gateway import Gateway
from ..server.threads import call_in_loop, wait_for_room


class _Publishing:
    """Publish, enqueue, send and end sessions; mixed into :class:`~.rubris.Rubris`, whose
    attributes below it uses (declared here for the type checker)."""

    engine: Engine
    registry: Registry
    broker: Broker
    _batches: Batches | None
    _remote: RemoteSends
    _ends: SessionEnds
    _loop: asyncio.AbstractEventLoop | None
    _thread: int

    def publish(self, name: str, value: Any) -> int:
        """Publish to a shared topic; O(1), never blocks; returns the message's seq (0 with
        a distributed broker, which numbers it: ``publish_async`` waits for the seq).

        Raises ``ProtocolError`` (code 3) when no shared channel matches ``name``,
        ``MessageTooLarge`` over the writer pool's maximum, ``BrokerUnavailable`` while
        Redis cannot take it and ``TypeError`` (naming ``name``, the type and the fix) when
        ``value`` is not JSON; nothing is stored or numbered then. Safe from any thread: called
        from one that is not the server's event loop (a Django sync view), it hands the call to
        the loop and waits for it.
        """
        if self._thread and self._thread != threading.get_ident():
            return call_in_loop(self._loop, self._publish, name, value)
        return self._publish(name, value)

    def _publish(self, name: str, value: Any) -> int:
        t = self.engine.shared_named(name, self.registry)
        try:
            return self.engine.publish(t, value)
        except TypeError as exc:  # the encoder's, said again with the topic and the fix
            _not_json("publish to", name, exc, value, t.codec)

    async def publish_async(self, name: str, value: Any) -> int:
        """Publish to a shared topic and return its seq once numbered: at once alone, once
        Redis numbered it with a ``RedisBroker`` (the same seq on every node). Raises as
        ``publish`` does."""
        self._on_loop("publish_async")
        t = self.engine.shared_named(name, self.registry)
        try:
            if not self.broker.distributed:
                return self.engine.publish(t, value)
            data, compressed = self.engine.prepare(t, value)
        except TypeError as exc:  # as in _publish, before Redis is asked anything
            _not_json("publish to", name, exc, value, t.codec)
        return await self.broker.numbered(t, data, compressed)

    def enqueue(
        self,
        name: str,
        value: Any,
        *,
        id: str | None = None,  # noqa: A002
        batch_item: str | None = None,
    ) -> bool:
        """Add a work item to the queue topic ``name``; O(1), never blocks.

        ``id`` is the producer's idempotency key: an id seen within the queue's dedup window
        (10 minutes, at most 1,000,000 ids) is not enqueued again and the call returns False.
        ``batch_item`` (an item id of ``rubris.batches``) is marked done when a consumer ACKs
        the item, failed when the item is dead-lettered; its form is checked here
        (``MalformedItem``), its batch when it ends (``put`` checks both now). An ``id`` the
        queue has seen is the same work: the batch item of the first is the one that ends.
        Raises ``QueueFull`` at the queue's ``max_length``, ``ProtocolError`` (code 3) when no
        queue channel matches ``name`` and ``MessageTooLarge`` over the writer pool's maximum.
        Safe from any thread, as ``publish``.
        """
        if self._thread and self._thread != threading.get_ident():
            call = functools.partial(self.enqueue, name, value, id=id, batch_item=batch_item)
            return call_in_loop(self._loop, call)
        if batch_item is not None:
            self._batch_item(batch_item)
        q = self.engine.queue_named(name, self.registry)
        try:
            return self.engine.enqueue(q, value, id, batch_item)
        except TypeError as exc:  # as in _publish: nothing was queued nor its id remembered
            _not_json("enqueue to", name, exc, value, q.codec)

    async def put(
        self,
        name: str,
        value: Any,
        *,
        id: str | None = None,  # noqa: A002
        batch_item: str | None = None,
    ) -> bool:
        """``enqueue``, waiting while the queue is full (back-pressure on the producer).

        A ``batch_item`` must name an item of a known batch (``UnknownBatch``,
        ``ItemOutOfRange`` otherwise)."""
        self._on_loop("put")
        q = self.engine.queue_named(name, self.registry)
        if batch_item is not None:
            await self.batches.check([self._batch_item(batch_item)])
        while True:
            try:
                return self.engine.enqueue(q, value, id, batch_item)
            except QueueFull:
                pass
            except TypeError as exc:  # as in enqueue
                _not_json("enqueue to", name, exc, value, q.codec)
            await wait_for_room(q.waiters)

    def _batch_item(self, text: str) -> ItemRef:
        if self._batches is None:
            raise RuntimeError("batch_item needs batch tracking, which is off (batches=False)")
        return parse_item(text)

    @property
    def batches(self) -> Batches:
        """Batch tracking: ``open``, ``add``, ``seal``, ``ack``, ``fail``, ``status``.

        Raises ``RuntimeError`` when it is off (``Rubris(batches=False)``)."""
        if self._batches is None:
            raise RuntimeError("batch tracking is off: Rubris(batches=False)")
        return self._batches

    def queue_stats(self, name: str) -> QueueStats:
        """Counters and gauges of the queue topic ``name`` (``KeyError`` if it has not been
        used yet, or was retired: made by clients only, and nobody needed it any more)."""
        return self.engine.queues[name].snapshot()

    def send_nowait(self, session: Session, name: str, value: Any) -> int:
        """Queue a private message; raises ``QueueFull`` when the queue is at capacity.

        Safe from any thread, as ``publish``."""
        if self._thread and self._thread != threading.get_ident():
            return call_in_loop(self._loop, self.send_nowait, session, name, value)
        q = self.engine.private_for(session, name)
        try:
            return self.engine.send_nowait(session, q, value)
        except TypeError as exc:  # as in _publish: nothing queued, no seq taken
            _not_json("send to", name, exc, value, q.codec)

    async def send(self, session: Session, name: str, value: Any) -> int:
        """Queue a private message, waiting while the queue is full (back-pressure).

        Raises ``SessionClosed`` if the session ends while waiting.
        """
        self._on_loop("send")
        q = self.engine.private_for(session, name)
        while True:
            try:
                return self.engine.send_nowait(session, q, value)
            except QueueFull:
                pass
            except TypeError as exc:  # as in send_nowait
                _not_json("send to", name, exc, value, q.codec)
            await wait_for_room(q.waiters)
            if session.state is SessionState.CLOSED:
                raise SessionClosed(f"session {session.id[:8]}… has ended")

    async def send_to(
        self, session_id: str, name: str, value: Any, *, key: str | None = None
    ) -> int:
        """``send`` to the session ``session_id`` on whichever node it lives (remote.py),
        waiting at most 30 s for room; the message's seq once it is queued.

        Raises, when the message was certainly not queued: ``SessionClosed`` (no such
        session), ``QueueFull`` (still full after the wait), ``ProtocolError``,
        ``MessageTooLarge``, ``BrokerUnavailable`` (Redis failed before the request reached
        it); when it may have been: ``DeliveryUnknown``. ``key`` (a str of at most 200
        characters) makes a repeat safe: the session's node queues a message once per key
        (remembered 5 minutes, at most 1,024 keys per session) and answers a repeat with the
        first one's seq."""
        self._on_loop("send_to")
        try:
            return await self._remote.send_to(session_id, name, value, key)
        except TypeError as exc:  # encoded here for another node (this node's send names it)
            found = self.registry.match(name)
            codec = found[0].codec if found is not None else Codec.JSON
            _not_json("send to", name, exc, value, codec)

    async def disconnect(
        self,
        *,
        user: Any = None,
        session: str | None = None,
        code: ErrorCode = ErrorCode.NOT_AUTHORISED,
        reason: str = "disconnected by the application",
    ) -> int:
        """End every session of ``user`` (as ``authenticate`` gives it, compared by its
        stable identity), or the session whose id is ``session``, on every node: GOODBYE
        ``code`` (4, or 10 for the application's own reason) and the close; a session
        waiting to be resumed is forgotten. Returns how many were ended.

        Raises ``BrokerUnavailable`` when another node could not be asked (those ended stay
        ended; call again), ``ValueError`` for another code or neither argument."""
        self._on_loop("disconnect")
        if (user is None) == (session is None):
            raise ValueError("give exactly one of user= or session=")
        if user is not None and Gateway.user_key(user) is None:
            raise ValueError("anonymous sessions are ended by session id, not by user")
        owner = Gateway.owner_tag(user) if user is not None else None
        return await self._ends.end(owner, session, code, reason)

    def _on_loop(self, what: str) -> None:
        """Refuse an async call made from another event loop than the server's: the engine's
        waiters would be woken on the wrong loop."""
        loop = self._loop
        if loop is not None and asyncio.get_running_loop() is not loop:
            raise RuntimeError(
                f"rubris.{what} must be awaited on the server's event loop; from other threads "
                "use publish, enqueue or send_nowait (thread-safe)"
            )

    def has_subscribers(self, name: str) -> bool:
        """Whether any session subscribes to the shared topic ``name`` (to skip costly work)."""
        t = self.engine.topics.get(name)
        return t is not None and bool(t.subs)

    def sessions(self) -> list[Session]:
        return list(self.engine.sessions.values())

    def stats(self) -> Stats:
        return collect_stats(self.engine, self.broker)


def _not_json(what: str, name: str, exc: TypeError, value: Any, codec: int) -> NoReturn:
    """Raise, from the ``except TypeError`` of a publish or a send, the error that names the
    topic and says what to do when ``value`` is what the encoder refused (protocol/naming.py);
    ``exc`` unchanged when it came from elsewhere."""
    encode = functools.partial(encode_payload, value, codec)
    raise_refused(f"{what} {quoted(name)}", exc, encode, codec)
