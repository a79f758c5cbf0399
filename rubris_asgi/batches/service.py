"""``Batches``: batch tracking as ``Rubris.batches`` offers it, over any ``BatchStore``.

It checks ids, takes the time from its clock, tells a listener every change of a batch's
state (``Rubris`` pushes it on ``batch.{id}``), runs the sweeper, and carries the ends of
queue items enqueued with ``batch_item`` to the store: the engine reports them synchronously
from its ACK and dead-letter paths, and a task hands them to the store in requests of many.

That hand-over is bounded (``BatchConfig.max_pending``): when the store cannot keep up or is
down for long, ends past the bound are dropped, counted and logged, and their batches expire
instead of completing. While the store is down, the task retries every second.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ..config import BatchConfig
from ..errors import BatchError
from .ids import BATCH_ID, ItemRef, item_ids, new_batch_id, parse_item
from .sqlite_store import SQLiteBatchStore
from .store import BatchStore
from .tracker import BatchStatus

log = logging.getLogger("rubris_asgi.batches")

Listener = Callable[[str, BatchStatus], None]

RETRY = 1.0
"""Seconds between two attempts to hand queue-item ends to a store that failed."""


@dataclass(frozen=True)
class Group:
    """What an add returns: the group's number and size, and the ids of its items."""

    batch: str
    group: int
    count: int

    def ids(self) -> list[str]:
        return list(item_ids(self.batch, self.group, self.count))

    def id(self, index: int) -> str:
        return f"{self.batch}:{self.group}:{index}"


@dataclass
class PendingStats:
    """Queue-item ends on their way to the store."""

    handed: int = 0
    dropped: int = 0
    """Ends dropped at the ``max_pending`` bound, or naming an item the store refused."""


