"""Batch fan-out completion tracking (the source document on batch fan-out; protocol.md 8c).

- ``ids``: batch ids and item ids ``{batch}:{group}:{index}``;
- ``bits``: the bitfields of pending items, in fixed chunks;
- ``tracker``: the rules (open, add, seal, ack/fail, complete, expire), sans-IO;
- ``store``: the ``BatchStore`` base class and the in-memory store;
- ``sqlite_store``: ``SQLiteBatchStore``, the embedded default;
- ``redis_store``: ``RedisBatchStore`` (``rubris-asgi[redis]``, imported on first use);
- ``service``: ``Batches``, what ``Rubris.batches`` is: ids checked, the sweeper, pushes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

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

if TYPE_CHECKING:
    from .redis_store import RedisBatchStore

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
    "RedisBatchStore",
    "SQLiteBatchStore",
    "State",
    "UnknownBatch",
    "item_ids",
    "new_batch_id",
    "parse_item",
]


def __getattr__(name: str) -> Any:
    if name == "RedisBatchStore":  # redis is an extra: imported only when asked for
        from .redis_store import RedisBatchStore

        return RedisBatchStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
