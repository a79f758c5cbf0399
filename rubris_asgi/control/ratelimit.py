"""A publisher's send rate, lowered by NAKs and raised stepwise: :class:`RateLimiter`.

The flow-control source document's algorithm (NAK instead of ACK, adaptive rate limits), for
programs that publish *to* a server: the HTTP publisher, the client's PUBLISH, a Spark sink.
Receivers say nothing while they keep up; when their queue fills they report how full it is,
and the sender slows down by the strength of that report. The sender never needs to know how
many receivers there are.

The limit (messages per second) starts at ``initial``, high enough not to limit, and never
rises above it. A NAK carries a fill percentage; its strength sets the cut:

======  =========================
fill    new limit
======  =========================
< 50    unchanged (ignored)
50-74   base x 1/2
75-86   base x 1/4
87-99   base x 1/8
100     ``floor``
======  =========================

*Strongest NAK in a window wins.* The first NAK after a quiet period opens a window of
``window`` seconds and cuts from the limit in force at that moment (its base), or from the rate
the publisher really sent at over the last ``measure`` seconds when that is lower: a publisher
that sends below its limit is cut from what it sends, else its first cuts would change
nothing. Within the window only a stronger NAK cuts again, from the same base, so N receivers
reporting the same overload cost one cut, not N. A NAK that finds the limit at ``floor`` is
ignored (and counted).

*Recovery.* With k whole ``step`` periods since the last cut, the limit is
``min(initial, cut * (1 + growth * k * (k + 1) / 2))``: step k adds ``cut * growth * k``, so the
longer the quiet, the faster the climb. It is computed from the clock when read: no timers.

*Pacing* is a token bucket at the current limit holding at most ``burst`` seconds' worth (at
least one message). It lends: a caller may send whenever the bucket is not in debt, and takes
its tokens even if that puts the bucket in debt, which the callers after it wait out. So a batch
larger than the bucket is never refused for its size; it only delays what follows.

The knobs and their defaults: ``initial`` 1,000,000/s, ``floor`` 100/s, ``window`` 50 ms,
``step`` 100 ms, ``growth`` 10 %, ``burst`` 50 ms, ``measure`` 500 ms. A larger ``growth`` or
shorter ``step`` recovers faster (and invites the next NAK sooner); ``floor`` is the least a
sender keeps.

    >>> t = 0.0
    >>> limiter = RateLimiter(initial=10_000, clock=lambda: t)
    >>> limiter.on_nak(75)  # a receiver's queue is 75 % full
    >>> limiter.rate
    2500.0
    >>> t = 0.25  # two quiet steps: + 10 %, then + 20 %
    >>> limiter.rate
    3250.0
    >>> limiter.reserve(1000)  # the bucket is not in debt: send now
    0.0
    >>> round(limiter.reserve(1), 4)  # its debt: (1000 - 162.5 in the bucket) / 3250 per s
    0.2577

A limiter is meant for one event loop or one thread; callers in several threads need a lock.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

__all__ = ["RateLimiter", "RateStats"]

# (lowest fill, strength, share of the base kept); 100 % keeps nothing: the floor
_CUTS = ((100, 4, 0.0), (87, 3, 1 / 8), (75, 2, 1 / 4), (50, 1, 1 / 2))
# a fake clock set to exactly 3 steps must count 3, though 0.3 / 0.1 < 3 in binary fractions
_STEP_EPS = 1e-6
# rounding in the refill must not keep a caller that slept exactly its wait in debt
_TOKEN_EPS = 1e-9


@dataclass(frozen=True, slots=True)
class RateStats:
    """A snapshot: the limit now, NAKs received (``naks``), those that changed nothing
    (``naks_ignored``: below 50 %, not stronger than their window's, or at the floor), ``cuts``
    applied, and the fill of the last NAK (``last_fill``, None before the first)."""

    rate: float
    naks: int
    naks_ignored: int
    cuts: int
    last_fill: int | None


def _require(ok: bool, name: str, rule: str, value: float) -> None:
    if not ok:
        raise ValueError(f"{name} must be {rule}, got {value!r}")


class RateLimiter:
    """The send limit of one publisher (or of several sharing it) and the pacing at it.

    Rates are messages per second, times seconds; ``clock`` is read, never waited on, and the
    waits go through ``sleep`` (async) or ``blocking_sleep``, so tests inject all three.

    Raises:
        ValueError: naming the first bad argument (``floor`` must be > 0, ``initial`` >=
            ``floor``, ``window`` and ``burst`` >= 0, ``step`` and ``growth`` > 0; all finite).
    """

    def __init__(
        self,
        *,
        initial: float = 1_000_000.0,
        floor: float = 100.0,
        window: float = 0.050,
        step: float = 0.100,
        growth: float = 0.10,
        burst: float = 0.050,
        measure: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
        blocking_sleep: Callable[[float], object] = time.sleep,
    ) -> None:
        _require(math.isfinite(floor) and floor > 0, "floor", "> 0", floor)
        _require(math.isfinite(initial) and initial >= floor, "initial", ">= floor", initial)
        _require(math.isfinite(window) and window >= 0, "window", ">= 0", window)
        _require(math.isfinite(step) and step > 0, "step", "> 0", step)
        _require(math.isfinite(growth) and growth > 0, "growth", "> 0", growth)
        _require(math.isfinite(burst) and burst >= 0, "burst", ">= 0", burst)
        _require(math.isfinite(measure) and measure > 0, "measure", "> 0", measure)
        self._initial, self._floor, self._window = initial, floor, window
        self._step, self._growth, self._burst = step, growth, burst
        self._clock, self._sleep, self._blocking_sleep = clock, sleep, blocking_sleep
        self._cut: float | None = None  # the limit set by the last cut; None: back at initial
        self._cut_at = 0.0
        self._window_at = -math.inf
        self._window_base = initial
        self._window_strength = 0
        self._tokens = self._capacity(initial)
        self._filled_at = clock()
        self._measure = measure
        self._sent = 0  # messages taken in the current measuring period
        self._sent_since = self._filled_at
        self._sent_rate: float | None = None  # of the last complete period
        self._naks = self._ignored = self._cuts = 0
        self._last_fill: int | None = None

    @property
    def rate(self) -> float:
        """The limit now, in messages per second, recovery included."""
        return self._rate_at(self._clock())

    @property
    def stats(self) -> RateStats:
        return RateStats(self.rate, self._naks, self._ignored, self._cuts, self._last_fill)

    def on_nak(self, fill: int) -> None:
        """A receiver's NAK with its queue ``fill`` in percent (above 100 counts as 100)."""
        now = self._clock()
        self._naks += 1
        self._last_fill = fill
        strength, keep = next(((s, k) for f, s, k in _CUTS if fill >= f), (0, 1.0))
        rate = self._rate_at(now)
        in_window = now - self._window_at < self._window
        if (
            strength == 0
            or rate <= self._floor
            or (in_window and strength <= self._window_strength)
        ):
            self._ignored += 1
            return
        if not in_window:
            # Cut from what the publisher really sends when that is below its limit: the
            # headroom above it is not what overloaded the receiver, and cutting it alone
            # would change nothing (a publisher limited by its own work, not by the limiter).
            sending = self._sending(now)
            base = rate if sending is None else min(rate, max(self._floor, sending))
            self._window_at, self._window_base = now, base
        self._window_strength = strength
        self._refill(now, rate)  # tokens earned before the cut stay earned at the old rate
        self._cut, self._cut_at = max(self._floor, self._window_base * keep), now
        self._cuts += 1
        self._tokens = min(self._tokens, self._capacity(self._cut))

    def on_fill(self, fill: int) -> None:
        """The fill a server reports on every answer (``Rubris-Fill``): from 50 % it is a NAK
        (:meth:`on_nak`); below, it changes and counts nothing."""
        if fill >= 50:
            self.on_nak(fill)

    def reserve(self, n: int = 1) -> float:
        """Take ``n`` tokens now; returns the seconds to wait before sending them (0.0 when the
        bucket is not in debt). The tokens stay taken whatever the caller then does."""
        _require(n >= 0, "n", ">= 0", n)
        now = self._clock()
        rate = self._rate_at(now)
        self._refill(now, rate)
        wait = 0.0 if self._tokens >= -_TOKEN_EPS else -self._tokens / rate
        self._tokens -= n
        self._count(now, n)
        return wait

    def try_acquire(self, n: int = 1) -> bool:
        """Take ``n`` tokens and return True if the caller may send now (the bucket is not in
        debt); else take nothing and return False."""
        _require(n >= 0, "n", ">= 0", n)
        now = self._clock()
        self._refill(now, self._rate_at(now))
        if self._tokens < -_TOKEN_EPS:
            return False
        self._tokens -= n
        self._count(now, n)
        return True

    async def acquire(self, n: int = 1) -> None:
        """:meth:`reserve` ``n``, then sleep the wait. Cancelled while sleeping, the tokens
        stay taken: the limiter errs on the slow side."""
        wait = self.reserve(n)
        if wait > 0:
            await self._sleep(wait)

    def acquire_blocking(self, n: int = 1) -> None:
        """:meth:`acquire` for threads and synchronous code: blocks the calling thread."""
        wait = self.reserve(n)
        if wait > 0:
            self._blocking_sleep(wait)

    def _rate_at(self, now: float) -> float:
        if self._cut is None:
            return self._initial
        k = math.floor(max(0.0, now - self._cut_at) / self._step + _STEP_EPS)
        rate = self._cut * (1.0 + self._growth * k * (k + 1) / 2)
        if rate >= self._initial:
            self._cut = None  # fully recovered: later reads skip the arithmetic
            return self._initial
        return rate

    def _count(self, now: float, n: int) -> None:
        elapsed = now - self._sent_since
        if elapsed >= self._measure:
            # a period stretched by idleness says nothing about the rate of the next burst
            self._sent_rate = self._sent / elapsed if elapsed <= 2 * self._measure else None
            self._sent, self._sent_since = 0, now
        self._sent += n

    def _sending(self, now: float) -> float | None:
        """The rate the publisher really sends at: of the measuring period that just ended,
        else of the last complete one; None when unknown or idle (an idle publisher keeps its
        limit: its next burst is not what overloaded the receiver)."""
        elapsed = now - self._sent_since
        if elapsed > 2 * self._measure:
            return None  # mostly idle since the last measurement: nothing to go by
        rate = self._sent / elapsed if elapsed >= self._measure else self._sent_rate
        return rate or None

    def _capacity(self, rate: float) -> float:
        return max(1.0, rate * self._burst)

    def _refill(self, now: float, rate: float) -> None:
        # at the rate in force now: a recovery step is credited from the previous refill
        elapsed = max(0.0, now - self._filled_at)
        self._tokens = min(self._capacity(rate), self._tokens + elapsed * rate)
        self._filled_at = now
