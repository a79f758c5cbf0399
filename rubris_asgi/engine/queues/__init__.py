"""Work-queue topics (mode 4): competing consumers, prefetch sized from the round trip, ACK and
NACK by delivery tag, CoDel on both sides (the source document on prefetch; protocol.md 5).

Sans-IO like the rest of the core: times come in as arguments, nothing awaits.

- ``settings``: a queue channel's settings and their defaults;
- ``topic``: the items waiting and the fair deal to consumers; ``QueueHome``, where they
  wait when several nodes share them;
- ``consumer``: one session's lane, deliveries, ACK/NACK/return and server-side CoDel;
- ``prefetch``: the per-consumer estimate of round trip and processing time;
- ``producers``: the sessions that PUBLISH items to a queue lately, told its fill with FLOW;
- ``codel``: CoDel's state machine, shared with the clients;
- ``dedup``: producers' idempotency keys.
"""

from ...control.codel import CoDel
from .consumer import QueueSub
from .prefetch import PrefetchEstimator
from .producers import QueueProducers
from .settings import QueueSettings
from .topic import QueueHome, QueueItem, QueueStats, QueueTopic

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
