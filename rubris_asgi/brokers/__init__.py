"""Brokers: how several nodes (workers, hosts) share their shared topics.

- ``base``: ``Broker``, what every broker does, and ``LocalBroker``, one node alone (the
  default: nothing added to a publish);
- ``redis_broker``: ``RedisBroker`` (``rubris-asgi[redis]``, imported on first use), topics
  numbered and kept in Redis, heard through pub/sub;
- ``redis_scripts``: its Lua scripts;
- ``redis_nodes``: requests between nodes;
- ``redis_pool``: the capped connection pool every Redis client of a node waits on
  (``PoolBusy``);
- ``redis_persistence``: Redis's persistence read at start, and the refusal to keep queue
  items or batches where a restart would lose them (``RedisNotDurable``);
- ``redis_queues``, ``redis_queue_scripts``: work-queue topics kept in Redis.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from .base import Broker, BrokerStats, LocalBroker

if TYPE_CHECKING:
    from .redis_broker import RedisBroker

__all__ = [
    "ENV",
    "WORKERS_ENV",
    "Broker",
    "BrokerStats",
    "LocalBroker",
    "RedisBroker",
    "broker_from",
]

ENV = "RUBRIS_REDIS_URL"
"""The setting that makes every worker share its topics through that Redis."""
WORKERS_ENV = "RUBRIS_WORKERS"
"""Set by ``serve(workers=N)`` for its workers: a ``Rubris`` alone (no broker) refuses to start
under several, as each would serve its own topics and a publish would reach a part of them."""


def broker_from(spec: Broker | str | None) -> Broker:
    """A broker from ``Rubris(broker=...)``: a ready one, a Redis URL, or None: the URL in
    ``$RUBRIS_REDIS_URL`` when set (``uvicorn --workers N`` needs nothing else), else alone."""
    if isinstance(spec, Broker):
        return spec
    url = spec if spec is not None else os.environ.get(ENV, "")
    if not url:
        return LocalBroker()
    from .redis_broker import RedisBroker

    return RedisBroker(url)


def __getattr__(name: str) -> Any:
    if name == "RedisBroker":  # only now: redis is an optional extra
        from .redis_broker import RedisBroker

        return RedisBroker
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
