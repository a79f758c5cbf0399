"""``RedisQueues``: work-queue topics whose items wait in Redis, for the consumers of every node.

A ``RedisBroker`` makes it every queue topic's *home* (``QueueHome``, queues/topic.py). What
the engine does alone stays as it is, item by item; only where an item waits changes:

- **Enqueue.** A new item is encoded and deflated once, on the node where it is made, and joins
  this node's outbox; one script per batch (``ENQUEUE``) checks each id against the dedup
  window shared by all nodes and appends the item to the queue's list in Redis. A batch whose
  answer was lost is sent again under the same id and answered from its first run.
- **Taking.** A node takes items for its consumers' free prefetch, no more (``TAKE``): they move
  from the list into the node's *custody* in Redis (a hash per queue and node) and into the
  queue's ``ready`` here, and the scheduler deals them as ever. Nodes hear a queue's new length
  on its channel whenever it grows, so a node with room takes at once; every second each node
  also reads the lengths, in case a message was lost with a connection.
- **Settling.** An item leaves the custody when its delivery ends: ACKed (gone), given back
  (NACK, a lost consumer, REVOKE: to the head of the list, for any node), dead-lettered (to the
  tail of the dead-letter queue's list) or dropped. One script per batch (``SETTLE``). Items
  this node took but can no longer deal (a consumer left meanwhile) go back the same way.
- **A node that dies.** Every node beats every second (``BEAT``); a node silent for
  ``node_timeout`` is taken for dead by the next node to beat, and the items in its custody go
  back to the head of their queues, one failure more each (as for a lost consumer: a poison
  item that kills its nodes is dead-lettered in the end). A node that stops gives back what it
  held as it is.

Delivery is at least once, as on one node: an item is done twice only if its consumer worked it
and the ACK never reached Redis (the node died first, or was cut off from Redis for longer than
``node_timeout`` while its consumer worked).

Bounds: the outbox holds at most the broker's ``outbox_messages`` new items (``BrokerUnavailable``
beyond, and while Redis is unreachable); ``max_length`` is checked against the length this node
last heard plus what it has not sent yet, so nodes together may pass it by what they had in
flight; given-back items are never refused. A node holds at most its consumers' prefetch.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import orjson

from ...engine.queues import QueueItem, QueueTopic
from ...errors import BrokerUnavailable, QueueFull
from . import queues_lua as scripts
from .nodes import RETRIED
from .outbox import Outbox
from .reach import Reach, end_if_cancelled
from .replicas import Replicas

if TYPE_CHECKING:
    from redis.asyncio import Redis

    from ...engine.membership import EngineEvents

log = logging.getLogger("rubris_asgi.broker")

BATCH = 256
"""Items in one script call at most."""
TAKE_MAX = 256
"""Items one take moves at most."""
SPARE_S = 0.005
"""Seconds of its consumers' work a node keeps ready at least (at their measured rate)."""
PENDING_MAX = 1024
"""New items of one queue waiting to be sent from one node at most: what bounds how far the
nodes together may pass a queue's ``max_length`` (each checks the length it last heard)."""
BEAT = 1.0
"""Seconds between heartbeats (and length checks)."""
WITHDRAW_MAX = 4096
"""Withdrawals on their way to Redis at most (an ACK racing its REVOKE is rare); beyond, the
ACK is ignored, as for an item delivered again."""
AUDIT = 30.0
"""Seconds between checks of this node's custody in Redis against what it knows it holds."""


T = TypeVar("T")


class Carrier(Protocol):
    """What the queues need of their broker (``RedisBroker``)."""

    prefix: str
    node: str
    outbox: Outbox

    @property
    def redis(self) -> Redis: ...

    reach: Reach
    replicas: Replicas

    def require_durable(self, what: str) -> None: ...

    def accepting(self, messages: int, nbytes: int) -> bool: ...

    def listen(self, channel: str, handler: Callable[[bytes], None]) -> None: ...

    def background(self, coro: Any) -> None: ...


def encode_item(item: QueueItem) -> bytes:
    """The record of ``item`` in Redis (redis_queue_scripts: counts first)."""
    meta = orjson.dumps([item.id, item.batch_item])
    head = b"%d:%d:%s:%d:" % (item.failures, item.attempt, str(item.key).encode(), item.compressed)
    return head + meta + b"\n" + item.payload


def decode_item(record: bytes, now: float) -> QueueItem:
    failures, attempt, key, flag, rest = record.split(b":", 4)
    meta, _, payload = rest.partition(b"\n")
    item_id, batch_item = orjson.loads(meta)
    item = QueueItem(payload, flag == b"1", item_id, now, batch_item)
    item.failures = int(failures)
    item.attempt = int(attempt)
    item.key = key.decode()
    return item


