"""``RedisQueues``: work-queue topics whose items wait in Redis, for the consumers of every node.

A ``RedisBroker`` makes it every queue topic's *home* (``QueueHome``, queues/topic.py). What
the engine does alone stays as it is, item by item; only where an item waits changes:

- **Enqueue.** A new item is encoded and deflated once, on the node where it is made, and joins
  this node's outbox; the new items of one queue go to Redis together as one *run* (one list
  element, lua.py), checked id by id against the dedup window shared by all nodes.
- **Taking.** A node takes items for its consumers' free prefetch and a spare, no more: whole
  runs from the head of the list, the last one cut to size, move into the node's *custody* in
  Redis (a hash per queue and node, a *piece* per run taken) and into the queue's ``ready``
  here, and the scheduler deals them as ever. Nodes hear a queue's new length on its channel
  whenever it grows, so a node with room takes at once; every second each node also reads the
  lengths, in case a message was lost with a connection.
- **Settling.** An item leaves the custody when its delivery ends: ACKed or dropped (its bit in
  its piece's *marks* is set; the piece leaves with its last item), given back (NACK, a lost
  consumer, REVOKE: to the head of the list, for any node), dead-lettered (to the tail of the
  dead-letter queue's list). Items this node took but can no longer deal (a consumer left
  meanwhile) go back the same way.
- **One round trip.** Whatever the node has to send (settles, new items, takes, an audit) goes
  in one script call (``CYCLE``), one call at a time and at most one a millisecond unless much
  waits or a consumer starves: what comes meanwhile waits for the next, so the calls grow with
  the load and their fixed cost (about 50 us of this node's CPU a call through redis-py, as
  much as a hundred items' own) is shared by all they carry. Items a node takes back from a
  run it made are dealt as the very items it put (hand.py), not decoded again.
- **A node that dies.** Every node beats every second (``BEAT``); a node silent for
  ``node_timeout`` is taken for dead by the next node to beat, and the items in its custody
  that had not ended go back to the head of their queues, one failure more each (as for a lost
  consumer: a poison item that kills its nodes is dead-lettered in the end). A node that stops
  gives back what it held as it is.

Delivery is at least once, as on one node: an item is done twice only if its consumer worked it
and the ACK never reached Redis (the node died first, or was cut off from Redis for longer than
``node_timeout`` while its consumer worked).

Why the batching keeps that exact. (It was made for ``bench/queues_redis.py``, where a script
call per take, per 256 new items and per 256 settles, each an item a list element, a hash field
and an argument, held a node to 40 % of its rate alone; docs/benchmarks.md has the figures.)

- *A call runs whole, and sent again after a lost answer it does nothing twice.* Redis runs a
  script with nothing between its commands; a call whose answer was lost is sent again with the
  same arguments until Redis answers (``Reach.until_answered``), and its first run left
  ``P qy:NODE:CALL`` for a minute: the repeat answers its duplicates and withdrawals from it and
  its takes from the pieces still held, and sets, pushes and takes nothing. Even without that,
  marks are bits: an item ended twice is ended once, and a piece leaves the custody only when
  every one of its items has its bit (the count of bits set, not of marks sent); a give-back
  pushes its item only if it sets its bit.
- *One call at a time keeps the node's order.* A give-back and the withdrawal that follows it,
  two give-backs to the head, new items: each is sent after what was made before it, and no
  later call can pass an earlier one on another connection.
- *An item is in one place.* This node knows each item it holds by its piece and place
  (``_where``, one entry an item from its take to its settle), so it sends one mark or one move
  per item delivery, never two; a give-back cancelled by a late ACK puts the entry back, and
  the ACK takes it again. A new item's record has no key (it is never looked for); an item
  given back gets one no other waiting item has, by which its withdrawal finds it.
- *Runs change no count.* A run carries its records unchanged; ``P ql:NAME`` counts the items
  (every script that moves items changes it in the same run), so ``max_length``, FLOW and the
  takes see items, not runs. A take moves whole runs and cuts only the last, so it moves
  exactly what it asked for (or all there is): a node never holds more than it asked.
- *An audit sees what the node knew when the call left.* It goes in the call, after that call's
  settles and before its takes, and one call at a time means every earlier take's answer is in:
  the pieces it gives back are ones no item here comes from.
- *An item dealt from hand is the item its record says.* A node keeps the items of its latest
  runs (hand.py); taking a piece of one back, it deals them instead of decoding the records
  only when each record taken is, byte for byte, the one the item was put as (a record says
  all an item is: counts, id, batch item, payload), and deals each such item once.
- *Waiting changes nothing but when.* The millisecond a call may wait (``CALL_EVERY``) delays
  an ACK's arrival in Redis by as much (the window in which a node's death has an item done
  twice), never its order; a take is never put off while its queue has nothing ready here.
- *A take wanted while Redis seems away is still made.* It goes in the next call, which waits
  for Redis like any other (dropping it, as takes once were, left a consumer with room starving
  once Redis answered: nothing asked again).

Bounds: the outbox holds at most the broker's ``outbox_messages`` new items (``BrokerUnavailable``
beyond, and while Redis is unreachable); ``max_length`` is checked against the length this node
last heard plus what it has not sent yet, so nodes together may pass it by what they had in
flight; given-back items are never refused. A node holds at most its consumers' prefetch and a
spare (``SPARE_S`` of their work, at most ``SPARE_MAX``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import itertools
import logging
import struct
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from ....engine.queues import QueueItem, QueueTopic
from ....errors import BrokerUnavailable, QueueFull
from ..nodes import RETRIED
from ..outbox import Outbox
from ..persistence import Persistence
from ..reach import Reach, end_if_cancelled
from ..replicas import Replicas
from . import lua as scripts
from .hand import Hand
from .runs import (
    DEFLATED,
    FLAG_AT,
    FRESH,
    FRESH_LEN,
    HEAD,
    PIECE_BITS,
    PLACE_BITS,
    PLACE_MASK,
    decode_item,
    encode_item,
    marks_of,
    piece_code,
    piece_name,
    run_of,
)

if TYPE_CHECKING:
    from redis.asyncio import Redis

    from ....engine.membership import EngineEvents

log = logging.getLogger("rubris_asgi.broker")

PUT_MAX = 1024
"""New items in one call at most (one run per queue among them)."""
CALL_EVERY = 0.001
"""Seconds from one call to the next at least, while little waits and no consumer starves: the
settles and new items of a millisecond share a call (measured: with 0.4 ms round trips and
consumers that hold 10 items, 2,100 calls a second of 30 items each cost the node more than
the items did)."""
CALL_FULL = 256
"""Settles and new items that make a call worth sending at once."""
MOVE_MAX = 1024
"""Give-backs, dead letters and withdrawals in one call at most."""
TAKE_MAX = 2048
"""Items one take moves at most."""
SPARE_S = 0.005
"""Seconds of its consumers' work a node keeps ready at least (at their measured rate)."""
SPARE_MAX = 2048
"""Items a node keeps ready beyond its consumers' free prefetch at most."""
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
assert TAKE_MAX < 1 << PLACE_BITS and TAKE_MAX < 1 << PIECE_BITS  # a take's pieces and places fit


