"""Queue topics (mode 4, protocol.md section 5): :class:`Consumer` and :class:`QueueItem`.

``await client.consume(name)`` subscribes to a work queue as one of its competing consumers and
returns a :class:`Consumer`: an async iterator of :class:`QueueItem`, or, given a handler, a
task that hands the items to it one at a time::

    consumer = await client.consume("jobs.resize", prefetch=8)
    async for item in consumer:
        resize(item.value)        # decoded by the topic's codec, as subscriptions are
        item.ack()                # or item.nack() to give it back, item.nack(requeue=False)
    await consumer.close()

    async def handle(item: QueueItem) -> None:   # sync or async
        await resize(item.value)                 # returns: ACK; raises: NACK with requeue

    consumer = await client.consume("jobs.resize", handle)

What the client does for the application:

- **ACKs of one event-loop turn share one message.** ``ack()`` records the tag and returns at
  once; every tag recorded in the same turn goes out in one ``ACK`` at the end of that turn
  (``loop.call_soon``), never later: the server measures processing time from the spacing of a
  consumer's ACKs, so an ACK held back would falsify it. ``nack()`` likewise (one NACK a tag).
- **Settling twice is a no-op.** ``ack()`` and ``nack()`` return True when they settled the
  item and its ACK/NACK will be sent, False when it was settled already (nothing more is sent:
  the first answer stands), when the consumer has been closed, or when the item came on an
  earlier connection. The server took such an item back when that connection was lost (a
  resumed session starts with nothing outstanding), and on a new session its tag could even
  be a protocol error, so its ACK is never sent (counted in ``ConsumerStats.stale``).
- **Client-side CoDel** (the source document on prefetch, protocol.md section 5). The items
  wait in the consumer's buffer until the application takes them; when it takes one, the time
  it waited beyond one item's processing (now - ``item.received`` - ``consumer.service``, the
  application's measured time per item: a right-sized prefetch has each item arrive while the
  one before is worked on) goes through ``CoDel(codel_target, codel_interval)``; when CoDel
  drops, the *newest* item of the buffer is given back (NACK with requeue, counted in
  ``codel_returned``) and the one taken is handed over, so that a consumer that has slowed
  down sheds the standing queue to consumers that are free. The newest, because it would wait
  longest here, and because the server's own CoDel takes back the newest too: a consumer that
  gave back from the head would start items sooner than the server can expect, and a REVOKE
  on its way would name an item it had already started (measured: 3-4 items of 200 run twice
  with both sides on). The last item in the buffer is never dropped (a queue of one is not a
  standing queue: RFC 8289's rule), and once the application's time per item is known, CoDel's
  target and interval are at least one and two of it (for items that take 300 ms, 20 ms of
  waiting is jitter, not a standing queue). ``codel_target=None`` turns it off.
- **REVOKE** takes the named items out of the buffer if the application has not taken them
  yet (counted in ``revoked``); an item already taken is left alone (its ACK is still sent,
  and the server ignores it).
- **A payload that does not decode** (not JSON on a JSON topic, not UTF-8 on a text topic)
  is logged and NACKed without requeue (the server dead-letters it: no consumer will do
  better); one that does not inflate (corrupt, or past this client's ``max_inflated``) is
  NACKed with requeue (another consumer may inflate it; the delivery limit ends it otherwise).
  Both are counted in ``undecodable``. A subscription's bad PUSH closes the client, but a work
  item would go round every consumer and close each in turn.
- **Bounded.** The buffer holds at most :data:`~rubris_asgi.client.QUEUE_SIZE` items (the
  server's prefetch keeps it far below that); an item beyond it is given back at once (NACK
  with requeue, counted in ``overflowed``).
- **Reconnects.** When the connection is lost the buffer is emptied (the server takes those
  items back) and CoDel starts afresh; when the server could not resume the session, the
  client subscribes again with the same ``prefetch``. A handler keeps running across it.
- **The handler** runs in a task of its own, one item at a time in the order they came, so
  the client keeps reading (and sees a REVOKE) while it is busy; it yields to the event loop
  after each item, so each item's ACK goes out on its own. Its exceptions are logged and the
  item is NACKed with requeue (the server's delivery limit dead-letters a poison item); an
  item the handler settled itself is not settled again.

- **Closing.** ``await consumer.close()`` stops handing items over, drops the buffer, lets a
  handler finish the item in hand, sends the ACKs made so far and then UNSUBSCRIBE, and waits
  for UNSUBSCRIBED; the server takes back the rest. ``Client.close()`` instead cancels the
  handlers at once.

Note that a NACK with requeue counts toward the channel's delivery limit (protocol.md section 5),
the client-side CoDel's and a full buffer's included; a REVOKE does not. Set ``codel_target`` so
that a consumer in its normal state returns few if any items.

Delivery is at least once: an item returned, revoked or lost with a connection after the
application started it may come again (``attempt`` > 1), so make the work idempotent.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any, Literal

from ..control.codel import CoDel
from ..errors import RubrisError
from ..protocol import Ack, ClientMessage, Nack
from .concurrency import _within
from .errors import SubscriptionEnded, _copy
from .stats import ClientStats, ConsumerStats
from .subscription import QUEUE_SIZE, _Topic

__all__ = ["Consumer", "QueueItem"]

log = logging.getLogger("rubris_asgi.client")

SERVICE_GAIN = 0.25
"""Weight of a new sample in the moving mean of the application's time per item."""

