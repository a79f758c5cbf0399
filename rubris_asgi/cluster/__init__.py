"""Several nodes (workers, hosts): everything that knows another node exists.

- ``base``: ``Broker``, what every broker does, and ``LocalBroker``, one node alone (the
  default: nothing added to a publish);
- ``sends``: ``Rubris.send_to``, a private message to a session on whichever node it lives;
- ``redis/``: the Redis of several nodes (``rubris-asgi[redis]``, imported on first use):
  ``broker`` (``RedisBroker``: topics numbered and kept in Redis, heard through pub/sub) and its
  Lua (``broker_lua``), ``nodes`` (requests between nodes), ``pool`` (the capped connection
  pool every Redis client of a node waits on, ``PoolBusy``), ``persistence`` (Redis's
  persistence read at start; ``RedisNotDurable``), ``queues`` and ``queues_lua`` (work-queue
  topics kept in Redis), ``batch_store`` (``RedisBatchStore``).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from .base import Broker, BrokerStats, LocalBroker

if TYPE_CHECKING:
    from .redis.batch_store import RedisBatchStore
    from .redis.broker import RedisBroker

__all__ = [
    "ENV",
    "WORKERS_ENV",
    "Broker",
    "BrokerStats",
    "LocalBroker",
    "RedisBatchStore",
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
    from .redis.broker import RedisBroker

    return RedisBroker(url)


def __getattr__(name: str) -> Any:
    if name == "RedisBroker":  # only now: redis is an optional extra
        from .redis.broker import RedisBroker

        return RedisBroker
    if name == "RedisBatchStore":
        from .redis.batch_store import RedisBatchStore

        return RedisBatchStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