class Carrier(Protocol):
    """What the queues need of their broker (``RedisBroker``)."""

    prefix: str
    node: str
    outbox: Outbox
    persistence: Persistence | None

    @property
    def redis(self) -> Redis: ...

    reach: Reach
    replicas: Replicas

    def require_durable(self, what: str) -> None: ...

    def accepting(self, messages: int, nbytes: int) -> bool: ...

    def listen(self, channel: str, handler: Callable[[bytes], None]) -> None: ...

    def background(self, coro: Any) -> None: ...


class _View:
    """What this node knows of one queue in Redis."""

    __slots__ = (
        "q",
        "length",
        "version",
        "records",
        "items",
        "first",
        "sending",
        "ided",
        "want",
        "most",
        "taking",
        "rate",
        "acked",
    )

    def __init__(self, q: QueueTopic) -> None:
        self.q = q
        self.length = -1
        """Items waiting in Redis when last heard (-1: not known yet)."""
        self.version = 0
        """The version of ``length``: news of an older one is stale."""
        self.records: list[bytes] = []
        """The records of the new items in this node's outbox, in order, until Redis has them."""
        self.items: list[QueueItem] = []
        """Their items, kept to be dealt as they are should this node take them (hand.py)."""
        self.first = 0
        """The number of ``records[0]`` (new items of this queue are numbered from 0)."""
        self.sending = 0
        """``records[:sending]`` are in the call on its way."""
        self.ided = 0
        """Items in ``items`` with an id or a batch item (what the dedup window checks, and a
        duplicate ends): most calls have none to look for."""
        self.want = 0
        """Items the next call takes (what ``_reconcile`` found missing)..."""
        self.most = 0
        """...and at most (with the spare: a run that fits is taken whole, not cut)."""
        self.taking = 0
        """Items asked for by the take on its way (in the call on its way)."""
        self.rate = 0.0
        """Items this node's consumers ACK a second (over the last beat)."""
        self.acked = q.stats.acked


