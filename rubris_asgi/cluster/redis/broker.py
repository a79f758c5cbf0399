"""``RedisBroker``: several nodes (workers, hosts) share their shared topics through Redis.

Needs ``redis`` (``rubris-asgi[redis]``) and a standalone Redis server, 5.0 or later; run it
with persistence (``appendonly yes``) so that a restart keeps every topic's numbering.

**Publishing.** A shared publish is encoded and compressed once, on the node where it is made,
and joins this node's *outbox*; one task sends the outbox in batches, each batch one script
(``broker_lua.PUBLISH``) that numbers every message atomically (the same seq and epoch for
every node), keeps it in the topic's ring or snapshot in Redis and publishes it on the topic's
channel. A batch whose answer was lost with the connection is sent again under the same id,
and Redis answers it from the first run: nothing is numbered twice. ``publish`` never waits:
it returns 0, the seq being Redis's to give (``Rubris.publish_async`` waits for it).

**Hearing.** A node *follows* a topic while it has subscribers to it: it subscribes to the
topic's channel, then reads the topic's state (``broker_lua.HISTORY``: epoch, seq, ring or
snapshot) into its own ``SharedTopic``; from then on every message of the channel is stored
there (``engine.apply``) and reaches its subscribers through the scheduler as any publish
does. A ring must hold every seq from its oldest to its head, so a message that skips some
(missed while the connection was down) makes the node read what it missed from Redis first,
keeping what arrives meanwhile; a snapshot just takes the newest value.

**Failure.** When Redis is unreachable, ``publish`` raises ``BrokerUnavailable`` (and the HTTP
API answers 503, a client's PUBLISH gets REJECTED 6); what was accepted before stays in the
outbox and is sent when Redis is back. Subscribers stay connected: the node reconnects by
itself, subscribes to its channels again and reads from each followed topic's history what it
missed. A topic Redis lost (restarted without persistence) comes back under a new epoch: its
subscribers get UNSUBSCRIBED 11 and subscribe again, recovered=0.

**Work queues.** Queue topics keep their waiting items in the same Redis, for the consumers
of every node: queues/

**Keyed topics and presence.** A keyed topic's table is kept in the same Redis and changed
through an outbox of its own (tables.py; its channel and its follow are the ones above, heard
by tables.py); the members of watched topics are every node's sessions added up there
(presence.py).

Bounds: the outbox (outbox.py) holds at most ``outbox_messages`` publishes and ``outbox_bytes``
of payload (a publish beyond is refused); what the intake took from outside publishers fills
it only up to the part not kept for the application (``app_share``) and otherwise waits in the
intake, bounded itself; a topic catching up keeps at most its ring's worth of new messages.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import Callable, Sequence
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import TimeoutError as RedisTimeoutError

from ...engine.intake import Backlogged
from ...engine.keyed.topic import KEYED, KeyedTopic
from ...engine.membership import Change, EngineEvents, Membership, Relayed
from ...engine.topics import RING, SharedTopic, new_epoch
from ...errors import BrokerUnavailable
from ...protocol import push_message
from ..base import Broker, BrokerStats
from ..nodes import SESSION_MARK
from . import broker_lua
from .follow import JOINING, LIVE, Follow
from .nodes import DOWN, RETRIED, RedisNodeLink
from .outbox import Entry, Outbox
from .persistence import Persistence, read_persistence, require_durable
from .pool import (
    MAX_CONNECTIONS,
    POOL_TIMEOUT,
    PoolBusy,
    check_pool,
    connect,
    redacted,
    startup_error,
)
from .presence import RedisPresence
from .queues.home import RedisQueues
from .reach import RETRY, Reach, end_if_cancelled
from .replicas import Replicas
from .tables import RedisTables

log = logging.getLogger("rubris_asgi.broker")

IDLE_FOLLOW = 30.0
"""Seconds a followed topic stays followed without subscribers (a page reload comes back)."""
REFRESH = 60.0
"""Seconds between refreshes of the followed topics' expiry in Redis."""

