"""``ClusterNodeLink``: requests and one-way messages between nodes through a Redis Cluster.

As ``RedisNodeLink`` (nodes.py) and ``Tells`` (tells.py), with each node's channel a sharded
one in the partition of the node's name (``P{tag}:n:NODE``: ``SPUBLISH`` on its master, heard
by the node's ``ShardedSubscriber``), and each node's heartbeat (``P seen``, which ``silent``
and ``live`` read) kept in the same partition: what a shard's loss stops is the nodes whose
name falls there, not every node.

A publish here cannot tell a request that never left from one Redis may have passed on (the
sharded client's connection is taken inside the call): a lost connection is ``MaybeSent``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from redis.exceptions import ResponseError

from ....errors import BrokerUnavailable
from ...nodes import MaybeSent
from ..nodes import DOWN, LIVE, REFUSING, RedisNodeLink
from ..pool import PoolBusy
from ..tells import Tells
from .client import ShardedClient
from .scripts import Script

log = logging.getLogger("rubris_asgi.broker")

BEAT = 1.0
"""Seconds between a node's heartbeats."""
SEEN = Script(
    """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - 86400000)
return now
"""
)
"""A heartbeat: the node's time in ``P seen`` by Redis's clock, kept a day (as queues/lua.py's
``BEAT`` keeps it on one Redis)."""


class ClusterTells(Tells):
    """``Tells`` whose messages go out by ``SPUBLISH``, each to its node's partition: one
    pipeline per partition of a flush, all at once."""

    PUBLISH = "SPUBLISH"

    def __init__(
        self,
        node: str,
        channel_of: Callable[[str], str],
        partition: Callable[[str], int],
        shards: Callable[[], ShardedClient],
        unavailable: Callable[[], str | None],
    ) -> None:
        super().__init__(node, channel_of, lambda: None, unavailable)  # type: ignore[arg-type,return-value]
        self._partition = partition
        self._shards = shards

    async def _publish(self, commands: list[tuple[Any, ...]], nodes: list[str]) -> list[int]:
        shards = self._shards()
        parts: dict[int, list[int]] = {}
        for i, node in enumerate(nodes):
            parts.setdefault(self._partition(node), []).append(i)
        receivers = [0] * len(commands)

        async def part(p: int, places: list[int]) -> None:
            replies = await shards.call(shards.slot(p), [commands[i] for i in places])
            for i, reply in zip(places, replies, strict=True):
                if isinstance(reply, Exception):
                    raise reply
                receivers[i] = int(reply)

        await asyncio.gather(*(part(p, places) for p, places in parts.items()))
        return receivers


class ClusterNodeLink(RedisNodeLink):
    """One node's end on a Redis Cluster."""

    def __init__(
        self,
        prefix: str,
        node: str,
        prefix_of: Callable[[str], str],
        partition: Callable[[str], int],
        shards: Callable[[], ShardedClient],
        unavailable: Callable[[], str | None],
    ) -> None:
        """``prefix_of(name)``: the prefix of the partition of ``name`` (a node's);
        ``partition(name)``: that partition; ``shards()``: the broker's sharded client."""
        self._prefix_of = prefix_of
        self._partition = partition
        self._shards = shards
        super().__init__(prefix, node, lambda: None, unavailable)  # type: ignore[arg-type,return-value]
        self.tells = ClusterTells(node, self.channel_of, partition, shards, unavailable)

    def channel_of(self, node: str) -> str:
        return self._prefix_of(node) + "n:" + node

    async def _publish(self, node: str, message: bytes) -> int:
        down = self._unavailable()
        if down is not None:
            raise BrokerUnavailable(down)
        try:
            receivers = await self._shards().execute(
                self._partition(node), "SPUBLISH", self.channel_of(node), message
            )
        except PoolBusy:
            raise  # no connection came free: nothing sent
        except (*REFUSING, ResponseError) as exc:  # refused: published to nobody
            raise BrokerUnavailable(f"Redis refused SPUBLISH: {exc}") from exc
        except DOWN as exc:
            raise MaybeSent(f"Redis failed during SPUBLISH: {exc}") from exc
        return int(receivers)

    async def beat(self) -> None:
        """This node's heartbeat in its partition's ``P seen``."""
        p = self._partition(self.node)
        key = self._prefix_of(self.node) + "seen"
        await self._shards().run_script(p, SEEN, [key], [self.node])

    async def live(self) -> list[str]:
        """The nodes whose last heartbeat (each in its own name's partition) is younger than
        ``LIVE`` by Redis's clock. Raises ``BrokerUnavailable`` when a master does not answer
        (the nodes it keeps are then unknown)."""
        shards = self._shards()

        async def read(p: int) -> list[str]:
            key = self._prefix_of_partition(p) + "seen"
            pipe = shards.pipeline(p)
            pipe.command("TIME")
            pipe.command("ZRANGE", key, 0, -1, "WITHSCORES")
            (now_s, now_us), flat = await pipe.execute()
            now = int(now_s) * 1000 + int(now_us) // 1000
            return [
                flat[i].decode()
                for i in range(0, len(flat), 2)
                if now - float(flat[i + 1]) <= LIVE * 1000
            ]

        found = await asyncio.gather(
            *(read(p) for p in range(shards.partitions)), return_exceptions=True
        )
        nodes: set[str] = set()
        for f in found:
            if isinstance(f, BaseException):
                # a master away: the nodes whose heartbeats it keeps are unknown, and a list
                # without them would be taken for every node (ends.py asks each)
                raise BrokerUnavailable(f"a Redis master did not answer: {f}") from f
            nodes.update(f)
        return sorted(nodes)

    def _prefix_of_partition(self, p: int) -> str:
        return self._shards().prefix(self.prefix, p)

    async def silent(self, node: str, seconds: float) -> bool:
        p = self._partition(node)
        pipe = self._shards().pipeline(p)
        pipe.command("ZSCORE", self._prefix_of(node) + "seen", node)
        pipe.command("TIME")
        score, (now_s, now_us) = await pipe.execute()
        if score is None:
            return True
        return bool(int(now_s) * 1000 + int(now_us) // 1000 - float(score) > seconds * 1000)