ACK_TAGS = 4096
"""Most tags in one ACK message: one turn's ACKs are split only past this (a message stays
well under any server's ``max_frame``)."""

_Outcome = Literal["acked", "nacked", "returned"]


class QueueItem:
    """One delivery of a queue item.

    ``topic`` is the queue topic's name, ``value`` the payload decoded by the topic's codec,
    ``tag`` the delivery's number (per topic and session), ``attempt`` 1 on its first delivery
    and one more on each redelivery, ``received`` the client's monotonic time when the ITEM was
    read, ``compressed`` whether it came COMPRESSED.

    Settle it once with :meth:`ack` or :meth:`nack`; both are plain functions that never block
    (call them from the event loop's thread).
    """

    __slots__ = (
        "topic",
        "tag",
        "attempt",
        "value",
        "received",
        "compressed",
        "_consumer",
        "_topic_no",
        "_generation",
        "_outcome",
    )

    def __init__(
        self,
        consumer: Consumer,
        topic_no: int,
        generation: int,
        tag: int,
        attempt: int,
        value: Any,
        received: float,
        compressed: bool,
    ) -> None:
        self.topic = consumer.name
        self.tag = tag
        self.attempt = attempt
        self.value = value
        self.received = received
        self.compressed = compressed
        self._consumer = consumer
        self._topic_no = topic_no  # the topic number of the connection it came on
        self._generation = generation
        self._outcome: _Outcome | None = None

    def __repr__(self) -> str:
        return (
            f"QueueItem({self.topic!r}, tag={self.tag}, attempt={self.attempt},"
            f" state={self._outcome or 'unsettled'!r})"
        )

    @property
    def settled(self) -> bool:
        """Whether :meth:`ack` or :meth:`nack` was called (or the client gave it back)."""
        return self._outcome is not None

    def ack(self) -> bool:
        """This item is done: ACK its tag at the end of this event-loop turn.

        Returns False, sending nothing, when the item was settled already, when its consumer
        has been closed (its UNSUBSCRIBE sent), or when it came on an earlier connection.
        """
        return self._consumer._settle(self, None)

    def nack(self, requeue: bool = True) -> bool:
        """Give this item back: to the head of the queue with ``requeue``, else the server drops
        it (or dead-letters it, where the channel has a dead-letter topic).

        Returns False, sending nothing, in the cases :meth:`ack` does.
        """
        return self._consumer._settle(self, requeue)