CONDITION: dict[int, int] = {Relayed.FIRST: 1, Relayed.IF_FOLLOWED: 2}
"""The publish script's condition for each kind of relayed publish (broker_lua.PUBLISH)."""


class RedisBroker(Broker):
    """Shared topics numbered and kept in Redis, heard by every node through pub/sub.

    Args:
        url: ``redis://host:port/db`` (``rediss://`` for TLS, ``unix://`` for a socket).
        prefix: put before every key and channel (several apps on one Redis).
        history_ttl: seconds a topic's state lives in Redis after its last use.
        outbox_messages / outbox_bytes: the bounds of what waits to be sent to Redis.
        app_share: the part of those bounds kept for the application's own publishes
            (``publish``, ``publish_async``, batch announcements): what outside publishers
            send (the HTTP API, clients' PUBLISH) waits in the intake rather than fill it.
        connect_timeout: seconds ``start`` waits for Redis before it fails.
        node_timeout: seconds a node may miss its heartbeat before the others take it for
            dead and give the queue items it held back to their queues (queues/).
        max_connections: connections to Redis this node opens at most (one is its
            subscriber); a command waits for a free one. Each costs Redis a client (its
            ``maxclients`` is 10,000 by default): nodes times this must stay below it.
        pool_timeout: seconds a command waits for a free connection before it is refused
            with ``PoolBusy`` (a ``BrokerUnavailable`` that names the local limit; Redis is not
            taken for away). The node's own work (the outbox, the queues) waits on.
        wait_replicas: how many replicas must confirm each write of work items, their
            settling and batch acks (Redis ``WAIT``) before it counts as done: 0 (the default)
            takes Redis's word, and a failover can lose what the old master had not passed on;
            1 or more loses none of it, at a round trip to a replica per batch (replicas.py).
        wait_timeout: seconds each ``WAIT`` waits for them before it is tried again.
        allow_volatile: keep work-queue items in a Redis that would lose them on a restart
            (no ``appendonly yes``, or its settings unreadable), saying so in a WARNING; by
            default such a Redis is refused (``RedisNotDurable``) where an item would be
            accepted: at start when queues are declared (``holds``) or were made before it,
            else at the first item. Shared topics alone never need it.
    """

    distributed = True

    def __init__(
        self,
        url: str,
        *,
        prefix: str = "rubris:",
        history_ttl: float = 86_400.0,
        outbox_messages: int = 10_000,
        outbox_bytes: int = 16 * 1024 * 1024,
        app_share: float = 0.2,
        connect_timeout: float = 5.0,
        node_timeout: float = 10.0,
        max_connections: int = MAX_CONNECTIONS,
        pool_timeout: float = POOL_TIMEOUT,
        allow_volatile: bool = False,
        wait_replicas: int = 0,
        wait_timeout: float = 1.0,
    ) -> None:
        super().__init__()
        check_pool(max_connections, pool_timeout)
        if history_ttl <= 0 or outbox_messages < 1 or outbox_bytes < 1:
            raise ValueError("history_ttl, outbox_messages and outbox_bytes must be positive")
        if not 0 <= app_share < 1:
            raise ValueError("app_share must be at least 0 and below 1")
        if node_timeout < 3:
            raise ValueError("node_timeout must be at least 3 seconds (nodes beat every second)")
        self.url = url
        self.prefix = prefix
        self.ttl_ms = str(int(history_ttl * 1000))
        self.connect_timeout = connect_timeout
        self.max_connections = max_connections
        self.pool_timeout = pool_timeout
        self.allow_volatile = allow_volatile
        self.replicas = Replicas(wait_replicas, wait_timeout, prefix + "wait")
        """Replicas that confirm each write of items and batches (replicas.py)."""
        self.persistence: Persistence | None = None
        """What Redis said of its persistence at start."""
        self._holds: set[str] = set()
        self._warned: set[str] = set()
        self._channel = (prefix + "c:").encode()
        self.node = secrets.token_hex(6)
        self.nodes = self.link = RedisNodeLink(
            prefix, self.node, lambda: self.redis, lambda: self.unavailable()
        )
        self._events: EngineEvents | None = None
        self._redis: aioredis.Redis | None = None
        self._pubsub: Any = None
        self._following: dict[str, Follow] = {}
        self._confirm: dict[bytes, asyncio.Future[None]] = {}
        self.outbox = Outbox(outbox_messages, outbox_bytes, self.counters, app_share)
        """The publishes on their way to Redis (outbox.py)."""
        self._tasks: list[asyncio.Task[None]] = []
        self._reader_down = False
        self.reach = Reach(self.counters)
        """Whether Redis answers, for every part of this node (reach.py)."""
        self._refreshed = 0.0
        self._side: set[asyncio.Task[None]] = set()
        self._listening: dict[bytes, Callable[[bytes], None]] = {}
        """Channels heard besides the topics' and the node's: the queues' lengths."""
        self.queues = RedisQueues(self, node_timeout)
        """Work-queue topics kept in Redis (queues/)."""
        self.tables = RedisTables(self, self._following, outbox_messages, outbox_bytes, app_share)
        """Keyed topics kept in Redis (tables.py)."""
        self.presence = RedisPresence(self, node_timeout)
        """The members of watched topics, added up across nodes (presence.py)."""

    # life

    async def start(self, events: EngineEvents) -> Membership:
        self._events = engine = events
        # no retries inside redis-py: a lost connection must reach this code, which then
        # subscribes again and reads what it missed (redis-py would resubscribe silently)
        self._redis = connect(
            self.url,
            self.max_connections,
            self.pool_timeout,
            socket_connect_timeout=self.connect_timeout,
            socket_timeout=self.connect_timeout,
            retry=Retry(NoBackoff(), 0),
            health_check_interval=5,
        )
        try:
            await asyncio.wait_for(self._redis.ping(), self.connect_timeout)
            self.persistence = p = await read_persistence(self._redis)
            log.info("Redis at %s: %s", redacted(self.url), p.describe())
            if engine.queues:  # queue topics made before the start: their items go to Redis
                self._holds.add("work-queue items")
            for what in sorted(self._holds):
                self.require_durable(what)
            self._publish_script = self._redis.register_script(broker_lua.PUBLISH)
            self._history_script = self._redis.register_script(broker_lua.HISTORY)
            self._renumber_script = self._redis.register_script(broker_lua.RENUMBER)
            self._pubsub = await self._open_pubsub()
            await self.queues.start(engine)  # first: its heartbeat makes this node known
            await self.tables.start(engine)
            await self.presence.start(engine)
        except BaseException as exc:
            await self._close_pubsub()
            await self._redis.aclose()
            self._redis = None
            failure = startup_error(self.url, exc, self.connect_timeout)
            if failure is None:
                raise
            # the one line says what to do; redis-py's chain of causes, printed under it, would
            # bury it (issue 36): it is here for whoever debugs
            log.debug("%s", failure, exc_info=exc)
            raise failure from None
        self._tasks = [
            asyncio.create_task(
                self.outbox.run(self._send, self.node, engine.room_made),
                name="rubris-broker-writer",
            ),
            asyncio.create_task(self._read_loop(), name="rubris-broker-reader"),
        ]
        return Membership(
            self.relay,
            self.node + SESSION_MARK,
            self.queues,
            presence=self.presence,
            tables=self.tables.relay,
        )

    async def stop(self, flush: float = 5.0) -> None:
        """Send what waits, for at most ``flush`` seconds, then disconnect (the engine leaves
        after: publishes meanwhile still go out, if the flush has time)."""
        if self._redis is not None:
            await self.presence.stop(flush)
            await self.queues.stop(flush)
        await self.outbox.flush(flush)
        await self.tables.stop(flush)
        await self._end()
        await self._close_pubsub()
        if self._redis is not None:
            await self._redis.aclose()
            self._redis = None

    async def _end(self) -> None:
        """Stop every task; what was never numbered, and every follow still waiting, is
        told so; the node link stops."""
        for task in (*self._tasks, *self._side):
            task.cancel()
        for task in (*self._tasks, *self._side):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks = []
        lost = BrokerUnavailable("the broker stopped before this publish was numbered")
        self.outbox.fail_all(lost)
        for f in self._following.values():
            if f.ready is not None and not f.ready.done():
                f.ready.set_exception(lost)
        self._following.clear()
        self.link.close()

    @property
    def redis(self) -> aioredis.Redis:
        """The client (once started)."""
        assert self._redis is not None, "the broker is not started"
        return self._redis

    def listen(self, channel: str, handler: Callable[[bytes], None]) -> None:
        """Hear ``channel`` (each message's data to ``handler``) from now on, across
        reconnections."""
        key = channel.encode()
        if key in self._listening:
            return
        self._listening[key] = handler
        ps = self._pubsub
        if ps is not None and not self._reader_down:
            self.background(self._quietly(ps.subscribe(key)))

    def holds(self, what: str = "work-queue items") -> None:
        """Declare, before ``start``, that ``what`` will be kept in this Redis (the app does
        for its queue channels): ``start`` then refuses a Redis that would lose it on a
        restart, unless ``allow_volatile``."""
        self._holds.add(what)

    def require_durable(self, what: str) -> None:
        """Raise ``RedisNotDurable`` if Redis would lose ``what`` on a restart (and
        ``allow_volatile`` is off); with it on, say so once as a WARNING."""
        p = self.persistence
        if p is None:
            raise BrokerUnavailable("the broker is not started")
        require_durable(p, what, self.allow_volatile, self.url, self._warned)

    # publishing

    def follows(self, name: str) -> bool:
        return name in self._following

    def accepting(self, messages: int, nbytes: int) -> bool:
        return self.reach.up and self.outbox.room(messages, nbytes)

    def unavailable(self, name: str | None = None) -> str | None:
        return None if self.reach.up else self.reach.reason or "Redis is unreachable"

    def relay(self, topic: SharedTopic, payload: bytes, compressed: bool, how: int) -> int:
        """The relay the engine joins (``Membership``): into the outbox, or ``BrokerUnavailable``
        (``Backlogged`` for what the intake took, which it keeps); returns 0."""
        if how == Relayed.TAKEN:
            if not self.outbox.room_for_taken(len(payload)):
                raise Backlogged
        elif not self.accepting(1, len(payload)):
            self.outbox.refuse(self.unavailable(), 1)
        self.outbox.put(Entry(topic, payload, compressed, CONDITION.get(how, 0), None))
        return 0

    async def numbered(self, topic: SharedTopic, payload: bytes, compressed: bool) -> int:
        if not self.accepting(1, len(payload)):
            self.outbox.refuse(self.unavailable(), 1)
        done: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self.outbox.put(Entry(topic, payload, compressed, 0, done))
        return await done

    async def numbered_change(self, topic: KeyedTopic, change: Change) -> int:
        return await self.tables.numbered(topic, change)

    async def _send(self, batch: Sequence[Entry], batch_id: str) -> list[int]:
        """One script call numbering ``batch``, retried under the same id until Redis answers."""
        args, keys = publish_call(self.prefix, self.ttl_ms, batch, batch_id)
        seqs: list[int] = await self.reach.until_answered(
            lambda: self._publish_script(keys=keys, args=args), "writer"
        )
        return seqs

    # hearing

    async def follow(self, topic: SharedTopic) -> None:
        f = self._following.get(topic.name)
        if f is not None and f.topic is not topic:  # the engine dropped the old one (batches)
            del self._following[topic.name]
            f = None
        if f is None:
            if self._reader_down:
                raise BrokerUnavailable("Redis is unreachable: cannot read this topic now")
            f = self._following[topic.name] = Follow(topic)
            f.ready = asyncio.get_running_loop().create_future()
            try:
                await self._subscribe([topic.name])
                await self._catch_up([f])
            except BaseException as exc:
                del self._following[topic.name]
                if not f.ready.done():
                    f.ready.set_exception(BrokerUnavailable(f"cannot follow {topic.name}: {exc}"))
                    f.ready.exception()  # retrieved: nobody else may be waiting
                if isinstance(exc, (*RETRIED, asyncio.TimeoutError)):
                    raise BrokerUnavailable(f"cannot follow {topic.name}: {exc!r}") from exc
                raise
            f.ready.set_result(None)
        elif f.ready is not None and not f.ready.done():
            await asyncio.shield(f.ready)
        f.idle_since = 0.0

    async def _subscribe(self, names: Sequence[str]) -> None:
        """SUBSCRIBE to the channels of ``names`` and wait until Redis confirms each: only
        then is nothing published on them missed."""
        loop = asyncio.get_running_loop()
        waits = []
        for name in names:
            channel = self._channel + name.encode()
            fut = self._confirm.get(channel)
            if fut is None:
                fut = self._confirm[channel] = loop.create_future()
            waits.append(fut)
        await self._pubsub.subscribe(*(self._channel + n.encode() for n in names))
        try:
            await asyncio.wait_for(asyncio.gather(*waits), self.connect_timeout)
        except asyncio.TimeoutError:
            # Redis's silence, so one of DOWN: a TimeoutError (an OSError) no longer is, and the
            # reader that met it here ended for good, its topics never heard again
            raise RedisTimeoutError(
                f"Redis did not confirm SUBSCRIBE within {self.connect_timeout:g} s"
            ) from None

    async def _catch_up(self, follows: Sequence[Follow]) -> None:
        """Read what each topic missed from Redis's history, then what arrived meanwhile, and
        make it live. Raises what Redis raises (the caller decides)."""
        keyed = [f for f in follows if f.topic.mode == KEYED]
        if keyed:  # read by pages, a topic at a time (tables.py)
            await self.tables.catch_up(keyed)
            follows = [f for f in follows if f.topic.mode != KEYED]
        while follows:
            for f in follows:
                f.state = JOINING
            answers = await self._history(follows)
            again = []
            for f, answer in zip(follows, answers, strict=True):
                if not self._settle(f, answer):
                    again.append(f)
            follows = again

    async def _history(self, follows: Sequence[Follow]) -> list[list[Any]]:
        """Each topic's state in Redis after what ``follows`` hold (``broker_lua.HISTORY``)."""
        args, keys = history_call(self.prefix, self.ttl_ms, follows)
        answers: list[list[Any]] = await self._history_script(keys=keys, args=args)
        return answers

    def _settle(self, f: Follow, answer: list[Any]) -> bool:
        """Store what the history answered, then what was held; False if a hole remains."""
        engine = self._events
        assert engine is not None
        t = f.topic
        epoch = int(answer[0])
        if epoch != t.epoch:
            self._restart(t, epoch)
        for entry in answer[2:]:
            seq_b, flag, payload = entry.split(b":", 2)
            seq = int(seq_b)
            if seq > t.seq:
                engine.apply(t, seq, payload, flag == b"1")
                self.counters.fetched += 1
        held = f.held
        while held:
            epoch, seq, payload, compressed = held.popleft()
            if epoch != t.epoch or seq <= t.seq:
                # read from the history already, or of an epoch the history has left behind
                # (one newer than the history's is very unlikely; its next message repairs it)
                if epoch == t.epoch and self._renumbered(t, seq, payload, compressed):
                    self.background(self._renumber(f))  # holding on until it is done
                    return True
                continue
            if seq != t.seq + 1 and t.mode == RING:
                held.appendleft((epoch, seq, payload, compressed))
                return False
            self._store(t, seq, payload, compressed)
        f.state = LIVE
        return True

    def _restart(self, t: SharedTopic, epoch: int) -> None:
        engine = self._events
        assert engine is not None
        if t.seq or t.subs:
            self.counters.restarted += 1
            log.warning("topic %s numbered afresh by Redis (epoch %d)", t.name, epoch)
        engine.restart_topic(t, epoch)

    def _heard(self, channel: bytes, data: bytes) -> None:
        """One message on a followed topic's channel."""
        f = self._following.get(self._topic_of(channel))
        if f is None:
            return  # unfollowed meanwhile
        if f.topic.mode == KEYED:
            self.tables.heard(f, data)
            return
        epoch_b, seq_b, flag, payload = data.split(b":", 3)
        epoch, seq, compressed = int(epoch_b), int(seq_b), flag == b"1"
        if f.state != LIVE:
            f.held.append((epoch, seq, payload, compressed))
            return
        t = f.topic
        if epoch == t.epoch:
            if seq <= t.seq:  # read from the history already, unless Redis lost and renumbered
                if self._renumbered(t, seq, payload, compressed):
                    f.state = JOINING  # what comes meanwhile waits for the new epoch
                    f.held.append((epoch, seq, payload, compressed))
                    self.background(self._renumber(f))
                return
            if seq == t.seq + 1 or t.mode != RING:
                self._store(t, seq, payload, compressed)
                return
        elif seq == 1:  # numbered afresh, and this is its first message: nothing missed
            self._restart(t, epoch)
            self._store(t, seq, payload, compressed)
            return
        # a hole: read it from the history, holding what arrives meanwhile
        f.held.append((epoch, seq, payload, compressed))
        f.state = JOINING
        self.background(self.repair(f))

    def _topic_of(self, channel: bytes) -> str:
        """The name of the topic whose channel is ``channel`` (``P c:NAME``)."""
        return channel[len(self._channel) :].decode()

    @staticmethod
    def _renumbered(t: SharedTopic, seq: int, payload: bytes, compressed: bool) -> bool:
        """A message of ``t``'s epoch at or below its head: the same bytes as held under that
        seq (read from the history too: nothing to do), or others. Others mean Redis numbered
        them again, having lost what it had numbered (a failover to a replica that had not
        received the tail): they would be dropped here as known, silently. Only what the
        topic still holds can be compared (a ring's last messages, a snapshot's head)."""
        if t.mode == RING:
            if seq < t.oldest:
                return False
            held = t.ring[seq % t.cap]
        elif seq == t.seq:
            held = t.msg
        else:
            return False
        return held != push_message(t.number, seq, payload, compressed)

    async def _renumber(self, f: Follow) -> None:
        """``t`` was renumbered under its epoch (``_renumbered``): it starts again under a new
        one, in Redis (unless another node did it first) and here, so its subscribers are told
        (UNSUBSCRIBED 11, then ``recovered``=0) instead of missing what Redis lost and what it
        numbered the same; then its history is read again."""
        t = f.topic
        old = t.epoch
        try:
            epoch = await self.reach.until_answered(
                lambda: self._renumber_call(t, old, str(new_epoch())), "reader"
            )
        except Exception:
            end_if_cancelled()
            log.exception("cannot renumber %s", t.name)
            return
        if self._following.get(t.name) is not f:
            return
        log.warning("topic %s: Redis lost messages it had numbered; numbered afresh", t.name)
        if t.epoch == old:
            self._restart(t, int(epoch))
        f.held.clear()
        await self._catch_up_patiently([f])

    async def _renumber_call(self, t: SharedTopic, old: int, epoch: str) -> Any:
        """``broker_lua.RENUMBER`` of ``t`` found renumbered under ``old``."""
        return await self._renumber_script(
            keys=topic_keys(self.prefix, t), args=[self.prefix, t.name, str(old), epoch]
        )

    def _store(self, t: SharedTopic, seq: int, payload: bytes, compressed: bool) -> None:
        engine = self._events
        assert engine is not None
        engine.apply(t, seq, payload, compressed)
        self.counters.received += 1

    def background(self, coro: Any) -> None:
        """Run ``coro`` in a task kept until it ends (the loop keeps only weak references)."""
        task = asyncio.get_running_loop().create_task(coro)
        self._side.add(task)
        task.add_done_callback(self._side.discard)

    async def repair(self, f: Follow) -> None:
        """Catch ``f`` up until it succeeds (a hole heard, or a renumbering)."""
        await self._catch_up_patiently([f])

    async def _catch_up_patiently(self, follows: Sequence[Follow]) -> None:
        """``_catch_up`` until it succeeds, for the follows still current: one left joining
        holds what it hears for good. Redis failing the read while the subscriber connection
        lives on (a stall past the socket timeout: the reader sees no error, so no
        reconnection would ever catch these up) is retried after a pause, as any call."""
        delay = RETRY[0]
        while follows:
            try:
                await self._catch_up(follows)
                return
            except PoolBusy:
                await asyncio.sleep(RETRY[0])  # never round again without awaiting
            except RETRIED as exc:
                end_if_cancelled()
                self.reach.lost("reader", exc)
                await self.reach.pause(delay)
                delay = min(2 * delay, RETRY[1])
            follows = [f for f in follows if self._following.get(f.topic.name) is f]

    async def _open_pubsub(self) -> Any:
        assert self._redis is not None
        ps = self._redis.pubsub()
        # connects now: start() fails on a bad address
        await ps.subscribe(self.link.channel, *self._listening)
        return ps

    async def _close_pubsub(self) -> None:
        ps, self._pubsub = self._pubsub, None
        if ps is not None:
            with contextlib.suppress(*DOWN):
                await ps.aclose()
        for fut in self._confirm.values():
            if not fut.done():  # a follow waiting for its SUBSCRIBE: refused, not cancelled
                fut.set_exception(BrokerUnavailable("the connection to Redis was lost"))
                fut.exception()  # retrieved: its follow may be gone already
        self._confirm.clear()

    async def _read_loop(self) -> None:
        delay = RETRY[0]
        while True:
            try:
                if self._pubsub is None:
                    self._pubsub = await self._open_pubsub()
                    names = list(self._following)
                    if names:
                        listen = asyncio.create_task(self._listen(self._pubsub))
                        try:
                            await self._subscribe(names)
                            await self._catch_up(list(self._following.values()))
                        except BaseException:
                            listen.cancel()
                            raise
                        if self._reader_down:
                            self._reader_down = False
                            log.warning("Redis reachable again: %d topics followed", len(names))
                            self.queues.reconnected()
                            self.reach.answered()
                        delay = RETRY[0]
                        await listen
                        continue
                    if self._reader_down:
                        self.queues.reconnected()
                        self.reach.answered()
                    self._reader_down = False
                delay = RETRY[0]
                await self._listen(self._pubsub)
            except Exception as exc:  # RETRIED, PoolBusy, or anything unexpected
                end_if_cancelled()
                if not isinstance(exc, (*RETRIED, PoolBusy)):
                    # the reader must outlive anything: dead, it leaves every followed topic
                    # unheard, with nothing to tell the clients
                    log.exception("the reader failed; reconnecting to Redis")
                if not isinstance(exc, PoolBusy):  # a wait for a connection: Redis answers
                    self._reader_down = True
                    self.reach.lost("reader", exc)
                if isinstance(exc, DOWN) and self._redis is not None:
                    # the idle pooled connections went with the reader's (a Redis restarted
                    # closes them all): dropped now, so no command after it meets a dead one
                    with contextlib.suppress(Exception):  # the loop must go on whatever
                        await self._redis.connection_pool.disconnect(inuse_connections=False)
                for f in self._following.values():
                    f.state = JOINING  # what comes after the reconnection waits for history
                await self._close_pubsub()
                await self.reach.pause(delay)
                delay = min(2 * delay, RETRY[1])

    async def _listen(self, ps: Any) -> None:
        confirm = self._confirm
        while True:
            msg = await ps.get_message(timeout=1.0)
            if msg is None:
                continue
            kind = msg["type"]
            if kind == "message":
                channel = msg["channel"]
                if channel == self.link.channel:
                    self.link.heard(msg["data"])
                elif channel in self._listening:
                    self._listening[channel](msg["data"])
                else:
                    self._heard(msg["channel"], msg["data"])
            elif kind == "subscribe":
                fut = confirm.pop(msg["channel"], None)
                if fut is not None and not fut.done():
                    fut.set_result(None)

    # upkeep

    def sweep(self, now: float) -> None:
        gone = []
        for name, f in self._following.items():
            if f.topic.subs or f.state != LIVE:
                f.idle_since = 0.0
            elif not f.idle_since:
                f.idle_since = now
            elif now - f.idle_since >= IDLE_FOLLOW:
                gone.append(name)
        for name in gone:
            del self._following[name]
        if not self._hearing:
            return
        if gone:
            self.background(self._quietly(self._unfollow(gone)))
        if now - self._refreshed >= REFRESH and self._following:
            # the position check: every followed topic's state read again, which refreshes
            # its expiry in Redis and repairs anything missed that nothing else revealed (a
            # snapshot's last message lost with a connection)
            self._refreshed = now
            live = [f for f in self._following.values() if f.state == LIVE]
            self.background(self._quietly(self._catch_up_patiently(live)))

    @property
    def _hearing(self) -> bool:
        """Whether the subscriber connection is up (else the reconnection follows again)."""
        return self._pubsub is not None and not self._reader_down

    async def _unfollow(self, names: list[str]) -> None:
        ps = self._pubsub
        if ps is None:  # reconnecting: the new connection subscribes only to what is followed
            return
        await ps.unsubscribe(*(self._channel + n.encode() for n in names))
        # followed again while the UNSUBSCRIBE was on its way: that follow's SUBSCRIBE may
        # have gone first, and this one undone it
        back = [n for n in names if n in self._following]
        if back:
            await self._subscribe(back)
            await self._catch_up_patiently(
                [self._following[n] for n in back if n in self._following]
            )

    async def _quietly(self, aw: Any) -> None:
        with contextlib.suppress(*RETRIED, BrokerUnavailable):
            await aw

    def stats(self) -> BrokerStats:
        c = self.counters
        c.up = self.reach.up and not self._reader_down
        c.pending = len(self.outbox)
        c.changes_pending = len(self.tables.outbox)
        c.members_pending = self.presence.pending
        c.following = len(self._following)
        c.items_pending = self.queues.pending
        c.items_taken = self.queues.taken
        c.items_reclaimed = self.queues.reclaimed
        c.forfeits = self.queues.forfeited
        return c


