"""A connection's budget of input work, sans-IO: bytes it may have parsed per second.

What a client sends costs the event loop in proportion to its bytes: a frame is decoded, a
COMPRESSED payload is inflated (up to ``max_inflated`` from a few hundred bytes) and its JSON
parsed. Without a bound, a handful of connections sending compressed payloads keep the loop
busy inflating and every other session's PING waits. A token bucket per connection bounds
that work: every byte decoded or inflated is spent from it, it refills at ``rate`` bytes a
second up to ``burst``, and a connection in debt is read no further until the debt is paid
(the transport waits before its next read, so TCP pushes back on the sender). Nothing is
refused and nothing is lost: a client over its budget is only slowed to it.

>>> b = Budget(rate=100, burst=100, now=0.0)
>>> b.spend(150, now=0.0)  # 50 bytes of debt: half a second at 100 bytes a second
>>> b.wait(now=0.0)
0.5
>>> b.wait(now=0.5)
0.0
"""

from __future__ import annotations


class Budget:
    """One connection's token bucket of input bytes."""

    __slots__ = ("rate", "burst", "level", "at")

    def __init__(self, rate: float, burst: float, now: float) -> None:
        self.rate = rate
        self.burst = burst
        self.level = burst
        self.at = now

    def _refill(self, now: float) -> None:
        if now > self.at:
            self.level = min(self.burst, self.level + (now - self.at) * self.rate)
            self.at = now

    def spend(self, nbytes: int, now: float) -> None:
        """Spend ``nbytes`` of work done (the level may go below zero: a debt)."""
        self._refill(now)
        self.level -= nbytes

    def wait(self, now: float) -> float:
        """Seconds until the debt is paid (0.0 when there is none): how long the connection
        is not read."""
        self._refill(now)
        return 0.0 if self.level >= 0 else -self.level / self.rate
