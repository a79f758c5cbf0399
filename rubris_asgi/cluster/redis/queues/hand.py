"""``Hand``: the items of a node's own latest runs, kept to be dealt again as they are.

Most items a busy node enqueues are taken back by the same node (its consumers have room), and
decoding a record costs more than the item's whole way through Redis. So a node keeps the items
of its latest runs (``MINE_MAX`` at most) and, taking a piece of one back, deals them instead
of decoding the records, each item at most once, and only when each record taken is, byte for
byte, the one the item was put as (a record says all an item is: counts, id, batch item,
payload): a run that differs (another of the same number, or one Redis changed) is decoded.
"""

from __future__ import annotations

import bisect
from collections import OrderedDict

from ....engine.queues import QueueItem
from .runs import HEAD

MINE_MAX = 16384
"""Items of its own latest runs a node keeps in hand at most (the oldest runs go first)."""


class Mine:
    """A run this node made and Redis took whole: its items as they were put."""

    __slots__ = ("items", "run", "ends", "dealt", "left")

    def __init__(self, items: list[QueueItem], run: bytes, ends: list[int]) -> None:
        self.items = items
        self.run = memoryview(run)[HEAD.size + 4 * len(items) :]
        """The run's records, back to back."""
        self.ends = ends
        self.dealt = bytearray(len(items))
        """1 for each item dealt from here."""
        self.left = len(items)


class Hand:
    """This node's latest runs in Redis, by number."""

    def __init__(self, most: int = MINE_MAX) -> None:
        self.most = most
        self._runs: OrderedDict[int, Mine] = OrderedDict()
        self._items = 0

    def __contains__(self, number: int) -> bool:
        return number in self._runs

    def remember(self, number: int, items: list[QueueItem], run: bytes, ends: list[int]) -> None:
        """Keep run ``number``'s items (``run``, its records' ``ends``), forgetting the oldest
        beyond ``most`` items."""
        runs = self._runs
        runs[number] = Mine(items, run, ends)
        self._items += len(items)
        while self._items > self.most:
            _, old = runs.popitem(last=False)
            self._items -= len(old.items)

    def deal(
        self, number: int, run: bytes, data: int, base: int, ends: tuple[int, ...]
    ) -> list[QueueItem] | None:
        """The items of a piece cut from run ``number`` (``run``: the piece, its records from
        ``data``, the first at ``base``, ending at ``ends``), dealt as they were put: none
        decoded, none made (each check a C loop over the piece, not a Python one). None
        (nothing done) unless the piece's ends and records are those put, byte for byte, and
        none of its items was dealt from here yet: the caller then decodes them."""
        mine = self._runs.get(number)
        if mine is None:
            return None
        first = bisect.bisect_right(mine.ends, base)
        last = first + len(ends)
        if last > len(mine.items) or (mine.ends[first - 1] if first else 0) != base:
            return None
        if tuple(mine.ends[first:last]) != ends or mine.dealt.find(1, first, last) != -1:
            return None
        if not run.startswith(mine.run[base : ends[-1]], data + base):
            return None
        mine.dealt[first:last] = bytes([1]) * (last - first)
        mine.left -= last - first
        if not mine.left:  # all dealt: forgotten
            self._items -= len(mine.items)
            del self._runs[number]
        return mine.items[first:last]
