"""Producers' idempotency keys: which item ids a queue has seen lately (protocol.md 8b)."""

from __future__ import annotations

from collections import OrderedDict


class IdWindow:
    """Ids seen within ``window`` seconds, at most ``limit`` of them (the oldest go first).

    >>> w = IdWindow(window=600.0, limit=2)
    >>> w.seen("a", now=0.0), w.seen("a", now=1.0), w.seen("b", now=2.0)
    (False, True, False)
    >>> w.seen("c", now=3.0), w.seen("a", now=4.0)  # "a" was the oldest of three: forgotten
    (False, False)
    """

    __slots__ = ("window", "limit", "ids")

    def __init__(self, window: float, limit: int) -> None:
        self.window = window
        self.limit = limit
        self.ids: OrderedDict[str, float] = OrderedDict()

    def seen(self, item_id: str, now: float) -> bool:
        """Whether ``item_id`` was seen within the window; records it when it was not."""
        ids = self.ids
        horizon = now - self.window
        while ids:
            oldest = next(iter(ids.values()))
            if oldest > horizon and len(ids) < self.limit + 1:
                break
            ids.popitem(last=False)
        if item_id in ids:
            return True
        if self.limit:
            ids[item_id] = now
            if len(ids) > self.limit:
                ids.popitem(last=False)
        return False

    def check(self, item_id: str, now: float) -> bool:
        """Whether ``item_id`` was seen within the window, without recording it."""
        at = self.ids.get(item_id)
        return at is not None and at > now - self.window

    def __len__(self) -> int:
        return len(self.ids)
