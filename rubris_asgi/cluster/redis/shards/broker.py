"""``RedisClusterBroker``: shared topics spread over the masters of a Redis Cluster.

The same broker as ``RedisBroker`` (the outbox, the numbering scripts, following and catching
up, renumbering after a loss), standing on shards/ instead of one Redis:

- **Where.** Each topic belongs to a partition (``shards.partition_of`` its name); every key
  and channel of the topic is under the partition's prefix (``rubris:{rb.5.2}:``), so one
  master holds all of it and one script changes it. The scripts are ``RedisBroker``'s, run on
  the partition's prefix, with every key they touch declared (``topic_keys``): while the
  partition's slot moves, Redis runs a script only where all of them are (``ASK``, or
  ``TRYAGAIN`` while they are split), never where one would read as absent.
- **Numbering.** Each partition's publishes wait in a lane of their own (lanes.py), sent
  batch by batch, each batch one script call on the partition's master retried under its id
  until answered (a repeat is answered from the first run); a lane whose master is away
  refuses its topics' new publishes while the other lanes go on.
- **Hearing.** Each followed topic's channel is a sharded one (``SPUBLISH`` in the script,
  ``SSUBSCRIBE`` on a connection per master: ``ShardedSubscriber``). A channel that may have
  missed messages (its master's connection lost, its slot moved to another master) is held
  (``deaf``) and caught up from the history once heard again (``lost``), as ``RedisBroker``
  does for its one connection.
- **Between nodes.** Each node's channel (requests, replies, one-way messages) lives in the
  partition of the node's name: ``ClusterNodeLink``.

What a master's loss costs, and what is not on a cluster yet, is in docs/operations.md
("More than one Redis").
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

from ....engine.intake import Backlogged
from ....engine.membership import EngineEvents, Membership, Relayed
from ....engine.topics import SharedTopic
from ....errors import BrokerStartupError, BrokerUnavailable
from ...base import BrokerStats
from ...nodes import SESSION_MARK
from .. import broker_lua
from ..broker import CONDITION, RedisBroker, history_call, publish_call, topic_keys
from ..follow import JOINING, Follow
from ..nodes import RETRIED
from ..outbox import Entry
from ..pool import PoolBusy, redacted
from ..reach import RETRY, Reach, end_if_cancelled
from .client import ShardedClient
from .lanes import Lanes
from .nodes import BEAT, ClusterNodeLink
from .partitions import PARTITIONS, partition_of
from .partitions import prefix as partition_prefix
from .pubsub import ShardedSubscriber
from .scripts import Script

log = logging.getLogger("rubris_asgi.broker")


def sharded(script: str) -> str:
    """``script`` with its pub/sub publishes made sharded (``SPUBLISH``: the channel lives on
    the master of its slot, which is the script's)."""
    return script.replace("redis.call('PUBLISH'", "redis.call('SPUBLISH'")


PUBLISH = Script(sharded(broker_lua.PUBLISH))
HISTORY = Script(broker_lua.HISTORY)
RENUMBER = Script(broker_lua.RENUMBER)


class RedisClusterBroker(RedisBroker):
    """Shared topics numbered and kept in a Redis Cluster, spread over its masters.

    Args:
        url: ``redis+cluster://[[USER]:PASSWORD@]HOST:PORT[,HOST:PORT...]`` (any of the
            cluster's nodes; the slot map is read from the first that answers).
        partitions: how many partitions the topics are spread over (64: even over 1 to 8
            masters). Every node of a deployment must use the same number.

    The other arguments are ``RedisBroker``'s.
    """

    def __init__(self, url: str, *, partitions: int = PARTITIONS, **options: Any) -> None:
        super().__init__(url, **options)
        self.partitions = partitions
        self.outbox = self.lanes = Lanes(
            self.outbox.messages,
            self.outbox.nbytes,
            self.counters,
            float(options.get("app_share", 0.2)),
            self.partition,
        )
        """The publishes on their way to the masters, a lane per partition (lanes.py)."""
        self._shards: ShardedClient | None = None
        self._subscriber: ShardedSubscriber | None = None
        self._prefixes: dict[int, str] = {}
        self._cluster_link = link = ClusterNodeLink(
            self.prefix,
            self.node,
            lambda name: self.prefix_of(self.partition(name)),
            self.partition,
            lambda: self.shards,
            self.unavailable,
        )
        self.nodes = self.link = link

    # where

    @property
    def shards(self) -> ShardedClient:
        assert self._shards is not None, "the broker is not started"
        return self._shards

    def partition(self, name: str) -> int:
        return partition_of(name, self.partitions)

    def prefix_of(self, partition: int) -> str:
        """What every key and channel of ``partition`` starts with."""
        found = self._prefixes.get(partition)
        if found is None:
            found = partition_prefix(self.prefix, partition, self.partitions)
            self._prefixes[partition] = found
        return found

    def channel_of(self, name: str) -> bytes:
        return (self.prefix_of(self.partition(name)) + "c:" + name).encode()

    # life

    def lacks(self, needs: set[str]) -> set[str]:
        return needs & {"work-queue topics", "keyed topics", "presence"}  # not yet here

    async def start(self, events: EngineEvents) -> Membership:
        self._events = events
        if events.queues:
            raise BrokerStartupError(
                "work-queue topics are not kept on a Redis Cluster yet: give them a "
                "standalone Redis or a Sentinel URL"
            )
        shards = ShardedClient(
            self.url,
            partitions=self.partitions,
            max_connections=self.max_connections,
            pool_timeout=self.pool_timeout,
            socket_timeout=self.connect_timeout,
            connect_timeout=self.connect_timeout,
        )
        try:
            await shards.start()
        except BaseException as exc:
            await shards.close()
            raise BrokerStartupError(
                f"cannot reach the Redis Cluster at {redacted(self.url)} ({exc}): start its "
                "nodes or fix the URL"
            ) from None
        self._shards = shards
        self._subscriber = subscriber = ShardedSubscriber(
            shards, self._heard_sharded, self._lost, deaf=self._deaf
        )
        try:  # this node's channel heard, and the node known, before it serves
            await subscriber.follow(self.link.channel)
            await self._cluster_link.beat()
        except BaseException as exc:
            await subscriber.close()
            await shards.close()
            self._subscriber = self._shards = None
            raise BrokerStartupError(
                f"cannot use the Redis Cluster at {redacted(self.url)} ({exc})"
            ) from None
        self.lanes.start(self._send_part, self.node, events.room_made)
        self._tasks = [asyncio.create_task(self._beat_loop(), name="rubris-broker-beat")]
        return Membership(self.relay, self.node + SESSION_MARK)

    async def stop(self, flush: float = 5.0) -> None:
        await self.outbox.flush(flush)
        await self.lanes.stop()
        await self._end()
        if self._subscriber is not None:
            await self._subscriber.close()
            self._subscriber = None
        if self._shards is not None:
            await self._shards.close()
            self._shards = None

    async def _beat_loop(self) -> None:
        while True:
            await asyncio.sleep(BEAT)
            try:
                await self._cluster_link.beat()
            except Exception as exc:  # the next beat tries again
                log.debug("heartbeat failed: %s", exc)

    # numbering

    def unavailable(self, name: str | None = None) -> str | None:
        """Why the master of ``name``'s partition takes nothing now (None: it does, or no
        name: the other masters' topics are taken whatever one of them does)."""
        return None if name is None else self.lanes.unavailable(self.partition(name))

    def accepting(self, messages: int, nbytes: int) -> bool:
        return self.outbox.room(messages, nbytes)

    def relay(self, topic: SharedTopic, payload: bytes, compressed: bool, how: int) -> int:
        """As ``RedisBroker.relay``, refusing only the topics whose master is away."""
        down = self.lanes.unavailable(self.partition(topic.name))
        if how == Relayed.TAKEN:
            # the intake keeps it meanwhile (bounded), as it does while the outbox is full
            if down is not None or not self.outbox.room_for_taken(len(payload)):
                raise Backlogged
        elif down is not None or not self.outbox.room(1, len(payload)):
            self.outbox.refuse(down, 1)
        self.outbox.put(Entry(topic, payload, compressed, CONDITION.get(how, 0), None))
        return 0

    async def numbered(self, topic: SharedTopic, payload: bytes, compressed: bool) -> int:
        down = self.lanes.unavailable(self.partition(topic.name))
        if down is not None or not self.outbox.room(1, len(payload)):
            self.outbox.refuse(down, 1)
        done: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self.outbox.put(Entry(topic, payload, compressed, 0, done))
        return await done

    def stats(self) -> BrokerStats:
        c = super().stats()
        c.up = self.reach.up and self.lanes.up
        return c

    async def _send_part(
        self, p: int, batch: Sequence[Entry], batch_id: str, reach: Reach
    ) -> list[int]:
        """One script call numbering ``batch`` (all of partition ``p``) on its master,
        retried under the same id until it answers."""
        args, keys = publish_call(self.prefix_of(p), self.ttl_ms, batch, batch_id)
        answer: list[int] = await reach.until_answered(
            lambda: self.shards.run_script(p, PUBLISH, keys, args), "writer"
        )
        return [int(seq) for seq in answer]

    # hearing

    def _topic_of(self, channel: bytes) -> str:
        # P{tag}:c:NAME: the prefix holds one "}" (the base none, the tag none)
        return channel[channel.index(b"}:c:") + 4 :].decode()

    def _heard_sharded(self, channel: bytes, data: bytes) -> None:
        if channel == self.link.channel:
            self.link.heard(data)
        else:
            self._heard(channel, data)

    def _deaf(self, channels: list[bytes]) -> None:
        """These channels are not heard for now: what comes later waits for their history."""
        for ch in channels:
            f = self._following.get(self._topic_of(ch)) if b"}:c:" in ch else None
            if f is not None:
                f.state = JOINING

    def _lost(self, channels: list[bytes]) -> None:
        """Heard again after they may have missed messages: caught up from the history."""
        follows = []
        for ch in channels:
            f = self._following.get(self._topic_of(ch)) if b"}:c:" in ch else None
            if f is not None:
                f.state = JOINING
                follows.append(f)
        if follows:
            self.background(self._catch_up_patiently(follows))

    async def _subscribe(self, names: Sequence[str]) -> None:
        subscriber = self._subscriber
        if subscriber is None:
            raise BrokerUnavailable("the broker is not started")
        await asyncio.gather(*(subscriber.follow(self.channel_of(n)) for n in names))

    @property
    def _hearing(self) -> bool:
        return self._subscriber is not None

    async def _unfollow(self, names: list[str]) -> None:
        subscriber = self._subscriber
        if subscriber is None:
            return
        for n in names:
            if n not in self._following:  # followed again meanwhile: kept
                subscriber.unfollow(self.channel_of(n))

    async def _catch_up_patiently(self, follows: Sequence[Follow]) -> None:
        """As ``RedisBroker``'s, a partition at a time and all at once: a master away holds
        back its own topics only."""
        parts: dict[int, list[Follow]] = {}
        for f in follows:
            parts.setdefault(self.partition(f.topic.name), []).append(f)
        await asyncio.gather(*(self._patiently(p, part) for p, part in parts.items()))

    async def _patiently(self, p: int, follows: list[Follow]) -> None:
        reach = self.lanes.lane(p).reach
        delay = RETRY[0]
        while follows:
            try:
                await self._catch_up(follows)
                if not reach.up:
                    reach.answered()
                return
            except PoolBusy:
                await asyncio.sleep(RETRY[0])
            except RETRIED as exc:
                end_if_cancelled()
                reach.lost("reader", exc)
                await reach.pause(delay)
                delay = min(2 * delay, RETRY[1])
            follows = [f for f in follows if self._following.get(f.topic.name) is f]

    async def _history(self, follows: Sequence[Follow]) -> list[list[Any]]:
        parts: dict[int, list[int]] = {}
        for i, f in enumerate(follows):
            parts.setdefault(self.partition(f.topic.name), []).append(i)
        answers: list[list[Any]] = [[] for _ in follows]

        async def part(p: int, places: list[int]) -> None:
            args, keys = history_call(self.prefix_of(p), self.ttl_ms, [follows[i] for i in places])
            answer = await self.shards.run_script(p, HISTORY, keys, args)
            for i, a in zip(places, answer, strict=True):
                answers[i] = a

        await asyncio.gather(*(part(p, places) for p, places in parts.items()))
        return answers

    async def _renumber_call(self, t: SharedTopic, old: int, epoch: str) -> Any:
        p = self.partition(t.name)
        prefix = self.prefix_of(p)
        return await self.shards.run_script(
            p, RENUMBER, topic_keys(prefix, t), [prefix, t.name, str(old), epoch]
        )

    # what RedisBroker's one connection did, which the shards do here

    def listen(self, channel: str, handler: Any) -> None:
        raise BrokerUnavailable("work-queue topics are not kept on a Redis Cluster yet")
