"""The old path of :mod:`rubris_asgi.engine.queues`, kept for code written against 0.1.

An alias: no code here.
"""

from ..engine.queues import (
    CoDel,
    PrefetchEstimator,
    QueueHome,
    QueueItem,
    QueueProducers,
    QueueSettings,
    QueueStats,
    QueueSub,
    QueueTopic,
)

__all__ = [
    "CoDel",
    "PrefetchEstimator",
    "QueueHome",
    "QueueItem",
    "QueueProducers",
    "QueueSettings",
    "QueueStats",
    "QueueSub",
    "QueueTopic",
]