class _Settler:
    """The client's queue ACKs and NACKs, sent at the end of the event-loop turn that made them.

    It also numbers the connections (``generation``): an item remembers the one it came on,
    and a settlement of an older one is never sent.
    """

    def __init__(self, send: Callable[[ClientMessage], None]) -> None:
        self.generation = 0
        self._send = send
        self._acks: dict[int, tuple[Consumer, list[int]]] = {}
        self._nacks: list[tuple[Consumer, Nack]] = []
        self._handle: asyncio.Handle | None = None

    def ack(self, consumer: Consumer, topic: int, tag: int) -> None:
        entry = self._acks.get(topic)
        if entry is None:
            self._acks[topic] = (consumer, [tag])
        else:
            entry[1].append(tag)
        self._schedule()

    def nack(self, consumer: Consumer, msg: Nack) -> None:
        self._nacks.append((consumer, msg))
        self._schedule()

    def _schedule(self) -> None:
        if self._handle is None:
            self._handle = asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        """Send what is recorded now (also before an UNSUBSCRIBE, which must come after)."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        acks, self._acks = self._acks, {}
        nacks, self._nacks = self._nacks, []
        for topic, (consumer, tags) in acks.items():
            if consumer._holds():
                for i in range(0, len(tags), ACK_TAGS):
                    self._send(Ack.items(topic, tags[i : i + ACK_TAGS]))
        for consumer, msg in nacks:
            if consumer._holds():
                self._send(msg)

    def new_connection(self) -> None:
        """The connection was lost: nothing recorded so far may be sent on the next one."""
        self.generation += 1
        self._acks.clear()
        self._nacks.clear()
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None


class Consumer(_Topic):
    """One subscription to a queue topic (see the :mod:`rubris_asgi.client.consumer` docstring).

    Without a handler it is an async iterator of :class:`QueueItem`; iteration ends when the
    consumer is closed or ended by the server (``end_code``/``end_reason`` say how; items still
    in the buffer are not handed over then: the server takes them back), and raises
    :class:`~rubris_asgi.client.ConnectionLost` when the client lost its connection for good.

    ``topic``, ``mode``, ``codec`` mirror the latest SUBSCRIBED; ``prefetch`` is what was asked
    for (None: the server sizes it); ``codel`` is the client-side CoDel state (None when off);
    ``stats`` its :class:`~rubris_asgi.client.ConsumerStats`.

    >>> async def work(consumer: Consumer) -> None:  # doctest: +SKIP
    ...     async for item in consumer:
    ...         print(item.attempt, item.value)
    ...         item.ack()
    """

    def __init__(
        self,
        stats: ClientStats,
        name: str,
        handler: Callable[[QueueItem], Any] | None,
        params: bytes,
        prefetch: int | None,
        codel: CoDel | None,
        settler: _Settler,
        clock: Callable[[], float],
        leave: Callable[[_Topic], asyncio.Future[None]],
    ) -> None:
        super().__init__(stats, name, params)
        self.prefetch = prefetch
        self.codel = codel
        self.stats = ConsumerStats()
        self._handler = handler
        self._settler = settler
        self._clock = clock
        self._leave = leave  # the client's: UNSUBSCRIBE, and a future for UNSUBSCRIBED
        self._buffer: deque[QueueItem] = deque()
        self._stopping = False  # close() was called: nothing more is handed over
        self._runner: asyncio.Task[None] | None = None  # the handler's task
        self.service = 0.0
        """The application's time per item: a moving mean of the intervals between takes
        while items were waiting (0 until measured)."""
        self._taken_at = 0.0
        self._busy = False  # items were left waiting at the last take
        codel = self.codel
        self._codel_knobs = (codel.target, codel.interval) if codel is not None else (0.0, 0.0)

    def __repr__(self) -> str:
        return (
            f"Consumer({self.name!r}, topic={self.topic}, buffered={len(self._buffer)},"
            f" ended={self.ended})"
        )

    def __aiter__(self) -> Consumer:
        return self

    async def __anext__(self) -> QueueItem:
        try:
            return await self.get()
        except SubscriptionEnded:
            raise StopAsyncIteration from None

    async def __aenter__(self) -> Consumer:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def get(self, timeout: float | None = None) -> QueueItem:
        """The next item (client-side CoDel may give back some before it, see the module doc).

        Raises:
            asyncio.TimeoutError: nothing came within ``timeout`` seconds.
            SubscriptionEnded: the consumer is closed or was ended by the server.
            ConnectionLost: the client lost its connection for good.
            RubrisError: the consumer has a handler (the handler takes the items).
        """
        if self._handler is not None:
            raise RubrisError(f"the consumer of {self.name!r} runs a handler; it has no get()")
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            if self._ended is not None:
                raise _copy(self._ended)
            if self._stopping:
                raise SubscriptionEnded(0, "closed")
            item = self._take()
            if item is not None:
                return item
            self._wake.clear()
            if deadline is None:
                await self._wake.wait()
            else:
                await _within(self._wake.wait(), max(0.0, deadline - loop.time()))

    def qsize(self) -> int:
        """Items in the buffer, not yet taken."""
        return len(self._buffer)

    async def close(self) -> None:
        """Stop consuming: UNSUBSCRIBE, and wait for UNSUBSCRIBED (or the end of the session).

        Nothing more is handed over; the buffer is dropped, and the server takes back every
        item not acknowledged. A handler busy with an item is let finish first (this waits for
        it), so that its ACK goes out before the UNSUBSCRIBE; when ``close()`` is called from
        the handler itself, that item goes back too unless it was acked first. ACKs of items
        taken earlier must be made before ``close()``: later ones are not sent. Safe to call
        twice.
        """
        if self.ended:
            return
        self._stopping = True
        self._buffer.clear()
        self._wake.set()
        runner = self._runner
        if runner is not None and runner is not asyncio.current_task() and not runner.done():
            try:
                await asyncio.wait({runner})
            except asyncio.CancelledError:
                runner.cancel()
                self._settler.flush()
                self._leave(self)  # the UNSUBSCRIBE still goes, without waiting for its answer
                raise
        self._settler.flush()  # ACKs made so far go before the UNSUBSCRIBE
        await asyncio.shield(self._leave(self))

    # ------------------------------------------------------------------ the client's side

    def _holds(self) -> bool:
        """Whether the session still holds the topic for us: its ACKs may be sent."""
        return self._wanted and not self.ended

    def _settle(self, item: QueueItem, requeue: bool | None) -> bool:
        if item._outcome is not None:
            return False
        item._outcome = "acked" if requeue is None else "nacked"
        if item._generation != self._settler.generation:
            self.stats.stale += 1
            return False
        if not self._holds():
            return False
        if requeue is None:
            self.stats.acked += 1
            self._settler.ack(self, item._topic_no, item.tag)
        else:
            self.stats.nacked += 1
            self._settler.nack(self, Nack(item._topic_no, item.tag, requeue))
        return True

    def _give_back(self, item: QueueItem) -> None:
        item._outcome = "returned"
        self._settler.nack(self, Nack(item._topic_no, item.tag, True))

    def _undecodable(self, topic_no: int, tag: int, exc: Exception, requeue: bool) -> None:
        """An ITEM whose payload does not inflate or decode: NACK it (see the module doc)."""
        self.stats.received += 1
        self.stats.undecodable += 1
        log.warning("queue %r: item with tag %d refused: %s", self.name, tag, exc)
        if self._holds():
            self._settler.nack(self, Nack(topic_no, tag, requeue))

    def _deliver(self, item: QueueItem) -> None:
        """An ITEM came (the reader calls this)."""
        self.stats.received += 1
        if not self._wanted or self._stopping:
            return  # an UNSUBSCRIBE is (about to be) on its way: the server takes it back
        if len(self._buffer) >= QUEUE_SIZE:
            self.stats.overflowed += 1
            self._stats.overflowed += 1
            self._give_back(item)
            return
        self._buffer.append(item)
        self._wake.set()

    def _revoke(self, tags: Iterable[int]) -> None:
        """A REVOKE came: drop those of its tags the application has not taken."""
        gone = set(tags)
        if not gone or not self._buffer:
            return
        kept = deque(i for i in self._buffer if i.tag not in gone)
        n = len(self._buffer) - len(kept)
        if n:
            self._buffer = kept
            self.stats.revoked += n
            self._stats.revoked += n

    def _take(self) -> QueueItem | None:
        """The next item for the application, after CoDel's verdict; None when empty."""
        buffer = self._buffer
        codel = self.codel
        now = self._clock()
        if self._busy and self._taken_at:
            sample = now - self._taken_at
            self.service += SERVICE_GAIN * (sample - self.service) if self.service else sample
        if not buffer:
            self._busy = False
            return None
        item = buffer.popleft()
        if codel is not None:
            if self.service:  # floors in items, as on the server: see queues/consumer.py
                codel.target = max(self._codel_knobs[0], self.service)
                codel.interval = max(self._codel_knobs[1], 2 * self.service)
            # the standing queue is what waited beyond one item's processing (a right-sized
            # prefetch has each item arrive while the one before is being worked); the last
            # item in the buffer is no queue at all (RFC 8289: nothing to drop below one packet)
            excess = now - item.received - self.service if buffer else 0.0
            if codel.should_drop(excess, now):
                # the newest goes back, not this one: it would wait longest here, and the
                # server (whose REVOKE takes the newest too) keeps seeing this consumer start
                # its items in order, so a REVOKE never names one it has started
                back = buffer.pop()
                self.stats.codel_returned += 1
                self._stats.codel_returned += 1
                self._give_back(back)
        self.stats.taken += 1
        self._taken_at, self._busy = now, bool(buffer)
        return item

    def _connection_lost(self) -> None:
        """The server takes back everything outstanding: forget the buffer and CoDel's state."""
        self.stats.cleared += len(self._buffer)
        self._buffer.clear()
        if self.codel is not None:
            self.codel.reset()

    def _end(self, exc: BaseException) -> None:
        super()._end(exc)
        self._buffer.clear()

    def _start(self, workers: set[asyncio.Task[None]]) -> None:
        """Start the handler's task (``workers``: the client's, so close() can wait for it)."""
        task = asyncio.get_running_loop().create_task(
            self._run(), name=f"rubris-client-consumer {self.name}"
        )
        self._runner = task
        workers.add(task)
        task.add_done_callback(workers.discard)

    def _cancel(self) -> None:
        runner = self._runner
        if runner is not None and runner is not asyncio.current_task():
            runner.cancel()

    async def _run(self) -> None:
        handler = self._handler
        assert handler is not None
        what = f"handler of queue {self.name!r}"
        while not (self.ended or self._stopping):
            item = self._take()
            if item is None:
                self._wake.clear()
                await self._wake.wait()
                continue
            try:
                result = handler(item)
                if inspect.isawaitable(result):
                    await result
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("%s failed on tag %d (attempt %d)", what, item.tag, item.attempt)
                item.nack(requeue=True)
            else:
                item.ack()
            # let the reader in between items (a REVOKE must be seen while the handler is busy)
            # and let this item's ACK leave on its own: the server times processing by them
            await asyncio.sleep(0)