class Batches:
    """Open, add, seal, ack, fail, status; see docs/guide.md "Tracking batches"."""

    def __init__(
        self,
        store: BatchStore,
        config: BatchConfig | None = None,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.config = config or BatchConfig()
        store.configure(self.config)
        self.clock = clock
        self.listener: Listener | None = None
        """Told every new state of a batch (seal, ends, expiry) after the store took it."""
        self.after_sweep: Callable[[], object] | None = None
        """Called after each sweep (the watch channel drops the batch topics nobody watches)."""
        self.pending = PendingStats()
        self._done: list[str] = []
        self._failed: list[str] = []
        self._wake: asyncio.Event | None = None

    def watched_by(self, listener: Listener, after_sweep: Callable[[], object]) -> None:
        """The seam to the ``batch.{id}`` channel (watch.py): ``listener(batch, status)`` is
        told every new state of a batch, ``after_sweep()`` runs after each sweep."""
        self.listener = listener
        self.after_sweep = after_sweep

    @classmethod
    def from_spec(cls, spec: Batches | BatchStore | str | bool, config: Any) -> Batches | None:
        """``Rubris(batches=...)`` made into the ``Batches`` it means (None: off); ``config``
        is the app's ``Config``."""
        if spec is False:
            return None
        if isinstance(spec, Batches):
            return spec
        if spec is True:
            spec = SQLiteBatchStore()
        elif isinstance(spec, str):
            spec = SQLiteBatchStore(spec)
        if not isinstance(spec, BatchStore):
            raise TypeError(f"batches: a BatchStore, a path or a bool, got {type(spec).__name__}")
        return cls(spec, config.batches)

    # the operations

    async def open(self, batch: str | None = None) -> str:
        """Open a batch; returns its id (``batch``, or a fresh random one)."""
        if batch is None:
            batch = new_batch_id()
        elif not BATCH_ID.match(batch):
            raise ValueError(f"a batch id is 1 to 64 of [0-9A-Za-z_-], got {batch!r}")
        await self.store.open(batch, self.clock())
        return batch

    async def add(self, batch: str, count: int) -> Group:
        """Add ``count`` items as one group: their ids are ``Group.ids()``."""
        if not isinstance(count, int) or isinstance(count, bool):
            raise TypeError(f"count must be an int, got {type(count).__name__}")
        group = await self.store.add(batch, count, self.clock())
        return Group(batch, group, count)

    async def seal(self, batch: str) -> BatchStatus:
        """No more adds; ``completed`` when every item had already ended."""
        st = await self.store.seal(batch, self.clock())
        self._tell(batch, st)
        return st

    async def ack(self, items: Iterable[str | ItemRef]) -> dict[str, BatchStatus]:
        """Mark items done; idempotent; all or nothing. One status per batch touched."""
        return await self._end(items, failed=False)

    async def fail(self, items: Iterable[str | ItemRef]) -> dict[str, BatchStatus]:
        """Mark items failed (they count toward completion, as ``failed``)."""
        return await self._end(items, failed=True)

    async def status(self, batch: str) -> BatchStatus:
        return await self.store.status(batch)

    async def check(self, items: Sequence[ItemRef]) -> None:
        """Raise as ``ack`` would for the first item that is not in a known batch."""
        await self.store.check(items)

    async def _end(self, items: Iterable[str | ItemRef], failed: bool) -> dict[str, BatchStatus]:
        refs = [i if isinstance(i, ItemRef) else parse_item(i) for i in items]
        out = await self.store.end(refs, self.clock(), failed=failed)
        for batch, st in out.items():
            self._tell(batch, st)
        return out

    async def sweep(self) -> list[tuple[str, BatchStatus]]:
        """Expire idle batches, forget old ended ones (the sweeper's work, callable)."""
        expired = await self.store.sweep(self.clock())
        for batch, st in expired:
            self._tell(batch, st)
        if self.after_sweep is not None:
            self.after_sweep()
        return expired

    def _tell(self, batch: str, st: BatchStatus) -> None:
        if self.listener is not None:
            try:
                self.listener(batch, st)
            except Exception:
                log.exception("batch listener failed for %s", batch)

    # queue items enqueued with batch_item (the engine's synchronous side)

    def item_ended(self, item: str, failed: bool) -> None:
        """A queue item carrying ``item`` was ACKed (done) or dead-lettered (failed)."""
        if len(self._done) + len(self._failed) >= self.config.max_pending:
            self.pending.dropped += 1
            if self.pending.dropped == 1 or self.pending.dropped % 10_000 == 0:
                log.error(
                    "batch item ends: %d waiting for the store, the maximum; %d dropped so far",
                    self.config.max_pending,
                    self.pending.dropped,
                )
            return
        (self._failed if failed else self._done).append(item)
        if self._wake is not None:
            self._wake.set()

    # the tasks

    async def run(self) -> None:
        """The sweeper and the hand-over of queue-item ends, until cancelled."""
        await self.store.start()
        self._wake = asyncio.Event()
        sweeper = asyncio.create_task(self._sweeper(), name="rubris-batch-sweeper")
        try:
            await self._hand_over()
        finally:
            sweeper.cancel()
            await asyncio.gather(sweeper, return_exceptions=True)

    async def _sweeper(self) -> None:
        while True:
            try:
                await self.sweep()
            except Exception:
                log.exception("batch sweep failed")
            await asyncio.sleep(self.config.sweep_every)

    async def _hand_over(self) -> None:
        wake = self._wake
        assert wake is not None
        while True:
            await wake.wait()
            wake.clear()
            await self.flush()

    async def flush(self) -> None:
        """Hand every queue-item end waiting to the store (retrying while it fails)."""
        while self._done or self._failed:
            done, self._done = self._done, []
            failed, self._failed = self._failed, []
            try:
                await self._hand(done, False)
                await self._hand(failed, True)
            except asyncio.CancelledError:
                # stopping mid-request: stop() flushes again, and acking twice changes nothing
                self._done[:0] = done
                self._failed[:0] = failed
                raise
            except Exception:
                log.exception("batch store failed; retrying in %.0f s", RETRY)
                self._done[:0] = done  # not lost: first in line again
                self._failed[:0] = failed
                await asyncio.sleep(RETRY)

    async def _hand(self, items: list[str], failed: bool) -> None:
        if not items:
            return
        refs = [parse_item(i) for i in items]  # checked when enqueued
        try:
            out = await self.store.end(refs, self.clock(), failed=failed)
        except BatchError:
            # all or nothing would let one forgotten batch hold back every other: one by one
            out = {}
            for ref in refs:
                try:
                    out.update(await self.store.end([ref], self.clock(), failed=failed))
                except BatchError as exc:
                    self.pending.dropped += 1
                    log.warning("batch item %s of a queue item: %s", ref, exc.reason)
        self.pending.handed += len(items)
        for batch, st in out.items():
            self._tell(batch, st)