def topic_keys(prefix: str, t: SharedTopic) -> list[str]:
    """The keys of topic ``t`` under ``prefix`` that the scripts may touch (broker_lua.py):
    declared to Redis, which on a cluster routes a script by them and, while their slot
    moves, runs it only where all of them are (an undeclared key may be missing there)."""
    keys = [prefix + "t:" + t.name]
    if t.mode == RING:
        keys.append(prefix + "r:" + t.name)
    return keys


def publish_call(
    prefix: str, ttl_ms: str, batch: Sequence[Entry], batch_id: str
) -> tuple[list[Any], list[str]]:
    """``broker_lua.PUBLISH``'s arguments and keys for ``batch`` under ``prefix``."""
    args: list[Any] = [prefix, ttl_ms, str(new_epoch()), batch_id]
    keys = {prefix + "b:" + batch_id: None}
    for e in batch:
        t = e.topic
        args += [t.name, int(t.mode), t.cap, e.cond, int(e.compressed), e.payload]
        keys.update(dict.fromkeys(topic_keys(prefix, t)))
    return args, list(keys)


def history_call(
    prefix: str, ttl_ms: str, follows: Sequence[Follow]
) -> tuple[list[Any], list[str]]:
    """``broker_lua.HISTORY``'s arguments and keys for ``follows`` under ``prefix``."""
    args: list[Any] = [prefix, ttl_ms, str(new_epoch())]
    keys: dict[str, None] = {}
    for f in follows:
        t = f.topic
        args += [t.name, int(t.mode), str(t.epoch), t.seq]
        keys.update(dict.fromkeys(topic_keys(prefix, t)))
    return args, list(keys)
