"""The old path of :mod:`rubris_asgi.cluster`, kept for code written against 0.1 (an alias: no
code here; ``RedisBroker`` still loads redis on first use)."""

from typing import Any

from .. import cluster
from ..cluster import ENV, WORKERS_ENV, Broker, BrokerStats, LocalBroker, broker_from

__all__ = [
    "ENV",
    "WORKERS_ENV",
    "Broker",
    "BrokerStats",
    "LocalBroker",
    "RedisBroker",
    "broker_from",
]


def __getattr__(name: str) -> Any:
    return getattr(cluster, name)
