"""The rules of batch tracking, sans-IO: open, add, seal, ack or fail, complete, expire.

A producer opens a batch, adds groups of items (each add returns a group number; item ids are
``{batch}:{group}:{index}``), then seals it. Items end by ack (done) or fail (failed), each
once: a bit per item is cleared by the first end, and a repeated or retried end finds it clear
and changes nothing. A batch is complete when it is sealed and done + failed = total,
whichever comes last, so the seal reports completion when every item ended before it, and
the last end reports it otherwise; ``completed`` is True in exactly that one answer.

The rules read and write a ``View``: one store's rows for the span of one operation (a
transaction in SQLite, dictionaries in memory). Every check runs before anything changes, so
an error leaves the view as it was. Times are the caller's (wall-clock seconds), which the
stores persist; ``expire`` is the sweeper's half.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum
from typing import Any, Protocol

from ..config import BatchConfig
from ..errors import BadCount, BatchExists, BatchSealed, ItemOutOfRange, UnknownBatch
from .bits import CHUNK_BITS, clear_bits, set_range, spans
from .ids import ItemRef


class State(str, Enum):
    OPEN = "open"
    SEALED = "sealed"
    COMPLETE = "complete"
    EXPIRED = "expired"


LIVE = (State.OPEN, State.SEALED)
"""States in which items may still end."""


@dataclass(frozen=True)
class BatchStatus:
    """What every answer about a batch says (protocol.md 8c)."""

    state: State
    total: int
    done: int
    failed: int
    completed: bool = False
    """True only in the answer of the seal or the end that completed the batch."""

    def to_json(self) -> dict[str, Any]:
        return {
            "state": self.state.value,
            "total": self.total,
            "done": self.done,
            "failed": self.failed,
            "completed": self.completed,
        }


@dataclass
class BatchRecord:
    """A batch's row: everything but its groups and bits."""

    id: str
    state: State
    total: int = 0
    done: int = 0
    failed: int = 0
    groups: int = 0
    touched: float = 0.0
    """Last activity (open, add, seal, an end that changed something)."""
    ended: float | None = None
    """When it completed or expired."""

    def status(self, completed: bool = False) -> BatchStatus:
        return BatchStatus(self.state, self.total, self.done, self.failed, completed)


class View(Protocol):
    """A store's rows as the rules see them during one operation."""

    def record(self, batch: str) -> BatchRecord | None:
        """The batch's record (the same object for the whole operation), or None."""

    def group(self, batch: str, group: int) -> tuple[int, int] | None:
        """``(start, count)`` of a group: its first item's number in the batch, its size."""

    def chunk(self, batch: str, k: int) -> bytearray:
        """Chunk ``k`` of the batch's bits to change in place (zeroes if never written)."""

    def put_record(self, rec: BatchRecord) -> None:
        """``rec`` was created or changed."""

    def put_group(self, batch: str, group: int, start: int, count: int) -> None:
        """A new group."""

    def drop_bits(self, batch: str) -> None:
        """The batch ended: its bits are no longer needed."""


DEFAULTS = BatchConfig()


def open_batch(view: View, batch: str, now: float) -> BatchStatus:
    if view.record(batch) is not None:
        raise BatchExists(f"batch {batch} exists already")
    rec = BatchRecord(batch, State.OPEN, touched=now)
    view.put_record(rec)
    return rec.status()


def add(view: View, batch: str, count: int, now: float, limits: BatchConfig = DEFAULTS) -> int:
    """Add a group of ``count`` items; returns its number."""
    rec = _known(view, batch)
    if rec.state is not State.OPEN:
        raise BatchSealed(f"batch {batch} is {rec.state.value}: no items can be added")
    if count < 1:
        raise BadCount(f"count must be at least 1, got {count}")
    if rec.total + count > limits.max_items:
        raise BadCount(
            f"batch {batch} would hold {rec.total + count} items, over the maximum of "
            f"{limits.max_items}"
        )
    if rec.groups >= limits.max_groups:
        raise BadCount(f"batch {batch} has {rec.groups} groups, the maximum")
    group = rec.groups
    view.put_group(batch, group, rec.total, count)
    for k, lo, hi in spans(rec.total, count):
        set_range(view.chunk(batch, k), lo, hi)
    rec.total += count
    rec.groups += 1
    rec.touched = now
    view.put_record(rec)
    return group


def seal(view: View, batch: str, now: float) -> BatchStatus:
    """Forbid further adds; says ``completed`` when every item had already ended. Sealing
    a batch that is no longer open changes nothing and answers its state."""
    rec = _known(view, batch)
    if rec.state is not State.OPEN:
        return rec.status()
    rec.state = State.SEALED
    rec.touched = now
    completed = _settle(view, rec, now)
    view.put_record(rec)
    return rec.status(completed)


