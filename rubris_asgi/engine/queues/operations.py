"""The engine's operations on work-queue topics (mode 4), as a part of ``Engine``.

``Engine`` is one object (the transports, the dispatcher and the HTTP API call it); its queue
operations live here, next to the queues they work on, and ``Engine`` takes them as a base
class: no call more on the producer's path (``enqueue`` is the hot one). The attributes and
methods of the engine they use are declared below; engine.py defines them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import orjson

from ...errors import ErrorCode, ProtocolError, QueueFull
from ...protocol import Codec, Mode, Revoke, Subscribed, encode
from ..session import SessionState
from ..topics import encode_payload, new_epoch, trimmed
from .consumer import QueueSub
from .producers import QueueProducers
from .settings import QueueSettings
from .topic import QueueHome, QueueItem, QueueTopic

if TYPE_CHECKING:
    from ...config import Config
    from ...protocol.deflate import Compression
    from ..buffers import WriterPool
    from ..channels import Channel, Registry
    from ..lifetimes import Lifetimes
    from ..scheduler import Scheduler
    from ..session import Session
    from ..topics import SharedTopic

JSON = int(Codec.JSON)
ITEM_HEADER = 48
"""An ITEM's bytes besides its payload, at most: kind, length, topic, tag, attempt."""


class QueueOperations:
    """Make, fill, consume and tick queue topics: ``Engine``'s methods for mode 4."""

    # the engine's, used here (engine.py sets them in its constructor)
    config: Config
    clock: Callable[[], float]
    pool: WriterPool
    compression: Compression
    scheduler: Scheduler
    topics: dict[str, SharedTopic]
    queues: dict[str, QueueTopic]
    queue_home: QueueHome | None
    on_item_end: Callable[[str, bool], None] | None
    _item_max: int
    _numbers: Any
    lifetimes: Lifetimes

    def direct(self, s: Session, msg: bytes) -> None:
        raise NotImplementedError  # Engine's

    def _check_room(self, s: Session) -> None:
        raise NotImplementedError  # Engine's

    def _send_flow(self, fill: int, publishers: list[Any]) -> None:
        raise NotImplementedError  # Engine's

    def queue_named(self, name: str, registry: Registry) -> QueueTopic:
        """The queue topic ``name``, made on first use from the channel that matches it;
        ``ProtocolError`` (code 3) when no queue channel does."""
        q = self.queues.get(name)
        if q is not None:
            return q
        found = registry.match(name)
        if found is None or found[0].mode != Mode.QUEUE:
            raise ProtocolError(f"no queue channel matches {name!r}", ErrorCode.UNKNOWN)
        return self.queue_of(name, found[0], registry, app=True)

    def queue_of(
        self, name: str, ch: Channel, registry: Registry, *, app: bool = False
    ) -> QueueTopic:
        """The queue topic ``name`` of channel ``ch``, created (with its dead-letter queue,
        found through ``registry``) on first use; ``app``: the application names it (kept for
        good, where one only clients made is retired once nobody needs it)."""
        q = self.queues.get(name)
        if q is not None:
            if app:
                q.app = True
            return q
        settings = ch.queue_settings or QueueSettings()
        if len(self.topics) + len(self.queues) >= self.config.limits.max_topics:
            raise ProtocolError("too many topics on this server", ErrorCode.TOO_MANY)
        self.lifetimes.admit(ch)
        q = QueueTopic(
            name,
            next(self._numbers),
            epoch=new_epoch(),
            codec=ch.codec,
            settings=settings,
            compress_at=ch.compress_at,
            on_dirty=self.scheduler.queue_dirty,
            on_item_end=self.on_item_end,
        )
        self.queues[name] = q
        q.app = app
        self.lifetimes.born(q, ch)
        if self.queue_home is not None:  # several nodes: its items wait in their home
            q.rehome(self.queue_home)
        dl = settings.dead_letter
        if dl is not None and dl != name:
            found = registry.match(dl)
            if found is None or found[0].mode != Mode.QUEUE:
                raise ValueError(f"queue {name!r}: dead_letter {dl!r} is not a queue topic")
            q.dead_letter = self.queue_of(dl, found[0], registry, app=True)
        return q

    def enqueue(
        self,
        q: QueueTopic,
        value: Any,
        item_id: str | None = None,
        batch_item: str | None = None,
    ) -> bool:
        """Add one item, O(1): False when ``item_id`` is a duplicate (nothing added); raises
        ``QueueFull`` at the queue's ``max_length`` and ``MessageTooLarge`` over the maximum."""
        ready = q.ready
        if len(ready) >= q.settings.max_length:
            raise QueueFull(f"queue {q.name!r} is full ({q.settings.max_length} waiting)")
        # the producer's hot path: encode once, deflate only from the threshold, size-check
        # only what could be too large (each a call saved on the common small item)
        kind = type(value)
        if kind is bytes:
            payload = value
        elif q.codec == JSON and kind is not bytearray and kind is not memoryview:
            payload = orjson.dumps(value)  # what encode_payload does for these, one call less
        else:
            payload = encode_payload(value, q.codec)
        at = q.compress_at
        if at is not None and len(payload) >= at:
            payload, compressed = self.compression.maybe_compress(payload, at)
        else:
            compressed = False
        if len(payload) > self._item_max:
            self.check_item(len(payload))
        now = self.clock()
        if item_id is not None and q.duplicate(item_id, now):
            return False
        item = QueueItem(trimmed(payload), compressed, item_id, now, batch_item)
        if q.home is not None:
            q.home.put(q, item)  # shared by several nodes: the item waits there
            return True
        ready.append(item)
        q.stats.enqueued += 1
        if not q.dirty and q.consumers:
            q.dirty = True
            self.scheduler.queue_dirty(q)
        return True

    def producers_of(self, q: QueueTopic) -> QueueProducers:
        """The sessions that PUBLISH items to ``q`` and the FLOW they were told, made at the
        first client PUBLISH (in-process ``enqueue`` has nobody to tell and never needs it)."""
        p = q.producers
        if p is None:
            home = q.home
            if home is None:
                ready = q.ready  # never replaced on a queue without a home
                waiting: Callable[[], int] = ready.__len__
            else:
                waiting = functools.partial(home.waiting, q)
            p = q.producers = QueueProducers(
                q.settings.max_length,
                waiting,
                flow=functools.partial(self._send_queue_flow, q),
                clock=self.clock,
            )
        return p

    def _send_queue_flow(self, q: QueueTopic, fill: int, publishers: list[Any]) -> None:
        """FLOW(fill of ``q``) to the sessions that PUBLISHed items to it lately."""
        q.stats.flows += len(publishers)
        self._send_flow(fill, publishers)

    def check_item(self, size: int) -> None:
        """Raise ``MessageTooLarge`` for a queue item of ``size`` bytes no frame could carry."""
        self.pool.check_size(size + ITEM_HEADER)

    def plan_items(
        self, entries: list[tuple[QueueTopic, bytes, str | None, str | None]]
    ) -> list[bool] | None:
        """Which of ``entries`` ``offer_items`` would enqueue now (False: a duplicate by its
        id, within the queue's dedup window or earlier in ``entries``), or None when a queue
        has no room for its new items. Changes nothing."""
        now = self.clock()
        fresh: dict[QueueTopic, int] = {}
        seen: set[tuple[int, str]] = set()
        plan: list[bool] = []
        for q, _payload, item_id, _batch_item in entries:
            if item_id is not None:
                key = (q.number, item_id)
                if key in seen or q.ids.check(item_id, now):
                    plan.append(False)
                    continue
                seen.add(key)
            plan.append(True)
            fresh[q] = fresh.get(q, 0) + 1
        if not all(q.room(n) for q, n in fresh.items()):
            return None
        return plan

    def offer_items(
        self, entries: list[tuple[QueueTopic, bytes, str | None, str | None]]
    ) -> list[int] | None:
        """Enqueue encoded items from outside the process, all of them or none.

        Items whose id a queue saw within its dedup window (or earlier in ``entries``) are not
        enqueued again. Returns the indexes of such duplicates in ``entries``, or None (nothing
        taken) when a queue has no room for its new items. Payload sizes were checked by the
        caller.
        """
        if self.plan_items(entries) is None:
            return None
        now = self.clock()
        duplicates: list[int] = []
        for i, (q, payload, item_id, batch_item) in enumerate(entries):
            if q.duplicate(item_id, now):
                duplicates.append(i)
                continue
            data, compressed = self.compression.maybe_compress(payload, q.compress_at)
            q.put(QueueItem(trimmed(data), compressed, item_id, now, batch_item))
        return duplicates

    def subscribe_queue(
        self, s: Session, q: QueueTopic, req: int, prefetch: int | None = None
    ) -> QueueSub:
        """Make ``s`` a consumer of ``q`` (``prefetch`` fixes its own), answer SUBSCRIBED."""
        sub = s.subs.get(q.number)
        if sub is None:
            self._check_room(s)
            sub = QueueSub(s, q, prefetch)
            s.subs[q.number] = sub
            s.names[q.name] = sub
            q.consumers.append(sub)
        if not isinstance(sub, QueueSub):
            raise ProtocolError(f"{q.name!r} is not a queue topic", ErrorCode.UNKNOWN)
        sub.live = s.sink is not None and s.state is SessionState.CONNECTED
        self.direct(
            s, encode(Subscribed(req, q.number, Mode.QUEUE, q.codec, q.epoch, 0, False, q.name))
        )
        q.touch()
        return sub

    def nack(self, s: Session, number: int, tag: int, requeue: bool) -> None:
        sub = s.subs.get(number)
        if isinstance(sub, QueueSub):
            sub.nack(tag, requeue)

    def queue_tick(self) -> None:
        """Server-side CoDel and round-trip probes of every consumer: REVOKE what it takes
        back. The runtime calls it every few milliseconds while there are consumers."""
        now = self.clock()
        for q in self.queues.values():
            if q.home is not None and q.producers is not None:
                q.producers.check()  # its length heard from Redis: other nodes' takes too
            if not q.active:
                continue
            for c in list(q.active):  # only consumers with deliveries out, or just after
                tag = c.tick(now)
                if tag:
                    self.direct(c.session, encode(Revoke.of(c.number, (tag,))))
                elif c.idle():
                    del q.active[c]

    def forfeit(self, q: QueueTopic) -> list[QueueItem]:
        """The other nodes took this one for dead (paused, or cut off from Redis, past
        ``node_timeout``) and gave the items it held back to the queue, each with ``attempt``
        + 1. What its consumers hold is taken back with REVOKE: a consumer that has not
        started an item leaves it to its next delivery; one that has finishes it and its ACK
        is ignored (at least once, and the next delivery says so by its attempt). Returns the
        items taken back, for the home to give back where it still holds them."""
        items: list[QueueItem] = []
        for c in list(q.consumers):
            tags, held = c.forfeit()
            items += held
            if tags:
                self.direct(c.session, encode(Revoke.of(c.number, tags)))
        q.touch()
        return items

    def _give_back_queues(self, s: Session, lost: bool) -> None:
        for sub in s.subs.values():
            if isinstance(sub, QueueSub):
                sub.live = False
                sub.give_back(lost)
