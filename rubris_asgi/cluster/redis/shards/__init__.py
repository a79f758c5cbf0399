"""rubris on a Redis Cluster.

- ``broker.py``: ``RedisClusterBroker``, ``RedisBroker``'s topics spread over the masters by
  partition, each partition's publishes in a lane of their own (``lanes.py``) so that a master
  away holds back its own topics only; ``nodes.py``: ``ClusterNodeLink``, requests and one-way
  messages between nodes on channels in their names' partitions;

and the layer they stand on:

- ``partitions.py``: the key space cut into partitions, each a hash tag, so that each
  partition's keys and channels live on one master and one script can change them (sans-IO);
- ``address.py``: the ``redis+cluster://`` URL (sans-IO);
- ``slotmap.py``: which master serves each slot, and the redirects that correct it (sans-IO);
- ``answers.py``: what a cluster's error replies mean for the command they answer;
- ``scripts.py``: ``Script``, a Lua script sent by its SHA1;
- ``client.py``: ``ShardedClient``, commands and scripts of a partition on its master's
  capped pool, ``MOVED``/``ASK``/``TRYAGAIN``/``NOSCRIPT`` followed, ``CLUSTERDOWN`` raised as
  Redis refusing; ``pipeline.py``: a partition's commands in one round trip;
- ``pubsub.py``: ``ShardedSubscriber``, sharded channels heard on one connection per master
  (``link.py``), and every channel that may have missed messages reported.

The names below load on first use (PEP 562), so that the sans-IO modules (partitions,
address, slotmap) import without redis-py.
"""

import typing as _typing
from importlib import import_module as _import_module

if _typing.TYPE_CHECKING:  # what the names are, for type checkers and editors
    from .address import ClusterTarget, cluster_url, is_cluster_url
    from .answers import SlotsRefused
    from .broker import RedisClusterBroker
    from .client import ShardedClient, ShardStats
    from .partitions import PARTITIONS, key_slot, partition_of, prefix, slot_of_partition, tag
    from .pipeline import PartitionPipeline
    from .pubsub import ShardedSubscriber
    from .scripts import Script
    from .slotmap import Redirect, SlotMap

_HOME = {
    "ClusterTarget": ".address",
    "PARTITIONS": ".partitions",
    "PartitionPipeline": ".pipeline",
    "Redirect": ".slotmap",
    "Script": ".scripts",
    "ShardStats": ".client",
    "ShardedClient": ".client",
    "ShardedSubscriber": ".pubsub",
    "RedisClusterBroker": ".broker",
    "SlotMap": ".slotmap",
    "SlotsRefused": ".answers",
    "cluster_url": ".address",
    "is_cluster_url": ".address",
    "key_slot": ".partitions",
    "partition_of": ".partitions",
    "prefix": ".partitions",
    "slot_of_partition": ".partitions",
    "tag": ".partitions",
}
"""Each public name's module."""

__all__ = [
    "ClusterTarget",
    "PARTITIONS",
    "PartitionPipeline",
    "Redirect",
    "RedisClusterBroker",
    "Script",
    "ShardStats",
    "ShardedClient",
    "ShardedSubscriber",
    "SlotMap",
    "SlotsRefused",
    "cluster_url",
    "is_cluster_url",
    "key_slot",
    "partition_of",
    "prefix",
    "slot_of_partition",
    "tag",
]


def __getattr__(name: str) -> _typing.Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(_import_module(home, __name__), name)
    globals()[name] = value  # once: later lookups do not come here
    return value