def end(
    view: View, items: Iterable[ItemRef], now: float, *, failed: bool = False
) -> dict[str, BatchStatus]:
    """End ``items`` (ack, or fail with ``failed``); one status per batch touched.

    Raises ``UnknownBatch`` or ``ItemOutOfRange`` for the first item at fault, before
    anything changes. Ends of items already ended, or of batches no longer live, change
    nothing.
    """
    bits = locate(view, items)
    out: dict[str, BatchStatus] = {}
    for batch, chunks in bits.items():
        rec = _known(view, batch)
        completed = False
        if rec.state in LIVE:
            n = sum(clear_bits(view.chunk(batch, k), offs) for k, offs in chunks.items())
            if n:
                if failed:
                    rec.failed += n
                else:
                    rec.done += n
                rec.touched = now
                completed = _settle(view, rec, now)
                view.put_record(rec)
        out[batch] = rec.status(completed)
    return out


def locate(view: View, items: Iterable[ItemRef]) -> dict[str, dict[int, list[int]]]:
    """Each item's bit, as batch -> chunk -> offsets; raises ``UnknownBatch`` or
    ``ItemOutOfRange`` for the first item that is not in a known batch."""
    bits: dict[str, dict[int, list[int]]] = {}
    for ref in items:
        per = bits.get(ref.batch)
        if per is None:
            _known(view, ref.batch, str(ref))
            per = bits[ref.batch] = {}
        g = view.group(ref.batch, ref.group) if ref.group >= 0 else None
        if g is None or not 0 <= ref.index < g[1]:
            why = "no such group" if g is None else f"the group has {g[1]} items"
            raise ItemOutOfRange(f"item {ref} is not in batch {ref.batch} ({why})", str(ref))
        k, offset = divmod(g[0] + ref.index, CHUNK_BITS)
        per.setdefault(k, []).append(offset)
    return bits


check = locate


def status(view: View, batch: str) -> BatchStatus:
    return _known(view, batch).status()


def idle_cutoff(state: State, now: float, config: BatchConfig) -> float:
    """A live batch in ``state`` last touched before this time is due to expire."""
    return now - (config.expiry if state is State.OPEN else config.sealed_expiry)


def expire(view: View, rec: BatchRecord, now: float) -> BatchStatus:
    """The sweeper found ``rec`` live but idle past its expiry: it ends as expired."""
    rec.state = State.EXPIRED
    rec.ended = now
    view.drop_bits(rec.id)
    view.put_record(rec)
    return rec.status()


def _known(view: View, batch: str, item: str | None = None) -> BatchRecord:
    rec = view.record(batch)
    if rec is None:
        named = f" (item {item})" if item is not None else ""
        raise UnknownBatch(f"unknown batch {batch!r}{named}", item)
    return rec


def _settle(view: View, rec: BatchRecord, now: float) -> bool:
    """Complete ``rec`` if it is sealed and every item ended; True when it just did."""
    if rec.state is State.SEALED and rec.done + rec.failed == rec.total:
        rec.state = State.COMPLETE
        rec.ended = now
        view.drop_bits(rec.id)
        return True
    return False


class MemoryView:
    """Every batch in dictionaries: the rules' own storage, for one process (and tests)."""

    def __init__(self) -> None:
        self.records: dict[str, BatchRecord] = {}
        self.groups: dict[str, list[tuple[int, int]]] = {}
        self.chunks: dict[str, dict[int, bytearray]] = {}

    def record(self, batch: str) -> BatchRecord | None:
        return self.records.get(batch)

    def group(self, batch: str, group: int) -> tuple[int, int] | None:
        groups = self.groups.get(batch, ())
        return groups[group] if group < len(groups) else None

    def chunk(self, batch: str, k: int) -> bytearray:
        chunks = self.chunks.setdefault(batch, {})
        buf = chunks.get(k)
        if buf is None:
            buf = chunks[k] = bytearray(CHUNK_BITS // 8)
        return buf

    def put_record(self, rec: BatchRecord) -> None:
        self.records[rec.id] = rec

    def put_group(self, batch: str, group: int, start: int, count: int) -> None:
        self.groups.setdefault(batch, []).append((start, count))

    def drop_bits(self, batch: str) -> None:
        self.chunks.pop(batch, None)

    def forget(self, batch: str) -> None:
        self.records.pop(batch, None)
        self.groups.pop(batch, None)
        self.chunks.pop(batch, None)