class _View:
    """What this node knows of one queue in Redis."""

    __slots__ = ("q", "length", "version", "pending", "taking", "rate", "rtt", "acked")

    def __init__(self, q: QueueTopic) -> None:
        self.q = q
        self.length = -1
        """Items waiting in Redis when last heard (-1: not known yet)."""
        self.version = 0
        """The version of ``length``: news of an older one is stale."""
        self.pending = 0
        """New items in this node's outbox."""
        self.taking = 0
        """Items asked for by a take on its way (one at a time per queue; -1: an audit)."""
        self.rate = 0.0
        """Items this node's consumers ACK a second (over the last beat)."""
        self.rtt = 0.001
        """Seconds a take takes (a moving mean)."""
        self.acked = q.stats.acked


class RedisQueues:
    """The home of every queue topic of one node that shares a Redis with others."""

    def __init__(self, broker: Carrier, node_timeout: float) -> None:
        self.broker = broker
        self.prefix = broker.prefix
        self.node = broker.node
        self.lapse_ms = str(int(node_timeout * 1000))
        # no heartbeat from any node for this long: Redis was away, nobody is taken for dead
        self.pause_ms = str(int(min(node_timeout / 2, 2.5 * BEAT) * 1000))
        self.taken = 0
        """Items taken from Redis for this node's consumers."""
        self.reclaimed = 0
        """Items of dead nodes this node gave back to their queues."""
        self.forfeited = 0
        """Times this node found itself taken for dead by the others (its items given back)."""
        self._events: EngineEvents | None = None
        self._clock: Callable[[], float] = time.monotonic
        self._started = False
        self._views: dict[str, _View] = {}
        self._puts: deque[tuple[QueueTopic, QueueItem, bytes]] = deque()
        self._settles: deque[tuple[bytes, ...]] = deque()
        self._settling: list[tuple[bytes, ...]] = []
        """The settles on their way to Redis (the custody still holds them)."""
        self._withdrawing: dict[bytes, tuple[QueueTopic, QueueItem]] = {}
        """Given-back items ACKed after all, by key, until Redis says whether they waited."""
        self._audited = 0.0
        self._keys = itertools.count(1)
        self._batches = itertools.count(1)
        self._takes = itertools.count(1)
        self._wanting: dict[QueueTopic, None] = {}
        self._wake = asyncio.Event()
        self._want = asyncio.Event()
        self._emptied = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._scripts: dict[str, Any] = {}

    # life

    async def start(self, events: EngineEvents) -> None:
        """Join the nodes' table; the queues come through ``adopt`` (``Engine.join``)."""
        redis = self.broker.redis
        for name in ("ENQUEUE", "TAKE", "SETTLE", "BEAT", "AUDIT"):
            self._scripts[name] = redis.register_script(getattr(scripts, name))
        self._clock = events.clock
        self._events = events
        try:  # this node in the table of live nodes, and a first look for dead ones
            await self._scripts["BEAT"](
                args=[self.prefix, self.node, self.lapse_ms, "0", self.pause_ms]
            )
        except RETRIED as exc:
            raise BrokerUnavailable(f"cannot use Redis at start: {exc}") from exc
        self._started = True
        self._tasks = [
            asyncio.create_task(self._write_loop(), name="rubris-queues-writer"),
            asyncio.create_task(self._take_loop(), name="rubris-queues-taker"),
            asyncio.create_task(self._beat_loop(), name="rubris-queues-beat"),
        ]

    async def stop(self, flush: float) -> None:
        """Give back what this node took, send what waits (for at most ``flush`` seconds),
        leave the nodes' table and stop."""
        if not self._started:
            return
        for q in [v.q for v in self._views.values()]:
            if q.home is self and q.ready:
                back, q.ready = list(q.ready), deque()
                self.settle(q, back, q, True)
        if self._puts or self._settles:
            self._emptied.clear()
            self._wake.set()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._emptied.wait(), flush)
        if self._puts:
            log.error("Redis broker stopped with %d queue items not sent", len(self._puts))
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks = []
        with contextlib.suppress(Exception):  # what it still holds goes back as it is
            await asyncio.wait_for(
                self._call("BEAT", [self.prefix, self.node, self.lapse_ms, "1"]), flush
            )
        self._started = False  # the engine leaves next: its queues keep their items again

    @property
    def down(self) -> bool:
        """Redis unreachable, as the latest call of any part of the node found it (one
        state for the whole broker: whichever call gets through first ends it)."""
        return not self.broker.reach.up

    @property
    def pending(self) -> int:
        """New items waiting to be sent to Redis."""
        return len(self._puts)

    # the engine's side (QueueHome)

    def adopt(self, q: QueueTopic) -> None:
        if q.name not in self._views:
            self._views[q.name] = _View(q)
            self.broker.listen(self.prefix + "qc:" + q.name, functools.partial(self.heard, q.name))
        early, q.ready = list(q.ready), deque()  # made before the start: its items move home
        for item in early:
            self._send(q, item)

    def free(self, q: QueueTopic) -> int:
        v = self._views[q.name]
        room = min(self.broker.outbox.messages - len(self._puts), PENDING_MAX - v.pending)
        return min(q.settings.max_length - max(v.length, 0) - v.pending, room)

    def waiting(self, q: QueueTopic) -> int:
        v = self._views[q.name]
        return max(v.length, 0) + v.pending

    def put(self, q: QueueTopic, item: QueueItem) -> None:
        # an item accepted is promised to a consumer: never into a Redis that would lose it
        self.broker.require_durable("work-queue items")
        if not self.broker.reach.up:  # Redis away or refusing writes (this module's calls too)
            why = self.broker.reach.reason or "Redis is unreachable"
            raise BrokerUnavailable(f"{why}: item refused, try again shortly")
        if self.free(q) < 1:
            v = self._views[q.name]
            if v.pending >= PENDING_MAX or len(self._puts) >= self.broker.outbox.messages:
                raise QueueFull(f"queue {q.name!r}: too many items on their way to Redis")
            raise QueueFull(f"queue {q.name!r} is full ({q.settings.max_length} waiting)")
        self._send(q, item)

    def _send(self, q: QueueTopic, item: QueueItem) -> None:
        item.key = f"{self.node}.{next(self._keys):012x}"
        self._puts.append((q, item, encode_item(item)))
        self._views[q.name].pending += 1
        self._wake.set()

    def settle(
        self, q: QueueTopic, items: list[QueueItem], dest: QueueTopic | None, head: bool
    ) -> None:
        name = q.name.encode()
        to = b"" if dest is None else dest.name.encode()
        how = b"h" if head else b"t"
        for item in reversed(items) if head else items:  # pushed to the head one by one
            record = b"" if dest is None else encode_item(item)
            self._settles.append((name, str(item.key).encode(), to, how, record))
        if dest is not None and dest is not q:
            dest.stats.enqueued += len(items)
        self._wake.set()

    def withdraw(self, q: QueueTopic, item: QueueItem) -> bool:
        """A given-back ``item`` was ACKed (it had been started as its REVOKE travelled): cancel
        its give-back if it has not left this node (True: it is in the custody still, and the
        ACK's settle ends it), else take it out of the queue in Redis if no node took it
        meanwhile (False: counted as acked when Redis says it was still there)."""
        name, key = q.name.encode(), str(item.key).encode()
        settles = self._settles
        for i, op in enumerate(settles):
            if op[1] == key and op[0] == name and op[3] == b"h":
                del settles[i]
                return True
        if len(self._withdrawing) < WITHDRAW_MAX:
            self._withdrawing[key] = (q, item)
            settles.append((name, key, name, b"w", encode_item(item)))
            self._wake.set()
        return False

    def _withdrawn(self, keys: list[Any], ops: list[tuple[bytes, ...]]) -> None:
        """The answer to withdrawals: the items named were still waiting, now ACKed."""
        for key in keys:
            k = key if isinstance(key, bytes) else str(key).encode()
            found = self._withdrawing.pop(k, None)
            if found is None:
                continue
            q, item = found
            q.stats.acked += 1
            q.stats.late_acked += 1
            if item.batch_item is not None and q.on_item_end is not None:
                q.on_item_end(item.batch_item, False)
        for op in ops:  # the others had been taken again: their next delivery settles them
            if op[3] == b"w":
                self._withdrawing.pop(op[1], None)

    def want(self, q: QueueTopic) -> None:
        self._wanting[q] = None
        self._want.set()

    # Redis's side

    def heard(self, name: str, data: bytes) -> None:
        """A queue's new ``length:version``, on its channel (``P qc:NAME``) or in an answer."""
        v = self._views.get(name)
        if v is None:
            return
        length, _, version = data.partition(b":")
        if int(version) <= v.version:
            return  # older news than what this node knows
        v.length, v.version = int(length), int(version)
        if v.q.consumers:
            self.want(v.q)
        if v.q.waiters:
            v.q.wake_waiters()

    def reconnected(self) -> None:
        """The connection to Redis is back: what was heard meanwhile is lost, ask again."""
        self._audited = 0.0  # a take's answer may have been lost: check the custody soon
        for v in self._views.values():
            v.length, v.version = -1, 0
            if v.q.consumers:
                self.want(v.q)

    async def _call(self, script: str, args: list[Any]) -> Any:
        """Run a script until Redis answers it (the same arguments: each is idempotent)."""
        return await self.broker.reach.until_answered(
            lambda: self.broker.replicas.run(self.broker.redis, self._scripts[script], args=args),
            "queues",
        )

    def _lengths(self, answer: list[Any], start: int) -> None:
        """``name, length`` pairs at the end of a script's answer."""
        for i in range(start, len(answer) - 1, 2):
            name = answer[i].decode() if isinstance(answer[i], bytes) else str(answer[i])
            data = answer[i + 1]
            self.heard(name, data if isinstance(data, bytes) else str(data).encode())

    async def _write_loop(self) -> None:
        puts, settles = self._puts, self._settles
        while True:
            if not puts and not settles:
                self._emptied.set()
                self._wake.clear()
                await self._wake.wait()
            if puts:
                await self._send_puts([puts[i] for i in range(min(BATCH, len(puts)))])
            if settles:
                ops = self._settling = [settles.popleft() for _ in range(min(BATCH, len(settles)))]
                args: list[Any] = [self.prefix, self.node]
                for (name, to, how), run in itertools.groupby(
                    ops, lambda op: (op[0], op[2], op[3])
                ):
                    items = list(run)
                    args += (name, to, how, len(items))
                    for op in items:
                        args.append(op[1])
                        if to:
                            args.append(op[4])
                try:
                    answer = await self._call("SETTLE", args)
                    n = int(answer[0])
                    self._withdrawn(answer[1 : 1 + n], ops)
                    self._lengths(answer, 1 + n)
                except Exception:  # a script error: a bug, never a reason to stop
                    end_if_cancelled()
                    log.exception("Redis refused to settle %d queue items", len(ops))
                self._settling = []

    async def _send_puts(self, batch: list[tuple[QueueTopic, QueueItem, bytes]]) -> None:
        args: list[Any] = [self.prefix, f"{self.node}:{next(self._batches)}"]
        for q, run in itertools.groupby(batch, lambda put: put[0]):
            items = list(run)
            s = q.settings
            args += (q.name, int(s.dedup_window * 1000), s.dedup_max, len(items))
            for _, item, record in items:
                args += (item.id or "", record)
        try:
            answer = await self._call("ENQUEUE", args)
        except Exception:
            end_if_cancelled()
            log.exception("Redis refused a batch of %d queue items; they are dropped", len(batch))
            answer = [1] * len(batch)
        for _ in batch:
            self._puts.popleft()
        for (q, item, _), fresh in zip(batch, answer, strict=False):
            self._views[q.name].pending -= 1
            if int(fresh):
                q.stats.enqueued += 1
                continue
            # another node enqueued this id first: the same work, which ends there
            q.stats.duplicates += 1
            if item.batch_item is not None and q.on_item_end is not None:
                q.on_item_end(item.batch_item, False)
        self._lengths(answer, len(batch))

    async def _take_loop(self) -> None:
        while True:
            await self._want.wait()
            self._want.clear()
            wanting, self._wanting = self._wanting, {}
            for q in wanting:
                self._reconcile(q)

    def _reconcile(self, q: QueueTopic) -> None:
        """Keep ``q.ready`` at what this node's consumers have room for plus one prefetch of
        each (so an ACK is followed by the next item without waiting for Redis): take when
        it falls to half of that, give back beyond it (consumers left)."""
        v = self._views[q.name]
        if v.taking:
            return  # its answer wants again
        room = 0
        for c in q.consumers:
            if c.live:
                room += max(c.credit(), 0)
        # what the consumers here finish in two takes' time, or 5 ms: an ACK is then followed
        # by the next item without waiting for Redis, each take moves many items, and slow
        # consumers (long jobs: rounded down to none) hoard nothing that another node's idle
        # consumers could start
        spare = min(TAKE_MAX, int(v.rate * max(2 * v.rtt, SPARE_S))) if room or q.ready else 0
        target = room + spare
        have = len(q.ready)
        if have > target + spare:
            back = [q.ready.pop() for _ in range(have - target)]
            back.reverse()
            self.settle(q, back, q, True)
        elif 2 * have < target or have < room:
            if v.length != 0 and not self.down:
                v.taking = min(target - have, TAKE_MAX)
                self.broker.background(self._take(q, v))

    async def _take(self, q: QueueTopic, v: _View) -> None:
        args = [self.prefix, self.node, str(next(self._takes)), q.name, v.taking]
        began = self._clock()
        try:
            answer = await self._call("TAKE", args)
        except Exception:
            log.exception("Redis refused a take from %s", q.name)
            return
        finally:
            v.taking = 0
        self.heard(q.name, answer[0])
        now = self._clock()
        v.rtt += 0.25 * (now - began - v.rtt)
        fresh = []
        for record in answer[1:]:
            item = decode_item(record, now)
            if item.failures >= q.settings.delivery_limit:
                q.dead(item)  # its consumers kept dying with it
            else:
                fresh.append(item)
        self.taken += len(fresh)
        q.ready.extend(fresh)
        q.touch()  # the deal, and this node's wants again
        if q.waiters:
            q.wake_waiters()

    def _holding(self, q: QueueTopic) -> list[str]:
        """The keys of the items of ``q`` this node knows it holds."""
        keys = [str(i.key) for i in q.ready]
        for c in q.consumers:
            keys += (str(i.key) for i in c.lane)
            keys += (str(i.key) for i, _ in c.outstanding.values())
        name = q.name.encode()
        keys += (op[1].decode() for op in (*self._settles, *self._settling) if op[0] == name)
        return keys

    async def _audit(self, v: _View) -> None:
        """Give back what this node's custody of ``v``'s queue holds and it does not know of."""
        if v.taking:
            return
        v.taking = -1  # no take meanwhile: its items would be in Redis and not yet known here
        try:
            args = [self.prefix, self.node, v.q.name, *self._holding(v.q)]
            answer = await self._scripts["AUDIT"](args=args)
        finally:
            v.taking = 0
        if int(answer[0]):
            log.warning(
                "%d items of %s were held for this node unknown to it: given back",
                int(answer[0]),
                v.q.name,
            )
            self._lengths(answer, 1)
        self.want(v.q)

    def _taken_for_dead(self) -> None:
        """This node was missing from the nodes' table when it beat: another took it for
        dead (it was paused, or cut off from Redis, past ``node_timeout``) and gave every item
        in its custody back to the queues. None of them is this node's to deal or settle any
        more (``EngineEvents.forfeit``)."""
        events = self._events
        if events is None:
            return
        log.warning(
            "this node was taken for dead by the others (silent past node_timeout): the queue "
            "items it held were given back; its consumers' deliveries are revoked"
        )
        self.forfeited += 1
        for v in self._views.values():
            q = v.q
            if q.home is not self:
                continue
            back = [*q.ready, *events.forfeit(q)]
            q.ready = deque()
            # to the head of the queue where this node still holds them (taken after it came
            # back); the ones the others gave back are no longer in its custody, and SETTLE
            # leaves them alone: none is delivered here again with its stale attempt
            if back:
                self.settle(q, back, q, True)
            self.want(q)

    async def _beat_loop(self) -> None:
        redis = self.broker.redis
        while True:
            await asyncio.sleep(BEAT)
            try:
                answer = await self._scripts["BEAT"](
                    args=[self.prefix, self.node, self.lapse_ms, "0", self.pause_ms]
                )
                if not self.broker.reach.up:
                    self.broker.reach.answered()  # Redis answers again: what waits is sent at once
                if int(answer[0]):
                    self.reclaimed += int(answer[0])
                    log.warning("%d queue items of dead nodes given back", int(answer[0]))
                if int(answer[1]):
                    self._taken_for_dead()
                self._lengths(answer, 2)
                views = list(self._views.values())
                for v in views:
                    acked = v.q.stats.acked
                    v.rate, v.acked = (acked - v.acked) / BEAT, acked
                if self._started and self._clock() - self._audited >= AUDIT:
                    self._audited = self._clock()
                    for v in views:
                        await self._audit(v)
                if views:
                    pipe = redis.pipeline(transaction=True)  # each length with its version
                    for v in views:
                        pipe.llen(self.prefix + "q:" + v.q.name)
                        pipe.get(self.prefix + "qv:" + v.q.name)
                    got = await pipe.execute()
                    for v, n, version in zip(views, got[::2], got[1::2], strict=True):
                        self.heard(v.q.name, b"%d:%d" % (n, int(version or 0)))
            except (*RETRIED, BrokerUnavailable):
                # the next beat tries again (the writer's retries say when Redis is back); a
                # BrokerUnavailable here only waited for a free connection of this node's
                end_if_cancelled()
                continue
            except Exception:
                end_if_cancelled()
                log.exception("queue heartbeat failed")
