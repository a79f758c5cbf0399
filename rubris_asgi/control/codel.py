"""CoDel's control law, sans-IO: when a buffer's items have waited too long, which to give back.

Controlled Delay (Nichols and Jacobson, "Controlling Queue Delay", ACM Queue 2012; RFC 8289)
watches the *sojourn time* of the items leaving a buffer. While the smallest sojourn seen over an
``interval`` stays above ``target``, the buffer holds a standing queue rather than a burst, and
CoDel drops an item, then the next one ``interval / sqrt(count)`` later, and so on, faster the
longer the standing queue persists; the first sojourn under ``target`` ends the dropping state.

For a work queue "dropping" is polite: the item is given back to the server, which hands it to a
consumer that is free (the source document on prefetch). The same state machine runs in three
places: the Python client and the browser client on their local buffers (a sojourn is the time
an item waited there before the application took it) and the server, per consumer, on its
estimate of the time items wait inside a consumer that does not run CoDel itself.
"""

from __future__ import annotations

import math


class CoDel:
    """One buffer's CoDel state. Call :meth:`should_drop` for each item as it leaves the buffer.

    >>> c = CoDel(target=0.020, interval=0.100)
    >>> c.should_drop(0.050, now=1.0)  # above target: the interval starts, nothing dropped yet
    False
    >>> c.should_drop(0.050, now=1.1)  # still above target a whole interval later: drop
    True
    >>> c.should_drop(0.050, now=1.15)  # the next one is due an interval later,
    False
    >>> c.should_drop(0.050, now=1.201)
    True
    >>> c.should_drop(0.050, now=1.25)  # then interval / sqrt(2) after that, and so on
    False
    >>> c.should_drop(0.050, now=1.273)
    True
    >>> c.should_drop(0.005, now=1.3)  # under target: the standing queue is gone
    False
    """

    __slots__ = (
        "target",
        "interval",
        "first_above",
        "dropping",
        "drop_next",
        "count",
        "last_count",
    )

    def __init__(self, target: float, interval: float) -> None:
        if target <= 0 or interval <= 0:
            raise ValueError(f"CoDel target and interval must be > 0, got {target}, {interval}")
        self.target = target
        self.interval = interval
        self.first_above = 0.0
        """When the sojourn will have been above target for an interval (0: it is not above)."""
        self.dropping = False
        self.drop_next = 0.0
        self.count = 0
        """Drops in the current dropping state: the control law's ``count``."""
        self.last_count = 0

    def _above(self, sojourn: float, now: float) -> bool:
        """Whether the sojourn has stayed above target for at least an interval."""
        if sojourn < self.target:
            self.first_above = 0.0
            return False
        if self.first_above == 0.0:
            self.first_above = now + self.interval
            return False
        return now >= self.first_above

    def should_drop(self, sojourn: float, now: float) -> bool:
        """Whether the item leaving the buffer now, after ``sojourn`` seconds in it, is dropped."""
        above = self._above(sojourn, now)
        if self.dropping:
            if not above:
                self.dropping = False
                return False
            if now >= self.drop_next:
                self.count += 1
                # from now when it fell behind (the buffer was not looked at for a while: a
                # stalled loop): one drop, not a burst to catch up with the schedule
                step = self.interval / math.sqrt(self.count)
                self.drop_next = max(self.drop_next + step, now + step / 2)
                return True
            return False
        if not above:
            return False
        self.dropping = True
        # re-entering soon after the last dropping state: resume near its rate, as RFC 8289 does
        delta = self.count - self.last_count
        recent = now - self.drop_next < 16 * self.interval
        self.count = delta if delta > 1 and recent else 1
        self.last_count = self.count
        self.drop_next = now + self.interval / math.sqrt(self.count)
        return True

    def reset(self) -> None:
        """Forget the state (the buffer was emptied from outside, e.g. a reconnect)."""
        self.first_above = 0.0
        self.dropping = False
        self.count = self.last_count = 0
