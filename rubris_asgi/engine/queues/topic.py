"""A work-queue topic: items waiting, the consumers competing for them, and the deal between.

Each item goes to exactly one consumer at a time. ``deal`` hands waiting items out one by one to
the consumers in rotation, skipping those without free prefetch, so consumers with room are
served fairly whatever their number; a dealt item waits in its consumer's *lane* until the
scheduler's cycle puts it in a frame (consumer.py). Items given back (NACK with requeue, a lost
consumer, REVOKE) go to the head of the queue, to be delivered next.

Memory is bounded: ``max_length`` waiting items, plus at most the prefetch of each consumer.
Given-back items are never refused, so the waiting count may pass ``max_length`` by what the
consumers held; new items are refused until it is back under.

With a *home* (``QueueHome``: cluster/redis/queues/), the waiting items live there, shared by
every node: ``put`` sends a new item home, ``ready`` holds only what this node took for its
consumers' free prefetch, and an item leaves this node's custody through ``settle`` (ACKed,
given back to the head, dead-lettered or dropped). Alone, ``home`` is None and nothing of this
costs a call.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from ...errors import QueueFull
from ...protocol.codec import ItemEncoder, item_encoder
from .dedup import IdWindow
from .producers import QueueProducers
from .settings import QueueSettings


class QueueItem:
    """One work item: its payload (encoded and maybe compressed once) and its history."""

    __slots__ = (
        "payload",
        "compressed",
        "attempt",
        "failures",
        "id",
        "enqueued",
        "batch_item",
        "key",
    )

    def __init__(
        self,
        payload: bytes,
        compressed: bool,
        item_id: str | None,
        now: float,
        batch_item: str | None = None,
    ) -> None:
        self.payload = payload
        self.compressed = compressed
        self.attempt = 0
        """Deliveries so far (ITEM's ``attempt`` is this after the increment at sending)."""
        self.failures = 0
        """Deliveries that ended in NACK or a lost consumer (REVOKE does not count)."""
        self.id = item_id
        self.enqueued = now
        self.batch_item = batch_item
        """The batch item this work item is (protocol.md 8b): done at its ACK, failed when it
        is dead-lettered."""
        self.key: str | None = None
        """Its name in its home (unique across nodes), when the queue has one."""

    def __repr__(self) -> str:
        return f"<QueueItem id={self.id!r} attempt={self.attempt} failures={self.failures}>"


class Consumer(Protocol):
    """What the deal needs of a consumer (consumer.py's ``QueueSub``)."""

    lane: deque[QueueItem]
    outstanding: dict[int, Any]

    def credit(self) -> int: ...


class QueueHome(Protocol):
    """Where the waiting items of queues live when several nodes share them (a broker's)."""

    def adopt(self, q: QueueTopic) -> None:
        """``q`` is made on this node: hear about its items from now on."""

    def free(self, q: QueueTopic) -> int:
        """New items ``q`` may take now, as this node knows it."""

    def put(self, q: QueueTopic, item: QueueItem) -> None:
        """Send a new item home; raises ``QueueFull`` or ``BrokerUnavailable`` (nothing sent)."""

    def settle(
        self, q: QueueTopic, items: list[QueueItem], dest: QueueTopic | None, head: bool
    ) -> None:
        """``items`` of ``q`` leave this node: to ``dest``'s head (``head``: given back) or
        tail (dead-lettered), or nowhere (ACKed, dropped). Never refused."""

    def want(self, q: QueueTopic) -> None:
        """The consumers of ``q`` here may have free prefetch, or less than it holds."""

    def waiting(self, q: QueueTopic) -> int:
        """Items of ``q`` waiting at home, as this node knows it."""

    def withdraw(self, q: QueueTopic, item: QueueItem) -> bool:
        """``item``, given back, was ACKed before it was delivered again: True when its give-back
        had not left this node (cancelled: the item is in this node's custody again, or waits
        in ``q.ready``/a lane), False when it is home's to settle if it still waits there."""


@dataclass
class QueueStats:
    """Counters since start (and, in a snapshot, the gauges ``waiting``, ``outstanding``,
    ``consumers``); ``Rubris.queue_stats(name)`` and ``Rubris.stats().queues`` expose them."""

    enqueued: int = 0
    duplicates: int = 0
    """Items refused because their ``id`` was seen within the dedup window."""
    delivered: int = 0
    acked: int = 0
    nacked: int = 0
    requeued: int = 0
    """Items given back to the head: NACK with requeue and lost consumers."""
    revoked: int = 0
    """Deliveries taken back by server-side CoDel."""
    late_acked: int = 0
    """Revoked items whose ACK came before they were delivered again: settled, not run again
    (counted in ``acked`` too)."""
    dead_lettered: int = 0
    """Items past the delivery limit or NACKed without requeue (moved or dropped)."""
    dropped: int = 0
    """Dead-lettered items with no dead-letter queue, or whose dead-letter queue was full."""
    flows: int = 0
    """FLOW messages sent to the sessions that PUBLISH items here (the queue's fill)."""
    waiting: int = 0
    outstanding: int = 0
    consumers: int = 0

    def add(self, other: QueueStats) -> None:
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(self, name) + getattr(other, name))


