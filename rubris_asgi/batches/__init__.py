"""Batch fan-out completion tracking (the source document on batch fan-out; protocol.md 8c).

- ``ids``: batch ids and item ids ``{batch}:{group}:{index}``;
- ``bits``: the bitfields of pending items, in fixed chunks;
- ``tracker``: the rules (open, add, seal, ack/fail, complete, expire), sans-IO;
- ``store``: the ``BatchStore`` base class and the in-memory store;
- ``sqlite_store``: ``SQLiteBatchStore``, the embedded default;
- ``service``: ``Batches``, what ``Rubris.batches`` is: ids checked, the sweeper, pushes;
- ``watch``: the ``batch.{id}`` channel, a batch's state changes pushed to its watchers.

The Redis store is ``rubris_asgi.cluster.RedisBatchStore`` (``rubris-asgi[redis]``): it lives
with the rest of Redis, whose connection pool it shares.
"""

from __future__ import annotations

from ..errors import (
    BadCount,
    BatchError,
    BatchExists,
    BatchSealed,
    ItemOutOfRange,
    MalformedItem,
    UnknownBatch,
)
from .ids import ItemRef, item_ids, new_batch_id, parse_item
from .sqlite_store import SQLiteBatchStore
from .store import BatchStore, MemoryBatchStore
from .tracker import BatchStatus, State

__all__ = [
    "BadCount",
    "BatchError",
    "BatchExists",
    "BatchSealed",
    "BatchStatus",
    "BatchStore",
    "ItemOutOfRange",
    "ItemRef",
    "MalformedItem",
    "MemoryBatchStore",
    "SQLiteBatchStore",
    "State",
    "UnknownBatch",
    "item_ids",
    "new_batch_id",
    "parse_item",
]
