"""``BatchStore``: where batches live, and the in-memory store.

A store keeps each batch's record, its groups (start and size) and its bits, and applies the
rules of tracker.py to them atomically: two processes acking items of one batch at the same
time never lose a bit, and exactly one answer says ``completed``. Every method takes the time
from its caller (wall-clock seconds) so expiry can be tested with a fake clock.

Implementations: ``MemoryBatchStore`` (one process, nothing kept across restarts),
``SQLiteBatchStore`` (the embedded default; several processes on one host), and
``RedisBatchStore`` (several hosts; ``rubris-asgi[redis]``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

from ..config import BatchConfig
from . import tracker
from .ids import ItemRef
from .tracker import LIVE, BatchStatus, MemoryView


class BatchStore(ABC):
    """The operations batch tracking needs of storage; every one is atomic."""

    config: BatchConfig = BatchConfig()
    """The limits and times of batches (``configure``), the defaults until then."""

    def configure(self, config: BatchConfig) -> None:
        """Use ``config`` (the ``Batches`` that uses the store gives ``Config.batches``)."""
        self.config = config

    async def start(self) -> None:  # noqa: B027 (a store with nothing to connect keeps it)
        """Connect; called once before the first operation."""

    async def close(self) -> None:  # noqa: B027
        """Disconnect; nothing is lost (every operation committed when it returned)."""

    @abstractmethod
    async def open(self, batch: str, now: float) -> BatchStatus:
        """Create the batch ``batch`` (a fresh id), open."""

    @abstractmethod
    async def add(self, batch: str, count: int, now: float) -> int:
        """Add a group of ``count`` items; returns the group's number."""

    @abstractmethod
    async def seal(self, batch: str, now: float) -> BatchStatus:
        """Forbid further adds."""

    @abstractmethod
    async def end(
        self, items: Sequence[ItemRef], now: float, *, failed: bool = False
    ) -> dict[str, BatchStatus]:
        """Mark items done (or failed); all or nothing; one status per batch touched."""

    @abstractmethod
    async def status(self, batch: str) -> BatchStatus:
        """The batch's state and counts; ``UnknownBatch`` once forgotten."""

    @abstractmethod
    async def check(self, items: Sequence[ItemRef]) -> None:
        """Raise as ``end`` would for the first item that names no item of a known batch."""

    @abstractmethod
    async def sweep(self, now: float) -> list[tuple[str, BatchStatus]]:
        """Expire live batches idle past their expiry and forget ended ones kept past
        ``config.keep``; returns the batches that expired now."""

    async def footprint(self) -> int:
        """Bytes the store holds for its batches (for bench/batches.py); 0 if unknown."""
        return 0


class MemoryBatchStore(BatchStore):
    """Batches in this process's memory: fast, lost on restart, not shared between workers."""

    def __init__(self) -> None:
        self.view = MemoryView()

    async def open(self, batch: str, now: float) -> BatchStatus:
        return tracker.open_batch(self.view, batch, now)

    async def add(self, batch: str, count: int, now: float) -> int:
        return tracker.add(self.view, batch, count, now, self.config)

    async def seal(self, batch: str, now: float) -> BatchStatus:
        return tracker.seal(self.view, batch, now)

    async def end(
        self, items: Sequence[ItemRef], now: float, *, failed: bool = False
    ) -> dict[str, BatchStatus]:
        return tracker.end(self.view, items, now, failed=failed)

    async def status(self, batch: str) -> BatchStatus:
        return tracker.status(self.view, batch)

    async def check(self, items: Sequence[ItemRef]) -> None:
        tracker.check(self.view, items)

    async def sweep(self, now: float) -> list[tuple[str, BatchStatus]]:
        expired: list[tuple[str, BatchStatus]] = []
        for rec in list(self.view.records.values()):
            if rec.state in LIVE and rec.touched < tracker.idle_cutoff(rec.state, now, self.config):
                expired.append((rec.id, tracker.expire(self.view, rec, now)))
            elif rec.ended is not None and rec.ended < now - self.config.keep:
                self.view.forget(rec.id)
        return expired

    async def footprint(self) -> int:
        return sum(len(b) for chunks in self.view.chunks.values() for b in chunks.values())