class QueueTopic:
    """A queue topic (mode 4); ``put`` is O(1), ``deal`` runs in the scheduler's cycle."""

    __slots__ = (
        "name",
        "number",
        "codec",
        "epoch",
        "settings",
        "compress_at",
        "ready",
        "consumers",
        "active",
        "dirty",
        "ids",
        "stats",
        "dead_letter",
        "waiters",
        "on_item_end",
        "home",
        "producers",
        "encode_item",
        "app",
        "pattern",
        "_on_dirty",
    )

    def __init__(
        self,
        name: str,
        number: int,
        *,
        epoch: int,
        codec: int,
        settings: QueueSettings,
        compress_at: int | None,
        on_dirty: Callable[[QueueTopic], None],
        on_item_end: Callable[[str, bool], None] | None = None,
        home: QueueHome | None = None,
    ) -> None:
        self.name = name
        self.number = number
        self.codec = codec
        self.epoch = epoch
        self.settings = settings
        self.compress_at = compress_at
        self.ready: deque[QueueItem] = deque()
        self.consumers: deque[Any] = deque()
        """Subscribed consumers in rotation order: the next to be offered an item first."""
        self.active: dict[Any, None] = {}
        """Consumers with deliveries out (or CoDel state to settle): what ``tick`` visits, so
        an idle consumer costs nothing between deliveries."""
        self.dirty = False
        self.ids = IdWindow(settings.dedup_window, settings.dedup_max)
        self.stats = QueueStats()
        self.dead_letter: QueueTopic | None = None
        """Where items past the delivery limit go (resolved from ``settings.dead_letter``)."""
        self.waiters: deque[Callable[[], None]] = deque()
        """Producers waiting for room (``Rubris.put``): called, and forgotten, when it frees."""
        self.on_item_end = on_item_end
        """Told ``(batch_item, failed)`` when an item carrying one ends: ACKed (done) or
        dead-lettered (failed)."""
        self.home = home
        """Where the waiting items live when nodes share them (``rehome``); None alone."""
        self.producers: QueueProducers | None = None
        """The sessions that PUBLISHed items here lately and the FLOW level they were told
        (producers.py); made by the engine at the first client PUBLISH."""
        self.encode_item: ItemEncoder = item_encoder(number)
        """Its deliveries' ITEM bytes, the topic's uv worked out once (frames.py sends them)."""
        self.app = False
        """Named by the application (``Rubris.enqueue``, the HTTP API, a dead-letter queue):
        never retired. A queue only clients made is (``Engine.retire``)."""
        self.pattern = ""
        """Its channel's pattern (what ``max_topics`` of a channel counts)."""
        self._on_dirty = on_dirty

    def rehome(self, home: QueueHome | None) -> None:
        """Keep the waiting items at ``home`` from now on (a broker's, as the engine joins
        other nodes: it adopts the topic and takes what waits here), or here again (None)."""
        self.home = home
        if home is not None:
            home.adopt(self)

    # producing

    def room(self, n: int = 1) -> bool:
        return self.free() >= n

    def free(self) -> int:
        """New items this queue takes now."""
        if self.home is not None:
            return self.home.free(self)
        return self.settings.max_length - len(self.ready)

    def duplicate(self, item_id: str | None, now: float) -> bool:
        """Whether ``item_id`` was enqueued within the dedup window (counted), else records it."""
        if item_id is None or not self.ids.seen(item_id, now):
            return False
        self.stats.duplicates += 1
        return True

    def put(self, item: QueueItem) -> None:
        """Append a new item; raises ``QueueFull`` at ``max_length`` (nothing changed)."""
        if self.home is not None:
            self.home.put(self, item)  # counted as enqueued when home takes it
            return
        if len(self.ready) >= self.settings.max_length:
            raise QueueFull(f"queue {self.name!r} is full ({self.settings.max_length} waiting)")
        self.ready.append(item)
        self.stats.enqueued += 1
        self.touch()

    def touch(self) -> None:
        """Something changed that a deal may act on: items, or a consumer's free prefetch."""
        if self.home is not None:
            self.home.want(self)
        if not self.dirty and self.consumers:
            self.dirty = True
            self._on_dirty(self)

    # giving back

    def requeue(self, items: list[QueueItem]) -> None:
        """Put ``items`` back at the head, in their order: they are delivered next."""
        if not items:
            return
        if self.home is not None:
            self.home.settle(self, items, self, True)  # the next to be taken, by any node
        else:
            self.ready.extendleft(reversed(items))
        self.touch()

    def withdraw(self, item: QueueItem) -> bool:
        """Take ``item`` out of the queue if it waits here undelivered (given back, not yet
        sent again): True when it was, and it is then this node's again, to settle."""
        if self.home is not None and not self.home.withdraw(self, item):
            return False  # not here: the home settles it itself if it still can
        # given-back items wait at the head, where remove() starts (items compare by identity)
        for waiting in (self.ready, *(c.lane for c in self.consumers)):
            try:
                waiting.remove(item)
            except ValueError:
                continue
            return True
        return self.home is not None  # its give-back never left this node

    def failed(self, item: QueueItem) -> bool:
        """A delivery of ``item`` ended in NACK or a lost consumer: True when the item goes
        back to the queue, False when it was dead-lettered for passing the delivery limit."""
        item.failures += 1
        if item.failures >= self.settings.delivery_limit:
            self.dead(item)
            return False
        self.stats.requeued += 1
        return True

    def dead(self, item: QueueItem) -> None:
        """Move ``item`` to the dead-letter queue (its attempts carry on counting) or drop it.

        Its batch item (if any) fails here, whatever the dead-letter queue does with it later.
        """
        self.stats.dead_lettered += 1
        if item.batch_item is not None:
            if self.on_item_end is not None:
                self.on_item_end(item.batch_item, True)
            item.batch_item = None
        dl = self.dead_letter
        if dl is None or not dl.room():
            self.stats.dropped += 1
            dl = None
        else:
            item.failures = 0  # the dead-letter queue's own delivery limit starts afresh
        if self.home is not None:
            self.home.settle(self, [item], dl, False)
        elif dl is not None:
            dl.put(item)

    # the deal (in the cycle)

    def deal(self, on_dealt: Callable[[Any], None]) -> None:
        """Hand waiting items to consumers with free prefetch, one each in rotation."""
        ready = self.ready
        consumers: deque[Consumer] = self.consumers
        if ready and consumers:
            # each consumer's free prefetch once, then rounds of one item each in rotation
            order: list[Consumer] = []
            credit: list[int] = []
            for c in consumers:
                k = c.credit()
                if k > 0:
                    order.append(c)
                    credit.append(k)
            touched = order[: len(ready)]
            last: Consumer | None = None
            while ready and order:
                more: list[Consumer] = []
                left: list[int] = []
                for c, k in zip(order, credit, strict=True):
                    if not ready:
                        break
                    c.lane.append(ready.popleft())
                    last = c
                    if k > 1:
                        more.append(c)
                        left.append(k - 1)
                order, credit = more, left
            if last is not None:
                # the rotation goes on after the last consumer served
                consumers.rotate(-(consumers.index(last) + 1))
            for c in touched:
                on_dealt(c)
        if self.waiters:
            self.wake_waiters()

    def wake_waiters(self) -> None:
        """Let as many waiting producers on as there is room for."""
        free = self.free()
        while self.waiters and free > 0:
            self.waiters.popleft()()
            free -= 1

    def snapshot(self) -> QueueStats:
        out = QueueStats(**{k: getattr(self.stats, k) for k in self.stats.__dataclass_fields__})
        out.waiting = len(self.ready) + sum(len(c.lane) for c in self.consumers)
        out.outstanding = sum(len(c.outstanding) for c in self.consumers)
        out.consumers = len(self.consumers)
        if self.home is not None:
            out.waiting += self.home.waiting(self)
        return out

    def __repr__(self) -> str:
        return (
            f"<QueueTopic {self.name!r} #{self.number} waiting={len(self.ready)} "
            f"consumers={len(self.consumers)}>"
        )
