"""Several nodes (workers, hosts): everything that knows another node exists.

- ``base``: ``Broker``, what every broker does, and ``LocalBroker``, one node alone (the
  default: nothing added to a publish);
- ``sends``: ``Rubris.send_to``, a private message to a session on whichever node it lives;
- ``redis/``: the Redis of several nodes (``rubris-asgi[redis]``, imported on first use):
  ``broker`` (``RedisBroker``: topics numbered and kept in Redis, heard through pub/sub) and its
  Lua (``broker_lua``), ``nodes`` (requests between nodes), ``pool`` (the capped connection
  pool every Redis client of a node waits on, ``PoolBusy``), ``persistence`` (Redis's
  persistence read at start; ``RedisNotDurable``), ``queues/`` (work-queue
  topics kept in Redis), ``batch_store`` (``RedisBatchStore``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .base import ENV, WORKERS_ENV, Broker, BrokerStats, LocalBroker
from .nodes import NodeLink

if TYPE_CHECKING:
    from ..batches.store import BatchStore
    from .redis.batch_store import RedisBatchStore
    from .redis.broker import RedisBroker

__all__ = [
    "ENV",
    "WORKERS_ENV",
    "Broker",
    "BrokerStats",
    "Cluster",
    "LocalBroker",
    "NodeLink",
    "RedisBatchStore",
    "RedisBroker",
    "broker_from",
    "cluster_from",
]


def broker_from(spec: Broker | str | None) -> Broker:
    """A broker from ``Rubris(broker=...)``: a ready one, a Redis URL, or None: the URL in
    ``$RUBRIS_REDIS_URL`` when set (``uvicorn --workers N`` needs nothing else), else alone."""
    if isinstance(spec, Broker):
        return spec
    url = spec if spec is not None else os.environ.get(ENV, "")
    if not url:
        return LocalBroker()
    from .redis.shards.address import is_cluster_url

    if is_cluster_url(url):
        from .redis.shards.broker import RedisClusterBroker

        return RedisClusterBroker(url)
    from .redis.broker import RedisBroker

    return RedisBroker(url)


@dataclass(frozen=True)
class Cluster:
    """What a node shares with the others, made together from one setting (``cluster_from``).

    The queue home is not here: the broker hands it to the engine when it starts, with the
    relay (``Membership``, engine/membership.py), since it lives on the broker's connection.
    """

    broker: Broker
    """Numbers the shared publishes and hands them to every node that follows their topic."""
    nodes: NodeLink
    """Requests to the node that holds a session (alone: nobody to ask)."""
    batch_store: BatchStore | None
    """The batch store every node shares (``Rubris(batches=True)``); None alone: the
    embedded SQLite default."""


def cluster_from(spec: Broker | str | None) -> Cluster:
    """The cluster of ``Rubris(broker=...)``: ``broker_from(spec)``, its node link, and with a
    ``RedisBroker`` the batch store in the same Redis under the same prefix, so that every node
    sees every batch. The store is made for every app and used by few: a Redis that would lose
    batches is refused at the first batch opened, not at start."""
    broker = broker_from(spec)
    store: BatchStore | None = None
    if broker.distributed:
        from .redis.broker import RedisBroker
        from .redis.shards.broker import RedisClusterBroker

        if isinstance(broker, RedisBroker) and not isinstance(broker, RedisClusterBroker):
            from .redis.batch_store import RedisBatchStore

            store = RedisBatchStore(
                broker.url,
                prefix=broker.prefix,
                max_connections=broker.max_connections,
                pool_timeout=broker.pool_timeout,
                allow_volatile=broker.allow_volatile,
                check_at_start=False,
                wait_replicas=broker.replicas.count,
                wait_timeout=broker.replicas.timeout_ms / 1000,
            )
    return Cluster(broker, broker.nodes, store)


def __getattr__(name: str) -> Any:
    if name == "RedisBroker":  # only now: redis is an optional extra
        from .redis.broker import RedisBroker

        return RedisBroker
    if name == "RedisClusterBroker":
        from .redis.shards.broker import RedisClusterBroker

        return RedisClusterBroker
    if name == "RedisBatchStore":
        from .redis.batch_store import RedisBatchStore

        return RedisBatchStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