class _Move:
    """An item leaving this node's custody for a list (or withdrawn from one), in order."""

    __slots__ = ("q", "piece", "at", "dest", "how", "key", "run", "item")

    def __init__(
        self, q: QueueTopic, piece: str, at: int, dest: str, how: bytes, item: QueueItem
    ) -> None:
        self.q = q
        self.piece = piece
        self.at = at
        self.dest = dest
        self.how = how
        self.key = str(item.key)
        """Unique among the items waiting in Redis: what a withdrawal finds it by."""
        self.run = run_of([encode_item(item)])
        self.item = item


class _Call:
    """What one ``CYCLE`` call carries, for its answer."""

    __slots__ = ("args", "runs", "moves", "takes")

    def __init__(self, args: list[Any]) -> None:
        self.args = args
        self.runs: list[tuple[_View, int, list[int], bytes]] = []
        """The queues whose new items it carries (``_View.sending`` of them each), each run's
        number, ends and bytes."""
        self.moves: list[_Move] = []
        self.takes: list[tuple[_View, int]] = []
        """The queues it takes from, and each take's number."""


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
        self.calls = 0
        """``CYCLE`` calls Redis answered."""
        self.calling = False
        """A ``CYCLE`` call is on its way."""
        self._events: EngineEvents | None = None
        self._clock: Callable[[], float] = time.monotonic
        self._started = False
        self._closing = False
        self._views: dict[str, _View] = {}
        self._unsent = 0
        """New items in the queues' outboxes (``_View.records``), Redis not having them yet."""
        self._filled: dict[_View, None] = {}
        """The queues with new items in their outbox."""
        self._settles: deque[_Move] = deque()
        """Give-backs, dead letters and withdrawals to send, in order."""
        self._marks: dict[tuple[QueueTopic, str], list[int]] = {}
        """ACKed and dropped items to send, by queue and piece: their places."""
        self._ending = 0
        """Items in ``_marks`` and ``_settles``."""
        self._wants: dict[_View, None] = {}
        """The queues the next call takes from (``_View.want``)."""
        self._began = 0.0
        """When the latest call left."""
        self._settling: list[_Move] = []
        self._marking: list[tuple[QueueTopic, str]] = []
        """The settles on their way to Redis (the custody holds them until it answers)."""
        self._where: dict[QueueItem, int] = {}
        """Every item this node holds in its custody: its piece and its place there, as one
        int (``PLACE_BITS``: no tuple an item for the garbage collector to follow)."""
        self._withdrawing: dict[str, tuple[QueueTopic, QueueItem]] = {}
        """Given-back items ACKed after all, by key, until Redis says whether they waited."""
        self._audited = 0.0
        self._audit = False
        """The next call audits this node's custody of every queue."""
        self._rtt = 0.001
        """Seconds a call takes (a moving mean)."""
        self._keys = itertools.count(1)
        self._key_prefix = self.node + "."
        self._mark = hashlib.blake2b(self.node.encode(), digest_size=6).digest()
        """This node's mark in the origin of the runs it makes."""
        self._runs = itertools.count(1)
        self._hand = Hand()
        """This node's latest runs in Redis, their items kept to be dealt again as they are."""
        self._durable: Persistence | None = None
        """The persistence Redis was found durable enough with (checked again when it changes)."""
        self._calls = itertools.count(1)
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
        for name in ("CYCLE", "BEAT"):
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
        self._closing = False
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
        self._closing = True  # nothing more is taken
        for q in [v.q for v in self._views.values()]:
            if q.home is self and q.ready:
                back, q.ready = list(q.ready), deque()
                self.settle(q, back, q, True)
        if not self.settled:
            self._emptied.clear()
            self._wake.set()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._emptied.wait(), flush)
        if self._unsent:
            log.error("Redis broker stopped with %d queue items not sent", self._unsent)
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
        return self._unsent

    @property
    def settled(self) -> bool:
        """Nothing waits to be sent to Redis, and nothing is on its way."""
        return not (self._unsent or self._settles or self._marks or self._settling or self._marking)

    # the engine's side (QueueHome)

    def adopt(self, q: QueueTopic) -> None:
        if q.name not in self._views:
            self._views[q.name] = _View(q)
            self.broker.listen(self.prefix + "qc:" + q.name, functools.partial(self.heard, q.name))
        early, q.ready = list(q.ready), deque()  # made before the start: its items move home
        v = self._views[q.name]
        for item in early:
            self._send(q, item, v)

    def free(self, q: QueueTopic) -> int:
        return self._free(q, self._views[q.name])

    def _free(self, q: QueueTopic, v: _View) -> int:
        pending = len(v.records)
        free = q.settings.max_length - pending - (v.length if v.length > 0 else 0)
        room = self.broker.outbox.messages - self._unsent
        if PENDING_MAX - pending < room:
            room = PENDING_MAX - pending
        return free if free < room else room

    def waiting(self, q: QueueTopic) -> int:
        v = self._views[q.name]
        return len(v.records) + (v.length if v.length > 0 else 0)

    def put(self, q: QueueTopic, item: QueueItem) -> None:
        broker = self.broker
        # an item accepted is promised to a consumer: never into a Redis that would lose it
        # (checked once for what Redis said of its persistence, not at every item)
        if broker.persistence is None or broker.persistence is not self._durable:
            broker.require_durable("work-queue items")
            self._durable = broker.persistence
        if not broker.reach.up:  # Redis away or refusing writes (this module's calls too)
            why = broker.reach.reason or "Redis is unreachable"
            raise BrokerUnavailable(f"{why}: item refused, try again shortly")
        v = self._views[q.name]
        if self._free(q, v) < 1:
            if len(v.records) >= PENDING_MAX or self._unsent >= broker.outbox.messages:
                raise QueueFull(f"queue {q.name!r}: too many items on their way to Redis")
            raise QueueFull(f"queue {q.name!r} is full ({q.settings.max_length} waiting)")
        self._send(q, item, v)

    def _send(self, q: QueueTopic, item: QueueItem, v: _View) -> None:
        records = v.records
        if item.id is not None or item.batch_item is not None:
            v.ided += 1
            records.append(encode_item(item))
        elif item.failures or item.attempt or item.key:
            records.append(encode_item(item))
        else:  # a new item, as most are: encode_item's first case without its call
            records.append(FRESH[item.compressed] + item.payload)
        v.items.append(item)
        self._unsent += 1
        if len(records) == 1:
            self._filled[v] = None
        if self._unsent == 1:  # else the writer has not gone to sleep since the first
            self._wake.set()

    def _key(self) -> str:
        """A key no other item waiting in Redis has."""
        return f"{self._key_prefix}{next(self._keys):x}"

    def settle(
        self, q: QueueTopic, items: list[QueueItem], dest: QueueTopic | None, head: bool
    ) -> None:
        where = self._where
        if dest is None:  # ACKed or dropped: a bit in its piece's marks
            marks = self._marks
            last = -1
            places: list[int] = []
            for item in items:
                held = where.pop(item, None)
                if held is None:
                    continue  # not in this node's custody (ended already, or forfeited)
                piece = held >> PLACE_BITS
                if piece != last:  # an ACK's items come from one piece, as a rule
                    places = marks.setdefault((q, piece_name(piece)), [])
                    last = piece
                places.append(held & PLACE_MASK)
                self._ending += 1
        else:
            to, how = dest.name, b"h" if head else b"t"
            for item in reversed(items) if head else items:  # pushed to the head one by one
                held = where.pop(item, None)
                if held is not None:
                    item.key = self._key()  # to be found by a withdrawal, or a log
                    name, at = piece_name(held >> PLACE_BITS), held & PLACE_MASK
                    self._settles.append(_Move(q, name, at, to, how, item))
                    self._ending += 1
            if dest is not q:
                dest.stats.enqueued += len(items)
        self._wake.set()

    def withdraw(self, q: QueueTopic, item: QueueItem) -> bool:
        """A given-back ``item`` was ACKed (it had been started as its REVOKE travelled): cancel
        its give-back if it has not left this node (True: it is in the custody still, and the
        ACK's settle ends it), else take it out of the queue in Redis if no node took it
        meanwhile (False: counted as acked when Redis says it was still there)."""
        settles = self._settles
        for i, move in enumerate(settles):
            if move.item is item and move.how == b"h":
                del settles[i]
                self._ending -= 1
                self._where[item] = piece_code(move.piece) << PLACE_BITS | move.at  # held again
                return True
        if len(self._withdrawing) < WITHDRAW_MAX:
            move = _Move(q, "", 0, q.name, b"w", item)  # its key and run as given back
            self._withdrawing[move.key] = (q, item)
            settles.append(move)
            self._ending += 1
            self._wake.set()
        return False

    def _withdrawn(self, keys: list[Any], moves: list[_Move]) -> None:
        """The answer to withdrawals: the items named were still waiting, now ACKed."""
        for key in keys:
            k = key.decode() if isinstance(key, bytes) else str(key)
            found = self._withdrawing.pop(k, None)
            if found is None:
                continue
            q, item = found
            q.stats.acked += 1
            q.stats.late_acked += 1
            if item.batch_item is not None and q.on_item_end is not None:
                q.on_item_end(item.batch_item, False)
        for move in moves:  # the others had been taken again: their next delivery settles them
            if move.how == b"w":
                self._withdrawing.pop(move.key, None)

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
        self._audited = 0.0  # a call's answer may have been lost: check the custody soon
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

    # the writer: one call at a time

    def _check_emptied(self) -> None:
        """Tell ``stop`` when nothing waits to be sent and nothing is on its way."""
        if self.settled:
            self._emptied.set()

    async def _write_loop(self) -> None:
        """Send what the node has for Redis, one ``CYCLE`` call at a time."""
        while True:
            self._reconcile_wanting()  # the freshest takes: what the consumers free now
            if not (self._unsent or self._ending or self._wants or self._audit):
                self._check_emptied()
                self._wake.clear()
                await self._wake.wait()
                continue
            wait = self._began + CALL_EVERY - self._clock()
            if wait > 0 and not self._urgent():
                await asyncio.sleep(wait)  # what else comes meanwhile goes in the same call
                continue
            call = self._next_call()
            began = self._began = self._clock()
            answer: list[Any] | None = None
            self.calling = True
            try:
                answer = await self._call("CYCLE", call.args)
            except Exception:  # a script error: a bug, never a reason to stop
                end_if_cancelled()
                dropped = sum(v.sending for v, _, _, _ in call.runs)
                log.exception("Redis refused a queue call (%d new items dropped)", dropped)
            finally:
                self.calling = False
                self._settling, self._marking = [], []
                for v, _ in call.takes:
                    v.taking = 0
            if answer is not None:
                self.calls += 1
                self._rtt += 0.25 * (self._clock() - began - self._rtt)
            self._answered(call, answer)

    def _urgent(self) -> bool:
        """Whether the next call should leave now rather than share a millisecond: much
        waits, a consumer starves (its queue has nothing ready here), or the node stops."""
        if self._closing or self._audit or self._unsent + self._ending >= CALL_FULL:
            return True
        return any(not v.q.ready for v in self._wants)

    def _next_call(self) -> _Call:
        """The next call's arguments: whatever waits to be sent."""
        takes = list(self._wants) if not self._closing else []
        self._wants.clear()
        call = _Call([self.prefix, self.node, str(next(self._calls))])
        self._add_marks(call)
        self._add_moves(call)
        self._add_puts(call)
        self._add_audits(call)
        args = call.args
        args.append(len(takes))
        for v in takes:
            tid = next(self._takes)
            args += (tid, v.q.name, v.want, v.most)
            v.taking, v.want = v.want, 0
            call.takes.append((v, tid))
        return call

    def _add_marks(self, call: _Call) -> None:
        marks, self._marks = self._marks, {}
        self._ending -= sum(len(places) for places in marks.values())
        self._marking = list(marks)
        args = call.args
        args.append(len(marks))
        for (q, piece), places in marks.items():
            args += (q.name, piece, marks_of(places))

    def _add_moves(self, call: _Call) -> None:
        settles = self._settles
        moves = call.moves
        for _ in range(min(MOVE_MAX, len(settles))):
            moves.append(settles.popleft())
        self._ending -= len(moves)
        self._settling = moves
        args = call.args
        args.append(len(moves))
        for m in moves:
            args += (m.q.name, m.piece, m.at, m.dest, m.how, m.key, m.run)

    def _add_puts(self, call: _Call) -> None:
        """A run of each queue's new items (``PUT_MAX`` in all at most)."""
        args: list[Any] = []
        budget = PUT_MAX
        for v in list(self._filled):
            n = min(budget, len(v.records))
            if n <= 0:
                break
            ids: list[Any] = []
            if v.ided:
                for place, item in enumerate(itertools.islice(v.items, n), 1):
                    if item.id:
                        ids += (place, item.id)
            s = v.q.settings
            args += (v.q.name, int(s.dedup_window * 1000), s.dedup_max, n, len(ids) // 2)
            args += ids
            records = v.records[:n] if n < len(v.records) else v.records
            ends = list(itertools.accumulate(map(len, records)))
            number = next(self._runs) & 0xFFFFFFFF
            run = run_of(records, self._mark + struct.pack(">I", number), ends)
            args.append(run)
            v.sending = n
            call.runs.append((v, number, ends, run))
            budget -= n
        call.args.append(len(call.runs))
        call.args += args

    def _add_audits(self, call: _Call) -> None:
        args = call.args
        if not self._audit:
            args.append(0)
            return
        self._audit = False
        views = list(self._views.values())
        args.append(len(views))
        for v in views:
            known = self._holding(v.q)
            args += (v.q.name, len(known), *known)

    def _answered(self, call: _Call, answer: list[Any] | None) -> None:
        """Apply a call's answer (None: Redis refused the call, a bug: its new items are
        dropped, its settles and takes lost; the next audit gives back what they left)."""
        if answer is None:
            self._enqueued(call, ())
            return
        n = int(answer[0])
        self._enqueued(call, answer[1 : 1 + n])
        at = 1 + n
        n = int(answer[at])
        self._withdrawn(answer[at + 1 : at + 1 + n], call.moves)
        at += 1 + n
        moved = int(answer[at])
        if moved:
            log.warning("%d queue items held for this node unknown to it: given back", moved)
        at += 2  # and the count of takes, which the call knows
        for v, tid in call.takes:
            data = answer[at]
            n = int(answer[at + 1])
            self.heard(v.q.name, data if isinstance(data, bytes) else str(data).encode())
            self._took(v.q, tid, answer[at + 2 : at + 2 + 2 * n])
            at += 2 + 2 * n
        self._lengths(answer, at)

    def _enqueued(self, call: _Call, dups: Sequence[Any]) -> None:
        """The call's new items are in Redis but for the duplicates at places ``dups`` (from 1,
        counted across the call's runs), which another node enqueued first."""
        places = sorted(int(place) for place in dups)
        base = 0
        for v, number, ends, run in call.runs:
            n, v.sending = v.sending, 0
            q = v.q
            found = [p - base - 1 for p in places if base < p <= base + n]
            for i in found:
                self._duplicate(v, v.items[i])
            items, v.items[:n] = v.items[:n], []
            del v.records[:n]
            if v.ided:
                v.ided -= sum(1 for i in items if i.id is not None or i.batch_item is not None)
            if not found:  # in Redis as it was sent: whole, of this node's origin
                self._hand.remember(number, items, run, ends)
            v.first += n
            if not v.records:
                self._filled.pop(v, None)
            self._unsent -= n
            q.stats.enqueued += n - len(found)
            base += n

    def _duplicate(self, v: _View, item: QueueItem) -> None:
        """New ``item`` of ``v``'s queue was a duplicate: another node enqueued its id first,
        the same work, which ends there."""
        q = v.q
        q.stats.duplicates += 1
        if item.batch_item is not None and q.on_item_end is not None:
            q.on_item_end(item.batch_item, False)

    # taking

    async def _take_loop(self) -> None:
        while True:
            await self._want.wait()
            self._want.clear()
            if self._reconcile_wanting():
                self._wake.set()

    def _reconcile_wanting(self) -> bool:
        """Reconcile the queues that want it; True when one of them wants to take."""
        wanting, self._wanting = self._wanting, {}
        taking = False
        for q in wanting:
            v = self._views.get(q.name)
            if v is not None and q.home is self:
                taking = self._reconcile(q, v) or taking
        return taking

    def _reconcile(self, q: QueueTopic, v: _View) -> bool:
        """Keep ``q.ready`` at what this node's consumers have room for plus a spare (so an ACK
        is followed by the next item without waiting for Redis): take when what it has and
        what the take on its way brings falls to half of that, give back beyond it (consumers
        left). True when the next call takes."""
        room = 0
        for c in q.consumers:
            if c.live:
                room += max(c.credit(), 0)
        # what the consumers here finish in two calls' time, or 5 ms: an ACK is then followed
        # by the next item without waiting for Redis, each take moves many items, and slow
        # consumers (long jobs: rounded down to none) hoard nothing that another node's idle
        # consumers could start
        rate = v.rate
        spare = min(SPARE_MAX, int(rate * max(2 * self._rtt, SPARE_S))) if room or q.ready else 0
        target = room + spare
        have = len(q.ready) + v.taking
        v.want = 0
        self._wants.pop(v, None)
        if have > target + spare:
            if not v.taking:  # else once it is in
                back = [q.ready.pop() for _ in range(have - target)]
                back.reverse()
                self.settle(q, back, q, True)
        elif 2 * have < target or have < room:
            # taken while Redis is away too: the call waits for it (a want dropped for being
            # made then was never made again: its consumer starved once Redis was back)
            if not self._closing and (v.length != 0 or v.records):
                v.want = min(target - have, TAKE_MAX)
                v.most = min(target + spare - have, TAKE_MAX)  # what it may hold: no give-back
                self._wants[v] = None
        return v.want > 0

    def _took(self, q: QueueTopic, tid: int, pieces: list[Any]) -> None:
        """A take's answer: pairs of a piece's number and the piece, now in this node's
        custody."""
        now = self._clock()
        where = self._where
        fresh: list[QueueItem] = []
        dead: list[QueueItem] = []
        limit = q.settings.delivery_limit
        for i in range(0, len(pieces), 2):
            piece = (tid << PIECE_BITS | int(pieces[i])) << PLACE_BITS
            run = pieces[i + 1]
            count, base, mark, number = HEAD.unpack_from(run)
            data = HEAD.size + 4 * count - base
            ends = struct.unpack_from(f">{count}I", run, HEAD.size)
            if mark == self._mark:
                items = self._hand.deal(number, run, data, base, ends)
                if items is not None:
                    where.update(zip(items, range(piece + 1, piece + len(items) + 1), strict=True))
                    fresh += items
                    continue
            start = base
            at = 0
            for end in ends:
                at += 1
                head = data + start
                start = end
                if run.startswith(FRESH, head):  # new, plain: no parsing (records_of, decode)
                    deflated = run[head + FLAG_AT] == DEFLATED
                    item = QueueItem(run[head + FRESH_LEN : data + end], deflated, None, now)
                    where[item] = piece | at
                    fresh.append(item)
                    continue
                item = decode_item(run[head : data + end], now)
                where[item] = piece | at
                if item.failures >= limit:
                    dead.append(item)
                else:
                    fresh.append(item)
        for item in dead:
            q.dead(item)  # its consumers kept dying with it
        self.taken += len(fresh)
        q.ready.extend(fresh)
        q.touch()  # the deal, and this node's wants again
        if q.waiters:
            q.wake_waiters()

    def _holding(self, q: QueueTopic) -> list[str]:
        """The pieces of ``q`` this node knows it holds: those of its items waiting here, dealt
        or delivered, and of its settles not yet sent (those on their way are settled in Redis
        before an audit in the same call looks)."""
        where = self._where
        pieces: set[str] = set()
        held = [*q.ready]
        for c in q.consumers:
            held += c.lane
            held += (i for i, _ in c.outstanding.values())
        for item in held:
            found = where.get(item)
            if found is not None:
                pieces.add(piece_name(found >> PLACE_BITS))
        pieces.update(m.piece for m in self._settles if m.q is q and m.piece)
        pieces.update(piece for (mq, piece) in self._marks if mq is q)
        return sorted(pieces)

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
            # back); the ones the others gave back are no longer in its custody, and CYCLE
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
                    self._audit = True  # in the next call, after its settles, before its takes
                    self._wake.set()
                if views:
                    pipe = redis.pipeline(transaction=True)  # each length with its version
                    for v in views:
                        pipe.get(self.prefix + "ql:" + v.q.name)
                        pipe.get(self.prefix + "qv:" + v.q.name)
                        pipe.llen(self.prefix + "q:" + v.q.name)
                    got = await pipe.execute()
                    for v, n, version, elements in zip(
                        views, got[::3], got[1::3], got[2::3], strict=True
                    ):
                        # no count: a list written before runs, one item an element (the
                        # next call that touches it counts it so)
                        n = elements if n is None else int(n)
                        self.heard(v.q.name, b"%d:%d" % (n, int(version or 0)))
            except (*RETRIED, BrokerUnavailable):
                # the next beat tries again (the writer's retries say when Redis is back); a
                # BrokerUnavailable here only waited for a free connection of this node's
                end_if_cancelled()
                continue
            except Exception:
                end_if_cancelled()
                log.exception("queue heartbeat failed")
